"""The levers topic's registry entry (light: no torch; see :mod:`shardlab.topics`)."""

from shardlab.levers.params import LeversParams
from shardlab.topics import Lesson, Topic

SUMMARY = "TorchAcc's compiler levers: combining, overlap, operator order, auto-sharding, fusion"
TOPIC = Topic("levers", SUMMARY, (
    Lesson(LeversParams),
))
