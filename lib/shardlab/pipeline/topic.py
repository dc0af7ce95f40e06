"""The pipeline topic's registry entry (light: no torch; see :mod:`shardlab.topics`)."""

from shardlab.pipeline.params import PipelineParams
from shardlab.topics import Lesson, Topic

SUMMARY = "pipeline parallelism: GPipe, 1F1B and interleaved schedules, the stage split, PyTorch's pipelining"
TOPIC = Topic("pipeline", SUMMARY, (
    Lesson(PipelineParams),
))
