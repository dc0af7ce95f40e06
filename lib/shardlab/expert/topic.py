"""The expert topic's registry entry (light: no torch; see :mod:`shardlab.core.topics`)."""

from shardlab.core.topics import ChartSpec, Lesson, Topic
from shardlab.expert.params import ExpertParams

SUMMARY = "expert parallelism: a top-k routed MoE with capacity, all-to-all dispatch, GShard-style GSPMD"
TOPIC = Topic("expert", SUMMARY, (
    Lesson(ExpertParams, charts=(
        ChartSpec("Expert parallelism: tokens dropped vs capacity factor", "11_expert_parallel",
                  r"ep\.drops\.cf(?P<x>\d+(?:\.\d+)?)\.(?P<series>dropped|uniform)\.fraction", "dropped fraction",
                  "capacity factor"),
        ChartSpec("Expert parallelism: bytes per device vs ep (forward)", "11_expert_parallel",
                  r"ep\.by_ep\.ep(?P<x>\d+)\.(?P<series>all_to_all\.bytes|expert_params\.per_chip\.bytes)",
                  "bytes per device", "ep", log_x=True),
    )),
))
