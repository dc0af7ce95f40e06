"""The inspect topic's registry entry (light: no torch; see :mod:`shardlab.topics`)."""

from shardlab.inspect.params import YourModelParams
from shardlab.topics import Lesson, Topic

SUMMARY = "your Hugging Face model on a TPU slice you don't own: shardlab.inspect"
TOPIC = Topic("inspect", SUMMARY, (
    Lesson(YourModelParams),
))
