"""The timing topic's registry entry (light: no torch; see :mod:`shardlab.core.topics`)."""

from shardlab.core.topics import Lesson, Topic
from shardlab.timing.params import TimingParams

SUMMARY = "step time, MFU and the communication-bound crossover, read from the XLA:TPU compiler"
TOPIC = Topic("timing", SUMMARY, (Lesson(TimingParams),))
