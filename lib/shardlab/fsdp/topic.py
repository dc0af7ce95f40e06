"""The fsdp topic's registry entry (light: no torch; see :mod:`shardlab.topics`)."""

from shardlab.fsdp.params import FsdpGspmdParams, FsdpParams
from shardlab.topics import ChartSpec, Lesson, Topic

SUMMARY = "FSDP: PyTorch's flat parameter, per-parameter FSDP as GSPMD annotations, ZeRO memory"
TOPIC = Topic("fsdp", SUMMARY, (
    Lesson(FsdpParams, charts=(
        ChartSpec("FSDP flat parameter: padding vs world size", "05_fsdp_flat_params",
                  r"fsdp\.padding\.W(?P<x>\d+)(?P<series>\.\w+)?$", "padding elements", "world size W"),
    )),
    Lesson(FsdpGspmdParams),
))
