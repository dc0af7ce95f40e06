"""torch_xla metrics around a step: what compiled, how long, and what crossed host -> device.

Design: ``torch_xla.debug.metrics`` keeps process-wide counters and metrics. :func:`metrics_delta` snapshots
them before and after a block and exposes the differences. Naming trap (measured, torch_xla 2.9): ``OutboundData`` is
host -> device bytes (``h2d_*`` here), ``InboundData`` device -> host.

Example::

    with metrics_delta() as md:
        y = (x @ w).sum(); xla_sync()
    md.compile_count, md.compile_s, md.h2d_bytes
"""

from __future__ import annotations

from dataclasses import dataclass, field

NS = 1e-9


def _snapshot() -> tuple[dict[str, int], dict[str, tuple[int, float]]]:
    import torch_xla.debug.metrics as met  # here, not at the top: profile is imported before runtime.setup()

    counters = {n: int(met.counter_value(n) or 0) for n in met.counter_names()}
    metrics: dict[str, tuple[int, float]] = {}
    for n in met.metric_names():
        data = met.metric_data(n)
        if data is not None:
            metrics[n] = (int(data[0]), float(data[1]))  # (count, accumulated value)
    return counters, metrics


@dataclass
class MetricsDelta:
    """Differences of torch_xla counters/metrics over a block (filled in when the block exits)."""

    counters: dict[str, int] = field(default_factory=dict)
    metrics: dict[str, tuple[int, float]] = field(default_factory=dict)  # name -> (count, total)

    def metric(self, name: str) -> tuple[int, float]:
        return self.metrics.get(name, (0, 0.0))

    @property
    def compile_count(self) -> int:
        return self.metric("CompileTime")[0]

    @property
    def compile_s(self) -> float:
        return self.metric("CompileTime")[1] * NS

    @property
    def execute_s(self) -> float:  # under SPMD the PJRT client records ExecuteReplicatedTime; ExecuteTime stays 0
        return (self.metric("ExecuteTime")[1] + self.metric("ExecuteReplicatedTime")[1]) * NS

    @property
    def h2d_count(self) -> int:
        return self.metric("TransferToDeviceTime")[0]

    @property
    def h2d_bytes(self) -> int:
        return int(self.metric("OutboundData")[1])



class metrics_delta:  # noqa: N801  (used as a context manager, reads like a function)
    """``with metrics_delta() as md: ...`` — md holds the differences after the block."""

    def __enter__(self) -> MetricsDelta:
        self._before = _snapshot()
        self.delta = MetricsDelta()
        return self.delta

    def __exit__(self, *exc: object) -> None:
        c0, m0 = self._before
        c1, m1 = _snapshot()
        self.delta.counters = {n: v - c0.get(n, 0) for n, v in c1.items() if v != c0.get(n, 0)}
        self.delta.metrics = {
            n: (v[0] - m0.get(n, (0, 0.0))[0], v[1] - m0.get(n, (0, 0.0))[1])
            for n, v in m1.items() if v[0] != m0.get(n, (0, 0.0))[0]
        }
