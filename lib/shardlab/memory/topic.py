"""The memory topic's registry entry (light: no torch; see :mod:`shardlab.topics`)."""

from shardlab.memory.params import MemoryParams
from shardlab.topics import Lesson, Topic

SUMMARY = "TorchAcc's memory levers: FlashAttention compile-only, ROAM's operator order, the Adam update schedule"
TOPIC = Topic("memory", SUMMARY, (
    Lesson(MemoryParams),
))
