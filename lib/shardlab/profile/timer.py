"""Wall-clock timing with its spread: medians, never single samples.

Timings are noisy (two cores shared with everything else), so they never decide a pass/fail test; they are
reported as ``kind="timing"`` measurements with ``min``/``max``/``n`` next to the median, and ratios are only
taken between numbers measured in the same run.

Example::

    >>> t = time_it(lambda: sum(range(1000)), repeats=5)
    >>> t.median_s > 0, len(t.samples)
    (True, 5)
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Timing:
    samples: tuple[float, ...]  # seconds, one per repeat

    @property
    def median_s(self) -> float:
        return statistics.median(self.samples)

    @property
    def min_s(self) -> float:
        return min(self.samples)

    @property
    def max_s(self) -> float:
        return max(self.samples)

    def spread(self) -> dict[str, float]:
        return {"min": self.min_s, "max": self.max_s, "n": len(self.samples)}

    def __str__(self) -> str:
        ms = 1e3
        return (f"{self.median_s * ms:.2f} ms (min {self.min_s * ms:.2f}, max {self.max_s * ms:.2f}, "
                f"n={len(self.samples)})")


def time_it(fn: Callable[[], Any], repeats: int = 5, warmup: int = 1,
            sync: Callable[[Any], None] | None = None) -> Timing:
    """Run ``fn`` ``warmup`` times untimed, then ``repeats`` times timed. ``sync(result)`` waits for async work
    (for XLA: ``lambda r: xla_sync(r)``) inside the timed region."""
    if repeats < 1:
        raise ValueError(f"repeats={repeats} must be >= 1")
    if warmup < 0:
        raise ValueError(f"warmup={warmup} must be >= 0")
    for _ in range(warmup):
        r = fn()
        if sync:
            sync(r)
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        r = fn()
        if sync:
            sync(r)
        samples.append(time.perf_counter() - t0)
    return Timing(tuple(samples))


def xla_sync(result: Any = None) -> None:
    """Cut the lazy graph, execute it and wait for the devices."""
    import torch_xla
    import torch_xla.core.xla_model as xm

    torch_xla.sync()
    xm.wait_device_ops()
