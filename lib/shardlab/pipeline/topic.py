"""The pipeline topic's registry entry (light: no torch; see :mod:`shardlab.core.topics`)."""

from shardlab.core.topics import Lesson, Topic
from shardlab.pipeline.params import PipelineParams

SUMMARY = "pipeline parallelism: GPipe, 1F1B and interleaved schedules, the stage split, PyTorch's pipelining"
TOPIC = Topic("pipeline", SUMMARY, (
    Lesson(PipelineParams),
))
