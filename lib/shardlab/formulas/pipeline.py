"""Pipeline parallelism: bubble, microbatches in flight, point-to-point traffic, step time.

Design note
-----------
p pipeline stages (devices), m microbatches per step, v virtual stages (model chunks) per device; t_f and t_b
the forward and backward time of one microbatch through the whole model on one device, so one stage takes
t_f / p and t_b / p (interleaved: one chunk t_f / (p v)).  Narayanan et al. 2021 ("Efficient Large-Scale
Language Model Training on GPU Clusters Using Megatron-LM", arXiv:2104.04473, section 2.2):

    ideal time           t_id = m (t_f + t_b) / p
    bubble time          t_pb = (p - 1)(t_f + t_b) / p              GPipe and 1F1B alike
    bubble fraction      t_pb / t_id = (p - 1) / m                  the paper's convention  -> bubble_ratio
    interleaved          t_pb = (p - 1)(t_f + t_b) / (p v)     ->   (1 / v)(p - 1) / m

Two conventions, two functions, never mixed:

    bubble_ratio(p, m, v)      bubble time / ideal time  = (p - 1) / (v m)      (the paper's "bubble fraction")
    idle_fraction(p, m, v)     bubble time / step time   = (p - 1) / (v m + p - 1)
                               GPipe's (p - 1) / (m + p - 1): the share of the step a device is idle

1F1B (PipeDream-Flush) has the same bubble as GPipe but holds at most p - s microbatches' activations on stage
s (at most p on stage 0) instead of m.  Interleaved 1F1B (warm-up of (v - 1) p + 2 (p - 1 - r) chunk forwards on
device r, Megatron-LM's `forward_backward_pipelining_with_interleaving`) divides the bubble by v and multiplies
the stage boundaries, hence the point-to-point messages, from p - 1 to p v - 1 (the ratio (p v - 1)/(p - 1) ->
v for large p).

Point-to-point traffic: per microbatch and per stage boundary one activation [b/m, s, h] goes forward and one
gradient of the same shape goes backward.  Per step: 2 m (p v - 1) messages of (b/m) s h bytes-per-element.

Example (p = 4, m = 8: the paper's 3/8 and GPipe's 3/11)::

    >>> bubble_ratio(4, 8), idle_fraction(4, 8), bubble_ratio(4, 8, v=2)
    (0.375, 0.2727272727272727, 0.1875)
"""

from __future__ import annotations

from collections.abc import Sequence

from shardlab.formulas.common import dtype_bytes

SCHEDULES = ("gpipe", "1f1b", "interleaved")

__all__ = [
    "SCHEDULES", "bubble_ratio", "check_pipeline", "idle_fraction", "p2p_traffic", "peak_inflight",
    "peak_inflight_per_device", "pipeline_step_time", "spmd_loop", "uniform_step_time",
]


def check_pipeline(p: int, m: int, v: int = 1, schedule: str | None = None) -> None:
    """Raise ValueError naming the parameter and the rule when (p, m, v) is not a pipeline `schedule` can run.

    Rules: p, m, v >= 1; v > 1 only for "interleaved"; interleaved needs m % p == 0 (microbatches go round the
    devices in groups of p, Narayanan et al. section 2.2.2 — Megatron-LM's rule, which our interleaved order
    follows; PyTorch 2.9's ScheduleInterleaved1F1B runs m % max(1, m // p) == 0, e.g. p = 4, m = 6, and its order
    then still measures (p - 1)/(v m + p - 1) while m >= p; below m = p its bubble is larger).
    """
    for name, value in (("p", p), ("m", m), ("v", v)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r} must be an int >= 1")
    if schedule is None:
        return
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule={schedule!r} is not one of {SCHEDULES}")
    if schedule != "interleaved" and v != 1:
        raise ValueError(f"v={v}: only the interleaved schedule has virtual stages (v must be 1 for {schedule})")
    if schedule == "interleaved" and m % p:
        raise ValueError(f"m={m} must be a multiple of p={p} for the interleaved schedule (Megatron-LM's rule; "
                         "PyTorch 2.9's ScheduleInterleaved1F1B needs only m % max(1, m // p) == 0)")


def bubble_ratio(p: int, m: int, v: int = 1) -> float:
    """Bubble time over ideal time, (p - 1) / (v m) — Narayanan et al. 2021's "pipeline bubble fraction"."""
    check_pipeline(p, m, v)
    return (p - 1) / (v * m)


def idle_fraction(p: int, m: int, v: int = 1) -> float:
    """Bubble time over step time, (p - 1) / (v m + p - 1) — the share of a step each device idles
    (GPipe's (p - 1) / (m + p - 1) at v = 1)."""
    check_pipeline(p, m, v)
    return (p - 1) / (v * m + p - 1)


def peak_inflight(schedule: str, p: int, m: int, v: int = 1, device: int = 0) -> int:
    """Most microbatches whose forward ran but whose backward has not on `device` (a stage at v = 1).

    GPipe: m.  1F1B: min(p - device, m) (p - device - 1 warm-up forwards, then one more before the first
    backward).  Interleaved: counted in *chunk* microbatches (each 1/v of a stage's activations):
    min((v - 1) p + 2 (p - 1 - device) + 1, v m).
    """
    check_pipeline(p, m, v, schedule)
    if not 0 <= device < p:
        raise ValueError(f"device={device} is not in [0, p={p})")
    if schedule == "gpipe":
        return m
    if schedule == "1f1b":
        return min(p - device, m)
    warmup = (v - 1) * p + 2 * (p - 1 - device)
    return min(warmup + 1, v * m)


def peak_inflight_per_device(schedule: str, p: int, m: int, v: int = 1) -> list[int]:
    """:func:`peak_inflight` for every device 0..p-1."""
    return [peak_inflight(schedule, p, m, v, d) for d in range(p)]


def p2p_traffic(
    p: int, m: int, micro_batch: int, seq: int, hidden: int, dtype: str = "float32", v: int = 1
) -> dict[str, float]:
    """Point-to-point sends of one training step (every device together) and per device.

    One activation [micro_batch, seq, hidden] forward and one gradient of the same shape backward per microbatch
    per stage boundary; p v - 1 boundaries, each between two different devices when p > 1.

    Terms: ``message_bytes``; ``forward.count`` / ``backward.count`` (= m (p v - 1) each), ``count``,
    ``bytes`` (every send of the step), ``device.<r>.count`` (device r sends m (v - [r = p-1]) activations and
    m (v - [r = 0]) gradients) and ``device.<r>.bytes``.

    >>> t = p2p_traffic(4, 8, micro_batch=2, seq=16, hidden=32)
    >>> t["count"], t["message_bytes"], t["bytes"], t["device.0.count"]
    (48, 4096, 196608, 8)
    """
    check_pipeline(p, m, v)
    if p == 1:
        v = 1  # one device: the chunks hand their activations over in memory, nothing is sent
    message = micro_batch * seq * hidden * dtype_bytes(dtype)
    boundaries = p * v - 1 if p > 1 else 0
    out: dict[str, float] = {
        "message_bytes": message,
        "forward.count": m * boundaries,
        "backward.count": m * boundaries,
        "count": 2 * m * boundaries,
        "bytes": 2 * m * boundaries * message,
    }
    for r in range(p):
        n = 0 if p == 1 else m * (v - (r == p - 1)) + m * (v - (r == 0))
        out[f"device.{r}.count"] = n
        out[f"device.{r}.bytes"] = n * message
    return out


def uniform_step_time(p: int, m: int, t_f: float, t_b: float, v: int = 1) -> float:
    """Step time with p equal stages: ideal + bubble = (m + (p - 1) / v)(t_f + t_b) / p, where t_f and t_b are one
    microbatch's forward and backward through the *whole* model (Narayanan et al. 2021, section 2.2)."""
    check_pipeline(p, m, v)
    return (m + (p - 1) / v) * (t_f + t_b) / p


def pipeline_step_time(stage_forward: Sequence[float], stage_backward: Sequence[float], m: int) -> float:
    """GPipe step time with unequal stages and free communication: the forwards flow through the stages like
    identical jobs through a flow shop, then the backwards in reverse:

        (sum_s f_s + (m - 1) max_s f_s) + (sum_s b_s + (m - 1) max_s b_s)

    With b_s proportional to f_s this is sum_s (f_s + b_s) + (m - 1) max_s (f_s + b_s): the slowest stage sets
    the pace, which is why a split minimises the slowest stage.

    >>> pipeline_step_time([1, 1, 1, 1], [2, 2, 2, 2], 8)     # 4 + 7 + 8 + 14 = 33 = (8 + 3) * 3
    33.0
    """
    if len(stage_forward) != len(stage_backward) or not stage_forward:
        raise ValueError(f"stage_forward ({len(stage_forward)}) and stage_backward ({len(stage_backward)}) must "
                         "be non-empty and of equal length")
    check_pipeline(len(stage_forward), m)
    f, b = list(map(float, stage_forward)), list(map(float, stage_backward))
    return sum(f) + (m - 1) * max(f) + sum(b) + (m - 1) * max(b)


def spmd_loop(schedule: str, p: int, m: int, v: int = 1) -> dict[str, int]:
    """The SPMD pipeline's loop (notebook 09, section 5), by the schedule's own counting:

    ``trip_count``            GPipe: m + p - 1 (p - 1 fill iterations);  circular (interleaved): v m + p - 1;
                              1F1B with the backward in the loop body: m + 2 (p - 1) ticks of forward + backward
                              (microbatch i reaches stage s's backward 2 (p - 1 - s) ticks after its forward)
    ``pairs``                 source-target pairs of one shift: p - 1 (zeros enter stage 0), circular p
    ``shifts``                shifts per iteration: 1 per loop (GPipe: forward loop + autograd's mirror loop;
                              1F1B: a forward and a backward shift in every tick)
    ``loops``                 While loops: GPipe 2 (forward, reversed), circular 1 (forward only here), 1F1B 1
    ``held``                  activations each stage keeps for its backward: GPipe and circular, every iteration
                              of the forward loop (T: autograd saves the loop); 1F1B 2 p - 1 slots, whatever m

    >>> spmd_loop("gpipe", 4, 8)["trip_count"], spmd_loop("1f1b", 4, 8)["trip_count"], spmd_loop("1f1b", 4, 8)["held"]
    (11, 14, 7)
    """
    check_pipeline(p, m, v, schedule)
    if schedule == "1f1b":
        T = m + 2 * (p - 1)
        return {"trip_count": T, "pairs": p - 1, "shifts": 2, "loops": 1, "held": 2 * p - 1}
    T = v * m + p - 1
    if schedule == "gpipe":
        return {"trip_count": T, "pairs": p - 1, "shifts": 1, "loops": 2, "held": T}
    return {"trip_count": T, "pairs": p, "shifts": 1, "loops": 1, "held": T}
