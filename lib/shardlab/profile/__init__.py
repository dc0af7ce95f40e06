"""Measurement core: HLO capture and parsing, torch_xla metrics, timers and the JSON record; ``order``: peak
memory of every operator order of a graph (the simulator notebooks 08 and 08b share).

Importing this package does not import torch_xla; the XLA-facing functions import it when called, after
``shardlab.runtime.setup()`` has prepared the device world.
"""

from shardlab.profile.capture import Capture, HloNotCaptured, capture_hlo, read_dumps
from shardlab.profile.hlo import BufferAssignment, Collective, HloModule, WhileLoop, parse_hlo
from shardlab.profile.metrics import MetricsDelta, metrics_delta
from shardlab.profile.record import CheckFailed, Recorder, load_record
from shardlab.profile.timer import Timing, xla_sync

__all__ = [
    "BufferAssignment", "Capture", "CheckFailed", "Collective", "HloModule", "HloNotCaptured", "MetricsDelta",
    "Recorder", "Timing", "WhileLoop", "capture_hlo", "load_record",
    "metrics_delta", "parse_hlo", "read_dumps", "xla_sync",
]
