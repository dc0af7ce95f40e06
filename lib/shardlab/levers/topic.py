"""The levers topic's registry entry (light: no torch; see :mod:`shardlab.core.topics`)."""

from shardlab.core.topics import Lesson, Topic
from shardlab.levers.params import LeversParams

SUMMARY = "TorchAcc's compiler levers: combining, overlap, operator order, auto-sharding, fusion"
TOPIC = Topic("levers", SUMMARY, (
    Lesson(LeversParams),
))
