"""The context topic's registry entry (light: no torch; see :mod:`shardlab.core.topics`)."""

from shardlab.context.params import ContextParams
from shardlab.core.topics import ChartSpec, Lesson, Topic

SUMMARY = "context parallelism: all-gather CP, ring attention, the zig-zag balance, Ulysses"
TOPIC = Topic("context", SUMMARY, (
    Lesson(ContextParams, charts=(
        ChartSpec("Context parallelism: causal imbalance vs cp", "10_context_parallel",
                  r"cp\.by_cp\.cp(?P<x>\d+)\.max_over_mean_work\.(?P<series>contiguous|zigzag)", "max / mean work",
                  "cp"),
        ChartSpec("Context parallelism: ring bytes per device vs cp (forward)", "10_context_parallel",
                  r"cp\.by_cp\.cp(?P<x>\d+)\.ring\.p2p\.bytes", "bytes per device", "cp"),
    )),
))
