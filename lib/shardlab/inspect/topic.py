"""The inspect topic's registry entry (light: no torch; see :mod:`shardlab.core.topics`)."""

from shardlab.core.topics import Lesson, Topic
from shardlab.inspect.params import YourModelParams

SUMMARY = "your Hugging Face model on a TPU slice you don't own: shardlab.inspect"
TOPIC = Topic("inspect", SUMMARY, (
    Lesson(YourModelParams),
))
