"""The blocks topic's registry entry (light: no torch; see :mod:`shardlab.core.topics`)."""

from shardlab.blocks.params import BlocksParams, WelcomeParams
from shardlab.core.topics import Lesson, Topic

SUMMARY = "the welcome and block matrices: collectives on a ring, the row / column / 2-D split of a matmul"
TOPIC = Topic("blocks", SUMMARY, (
    Lesson(WelcomeParams),
    Lesson(BlocksParams),
))
