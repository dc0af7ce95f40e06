"""Wall-clock timing with its spread: medians, never single samples.

Timings are noisy (two cores shared with everything else), so they never decide a pass/fail test; they are
reported as ``kind="timing"`` measurements with ``min``/``max``/``n`` next to the median, and ratios are only
taken between numbers measured in the same run.

Example::

    >>> print(Timing((0.003, 0.001, 0.002)))
    2.00 ms (min 1.00, max 3.00, n=3)
"""

from __future__ import annotations

import statistics
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


def xla_sync(result: Any = None) -> None:
    """Cut the lazy graph, execute it and wait for the devices."""
    import torch_xla  # here, not at the top: profile is imported before runtime.setup()
    import torch_xla.core.xla_model as xm

    torch_xla.sync()
    xm.wait_device_ops()
