"""The planner topic's registry entry (light: no torch; see :mod:`shardlab.core.topics`)."""

from shardlab.core.topics import Lesson, Topic
from shardlab.planner.params import PlannerParams

SUMMARY = "the planner: per-chip memory, communication, step time and fit on TPU pods, checked by the compiler"
TOPIC = Topic("planner", SUMMARY, (
    Lesson(PlannerParams),
))
