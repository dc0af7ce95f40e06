"""The planner topic's registry entry (light: no torch; see :mod:`shardlab.topics`)."""

from shardlab.planner.params import PlannerParams
from shardlab.topics import Lesson, Topic

SUMMARY = "the planner: per-chip memory, communication, step time and fit on TPU pods, checked by the compiler"
TOPIC = Topic("planner", SUMMARY, (
    Lesson(PlannerParams),
))
