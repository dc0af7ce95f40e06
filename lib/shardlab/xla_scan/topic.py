"""The xla_scan topic's registry entry (light: no torch; see :mod:`shardlab.core.topics`)."""

from shardlab.core.topics import ChartSpec, Lesson, Topic
from shardlab.xla_scan.params import ScanParams

SUMMARY = "scan over stacked layers, 2-D sharding and shard_as: the 405B seed's story"
TOPIC = Topic("xla_scan", SUMMARY, (
    Lesson(ScanParams, charts=(
        ChartSpec("scan: XLA compile time vs number of layers L", "06_scan_shard_as",
                  r"scan\.compile_s\.(?P<series>loop|scan_layers|scan)\.L(?P<x>\d+)$", "compile s", "layers L"),
        ChartSpec("scan: HLO instructions vs number of layers L", "06_scan_shard_as",
                  r"scan\.hlo_instructions\.(?P<series>loop|scan_layers|scan)\.L(?P<x>\d+)$", "instructions",
                  "layers L"),
    )),
))
