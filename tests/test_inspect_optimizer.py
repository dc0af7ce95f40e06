"""``inspect``'s optimizer choices: AdamW / Adafactor / SGD / SGD with momentum, fp32 (master + fp32 state) or bf16.

Oracles:
- the state layout (``formulas.optimizers.state_tensors``) against the state tensors ``torch.optim.AdamW``,
  ``Adafactor`` and ``SGD`` actually create after one step on a small CPU model (fp32 parameters: their state is
  the fp32 layout without the master, which is the parameter itself; bf16 parameters: the bf16 layout);
- the optimizer state read from the compiled XLA:TPU program (the donated entry parameters) against a hand count
  from the same program's per-chip weight shapes and torch.optim's rules (AdamW 2 copies, momentum 1, Adafactor a
  row factor with the last dimension 1 and a column factor with the second-to-last 1, vectors 1; fp32 adds the
  master), and Adafactor's saving over AdamW against that count.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from shardlab.formulas.optimizers import OPTIMIZERS, PRECISIONS, bytes_per_param, state_bytes, state_tensors

DT = {"fp32": torch.float32, "bf16": torch.bfloat16}
NAME = {torch.float32: "fp32", torch.bfloat16: "bf16"}


class Small(nn.Module):
    """Weights of every rank inspect trains: matrices, vectors and a stacked [L, out, in] (a scanned layer)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(11, 6)
        self.up = nn.Linear(6, 10)
        self.norm = nn.LayerNorm(10)
        self.stacked = nn.Parameter(torch.randn(3, 10, 6) * 0.1)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.norm(self.up(self.embed(tokens)))
        for w in self.stacked:
            h = h + torch.tanh(h @ w @ w.t())
        return h.float().square().mean()


def torch_optimizer(name: str, params: list[nn.Parameter]) -> torch.optim.Optimizer:
    return {"adamw": lambda: torch.optim.AdamW(params, lr=1e-3),
            "adafactor": lambda: torch.optim.Adafactor(params, lr=1e-2),
            "sgd": lambda: torch.optim.SGD(params, lr=1e-2),
            "sgd-momentum": lambda: torch.optim.SGD(params, lr=1e-2, momentum=0.9)}[name]()


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("name", OPTIMIZERS)
def test_state_layout_is_what_torch_optim_creates(name: str, precision: str) -> None:
    torch.manual_seed(0)
    model = Small().to(DT[precision])
    opt = torch_optimizer(name, list(model.parameters()))
    model(torch.randint(0, 11, (2, 5))).backward()
    opt.step()
    for pname, p in model.named_parameters():
        made = {k: (tuple(v.shape), NAME[v.dtype]) for k, v in opt.state[p].items()
                if isinstance(v, torch.Tensor) and k != "step"}  # the 0-d step counter: a constant of one step
        ours = {t.name: (t.shape, t.dtype) for t in state_tensors(name, precision, tuple(p.shape))}
        if precision == "fp32":  # mixed precision: the optimizer's fp32 parameter is the master copy
            assert ours.pop("master") == (tuple(p.shape), "fp32"), pname
        assert ours == made, (name, precision, pname)
        assert state_bytes(name, precision, tuple(p.shape)) == \
            sum(math.prod(s) * {"fp32": 4, "bf16": 2}[d] for s, d in made.values()) + \
            (4 * p.numel() if precision == "fp32" else 0)


def test_bytes_per_parameter() -> None:
    """ZeRO's K for the constant-state optimizers; Adafactor's factored average, by hand for two shapes."""
    assert [bytes_per_param(o, "fp32") for o in ("adamw", "sgd", "sgd-momentum")] == [12, 4, 8]
    assert [bytes_per_param(o, "bf16") for o in ("adamw", "sgd", "sgd-momentum")] == [4, 0, 2]
    shapes = [(4096, 1024), (4096,)]
    factored = (4096 + 1024) * 2 + 4096 * 2  # bf16 row + col, the vector's variance
    assert bytes_per_param("adafactor", "bf16", shapes) == factored / (4096 * 1024 + 4096)
    assert bytes_per_param("adafactor", "fp32", shapes) == 4 + 2 * factored / (4096 * 1024 + 4096)
    with pytest.raises(ValueError, match="depend on the weights' shapes"):
        bytes_per_param("adafactor", "fp32")


# ------------------------------------------------------------------------------- compiled (XLA:TPU compile-only)
ATTN = {"hidden_size": 128, "intermediate_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2,
        "vocab_size": 512}
COMBOS = [(o, p) for o in OPTIMIZERS for p in PRECISIONS]
FAST = {("adafactor", "bf16"), ("sgd-momentum", "fp32")}
_RESULTS: dict[tuple[str, str], tuple] = {}


def compiled(name: str, precision: str):  # type: ignore[no-untyped-def]
    """``(inspect's result, the per-chip shapes of the trained weights read from the compiled program)``."""
    from shardlab.inspect import step
    from shardlab.inspect.analysis import entry_parameters
    from shardlab.inspect.api import run
    from shardlab.inspect.config import make_config
    from shardlab.profile import tpu

    if (name, precision) not in _RESULTS:
        cfg = make_config("llama-3-8b", mesh="fsdp=8", topology="v5e-8", batch=8, seq=64, num_layers=2,
                          overrides=ATTN, optimizer=name, optimizer_dtype=precision)
        r = run(cfg)
        c = tpu.compile_built(step.build(cfg), cfg.topology)  # the same graph: the compile cache's program
        kinds = step.output_kinds(cfg)
        params = entry_parameters(c.hlo_text)  # per-chip shapes of the entry parameters
        shapes = [tuple(params[p].dims) for o, p in c.options["donated"] if kinds[o - 1][1] == "param"]
        _RESULTS[name, precision] = (r, shapes)
    return _RESULTS[name, precision]


def hand_count(shapes: list[tuple[int, ...]], name: str, precision: str) -> dict[str, int]:
    """torch.optim's state per tensor kind for weights of these per-chip shapes (a factor of a split weight is
    split along the weight's other dimension only: its own per-chip shape is the weight's with one dim -> 1)."""
    item = {"fp32": 4, "bf16": 2}[precision]
    out: dict[str, int] = {}

    def add(k: str, n: int, size: int = item) -> None:
        out[k] = out.get(k, 0) + n * size

    for s in shapes:
        n = math.prod(s)
        if precision == "fp32":
            add("master", n, 4)
        if name == "adamw":
            add("exp_avg", n)
            add("exp_avg_sq", n)
        elif name == "sgd-momentum":
            add("momentum_buffer", n)
        elif name == "adafactor" and len(s) >= 2:
            add("row_var", n // s[-1])
            add("col_var", n // s[-2])
        elif name == "adafactor":
            add("variance", n)
    return out


@pytest.mark.xla
@pytest.mark.parametrize("name,precision", [pytest.param(*c, marks=() if c in FAST else pytest.mark.slow)
                                            for c in COMBOS], ids=[f"{o}-{p}" for o, p in COMBOS])
def test_compiled_state_is_the_hand_count(name: str, precision: str, xla_world) -> None:  # type: ignore
    """The optimizer state the compiled program holds, per state tensor, equals torch.optim's layout counted by
    hand on the program's own per-chip weight shapes; the rows say which optimizer and dtype, measured."""
    from shardlab.inspect import output

    r, shapes = compiled(name, precision)
    assert r.fits and len(shapes) == 12  # embedding, LM head, final norm; q k v o gate up down, 2 norms stacked
    assert sum(math.prod(s) for s in shapes) * 2 == r.row("parameters")["compiler"]
    want = hand_count(shapes, name, precision)
    assert r.optimizer["by_state"] == want and r.optimizer["measured"]
    assert r.row("optimizer state")["compiler"] == sum(want.values())
    assert r.optimizer["optimizer"] == name and r.optimizer["dtype"] == precision
    label = output.kind_label(r.row("optimizer state"))
    assert precision in label and label.startswith("optimizer state (")
    assert f", {precision}: " in output.text(r) and "measured" in output.optimizer_line(r)


@pytest.mark.xla
def test_adafactor_is_smaller_than_adamw_by_the_factored_amount(xla_world) -> None:  # type: ignore
    """bf16 at tiny size: AdamW keeps 2 bf16 copies of every weight, Adafactor only the factors (and the vectors'
    variance); the difference is exactly 2 copies minus the factors."""
    adam, _ = compiled("adamw", "bf16")
    fact, _ = compiled("adafactor", "bf16")
    a, f = adam.row("optimizer state")["compiler"], fact.row("optimizer state")["compiler"]
    params = adam.row("parameters")["compiler"]  # bf16: 2 bytes per element
    assert a == 2 * params
    factors = sum(fact.optimizer["by_state"].values())
    assert a - f == 2 * params - factors and f < a / 10
    assert set(fact.optimizer["by_state"]) == {"row_var", "col_var", "variance"}
    # the planner prices the same optimizer (formulas.optimizers' bytes per parameter)
    assert adam.optimizer["planner_bytes_per_param"] == 4
    assert fact.optimizer["planner_bytes_per_param"] < 0.1
