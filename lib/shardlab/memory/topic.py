"""The memory topic's registry entry (light: no torch; see :mod:`shardlab.core.topics`)."""

from shardlab.core.topics import Lesson, Topic
from shardlab.memory.params import MemoryParams

SUMMARY = "TorchAcc's memory levers: FlashAttention compile-only, ROAM's operator order, the Adam update schedule"
TOPIC = Topic("memory", SUMMARY, (
    Lesson(MemoryParams),
))
