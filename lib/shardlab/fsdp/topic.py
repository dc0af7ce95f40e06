"""The fsdp topic's registry entry (light: no torch; see :mod:`shardlab.core.topics`)."""

from shardlab.core.topics import ChartSpec, Lesson, Topic
from shardlab.fsdp.params import FsdpGspmdParams, FsdpParams

SUMMARY = "FSDP: PyTorch's flat parameter, per-parameter FSDP as GSPMD annotations, ZeRO memory"
TOPIC = Topic("fsdp", SUMMARY, (
    Lesson(FsdpParams, charts=(
        ChartSpec("FSDP flat parameter: padding vs world size", "05_fsdp_flat_params",
                  r"fsdp\.padding\.W(?P<x>\d+)(?P<series>\.\w+)?$", "padding elements", "world size W"),
    )),
    Lesson(FsdpGspmdParams),
))
