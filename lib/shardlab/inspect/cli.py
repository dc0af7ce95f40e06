"""``python -m shardlab inspect MODEL --topology v6e-8 --mesh fsdp=8 ...``: the command line of :func:`run`.

Design note: the process sets its own device world up with the slice's chip count (at most
``runtime.MAX_CPU_DEVICES``), so the step is traced and compiled here and every stage is shown while it runs
(stage and elapsed seconds, on the terminal's stderr: a copy of fd 2 taken at start, because the compile
redirects fd 2 to filter libtpu's noise). Every bad input is found before the device world starts where it can
be (the slice, the mesh, the batch, the model, the rules) and the rest before any compile.

Exit status: 0 the step fits, 1 it does not fit, 2 bad input (the message names the value and the rule; found
before any compile), 3 inspect itself failed (the traceback is written to a file whose path is printed).

Examples::

    python -m shardlab inspect llama-3-8b --topology v6e-8 --mesh fsdp=8 --seq 8192
    python -m shardlab inspect my_config.json --topology v5e-8 --mesh fsdp=4,tensor=2 --rule 'lm_head=tensor,-'
    python -m shardlab inspect mixtral-8x7b --topology v6e-64 --mesh fsdp=16,tensor=4 --json > out.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import IO, Any

from shardlab import runtime
from shardlab.formulas.optimizers import OPTIMIZERS, PRECISIONS
from shardlab.inspect import output
from shardlab.inspect.attention import ATTENTION
from shardlab.inspect.config import LAYER_MODES, RECOMPUTE, InspectInputError, make_config
from shardlab.profile.tpu import quiet_libtpu

EXIT_FITS, EXIT_DOES_NOT_FIT, EXIT_BAD_INPUT, EXIT_INTERNAL = 0, 1, 2, 3

EPILOG = """\
exit status:
  0  the step fits on the slice (the compiler's verdict)
  1  it does not fit (the compiler ran out of memory; its message is printed)
  2  bad input: the message names the value and the rule, and nothing was compiled
  3  inspect itself failed: the traceback is saved to a file whose path is printed

what is traced:
  weights bf16 (placeholders, nothing allocated), tokens and labels int64, HF's loss on fp32 logits;
  the optimizer (--optimizer, --optimizer-dtype) updates every weight inside the traced step, its state
  sharded like the weight and donated into its update (torch.optim's state layout, step counters left out):
    --optimizer-dtype fp32 (default): an fp32 master copy of each weight + fp32 state (mixed precision)
    --optimizer-dtype bf16: no master, the bf16 weights updated directly, state in bf16
    adamw         exp_avg, exp_avg_sq                          12 | 4 bytes per parameter (fp32 | bf16)
    adafactor     row_var + col_var (factored second moments over the last two dims, no first moment;
                  1-D weights: variance)                       4 + ~0 | ~0
    sgd           no state                                      4 | 0
    sgd-momentum  momentum_buffer                               8 | 2
  attention (--attention): eager (default) and sdpa are HF's implementations: the [b, heads, s, s] scores
  exist in the program (the planner's no-flash prediction is compared); flash is torch_xla's Pallas
  FlashAttention kernel compiled compile-only (no [s, s] array; the planner's flash prediction is compared).

host offload (--recompute offload, layers scan / scan_layers):
  torch_xla's place_to_host / place_to_device around the hidden-state input each scanned layer keeps for its
  backward. Compiled compile-only, XLA:TPU keeps the scan's stacked [L, b, s, h] residual in host memory
  (memory space S(5)), written by L async dynamic-update-slices (device -> host) in the forward loop and read
  by L async dynamic-slices (host -> device) in the backward loop; the HBM temporaries drop by at least its
  size. Printed (measured): the host arrays, the compiler's host temporaries, the transfers per step.
  The rotary tables and weight slices the layer also keeps stay in HBM (offloading the rotary tables too
  fails XLA:TPU's verifier with libtpu 0.0.21). HF's loop (--layers loop) cannot offload: exit 2.

measured vs derived (labelled in every output):
  measured = read from the compiled XLA:TPU program: fits, total, arguments, temporaries, parameters and
  optimizer state (the entry parameters the donation names; the state also per tensor: master, exp_avg, ...),
  collectives and their mesh axes, largest buffers. Out of memory, parameters and state are derived (layout).
  derived  = layout arithmetic, not read from the program: the gradients (bf16, sharded like their weights,
  inside the temporaries) and "activations + other temporaries" = temporaries - gradients.
"""


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """The ``inspect`` subcommand's arguments (on ``python -m shardlab``'s subparsers)."""
    ip = sub.add_parser("inspect", help="compile an HF model's training step for a TPU slice (compile-only)",
                        description="Will this Hugging Face model's training step fit on a TPU slice, and what does "
                                    "it communicate? Weights and inputs are placeholders: nothing is allocated.",
                        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    ip.add_argument("model", help="a preset in data/models (llama-3-8b, mistral-7b, mixtral-8x7b, gpt2, gemma-2b) "
                    "or a config.json path (Llama, Mistral, Mixtral, Qwen2, Qwen3, Qwen3-MoE, Gemma, Gemma 2, "
                    "Gemma 3 text, Phi-3, GPT-2, GPT-NeoX, DeepSeek-V3, gpt-oss are tested)")
    ip.add_argument("--topology", default="v6e-8",
                    help="TPU slice: v5e-8, v6e-8, v6e-64 ... (libtpu's form, e.g. v6e:2x4, is accepted too)")
    ip.add_argument("--mesh", default="fsdp=8", help="mesh axes NAME=SIZE in device order (default fsdp=8)")
    ip.add_argument("--fsdp", default="auto", help="axes FSDP splits parameters over, '+'-joined; 'none'; "
                    "default: the fsdp axis if present")
    ip.add_argument("--tensor", default="auto", help="axis of the Megatron rules; 'none'; default: the tensor axis "
                    "if present")
    ip.add_argument("--rule", action="append", default=[], metavar="REGEX=SPEC",
                    help="your rule: parameter-name regex = spec, e.g. 'down_proj\\.weight$=fsdp,tensor' "
                         "('-' = not split, 'data+fsdp' = two axes); first match wins")
    ip.add_argument("--strict", action="store_true", help="every parameter must match one of your or the Megatron "
                    "rules")
    ip.add_argument("--batch", type=int, default=8, help="global batch (sequences per step)")
    ip.add_argument("--seq", type=int, default=2048, help="tokens per sequence")
    ip.add_argument("--recompute", default="full", choices=RECOMPUTE,
                    help="full: each layer recomputed in the backward (its input kept); selective: the projections' "
                         "outputs kept (scans); none; offload: full, with each layer's hidden-state input kept in "
                         "host memory (scans; see below)")
    ip.add_argument("--attention", default="eager", choices=ATTENTION,
                    help="eager / sdpa: HF's implementations (the [b, heads, s, s] scores exist); flash: torch_xla's "
                         "Pallas FlashAttention kernel, traced for the TPU compile-only (causal; refused for sliding "
                         "windows, soft-capping, sinks)")
    ip.add_argument("--layers", default="scan", choices=LAYER_MODES,
                    help="scan: stacked weights + torch_xla scan; scan_layers: torch_xla's scan_layers; loop: HF's")
    ip.add_argument("--num-layers", type=int, default=None, help="override the layer count (quick checks)")
    ip.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                    help="override a config field (JSON value), e.g. --set hidden_size=256")
    ip.add_argument("--optimizer", default="adamw", choices=OPTIMIZERS,
                    help="adamw | adafactor (torch.optim.Adafactor: factored second moments) | sgd | sgd-momentum "
                         "(state per parameter: see below)")
    ip.add_argument("--optimizer-dtype", default="fp32", choices=PRECISIONS,
                    help="fp32: fp32 master weights + fp32 state (mixed precision); bf16: no master, bf16 state "
                         "(the bf16 weights updated directly, as torch.optim does on bf16 parameters)")
    ip.add_argument("--no-donate", dest="donate", action="store_false",
                    help="compile without aliasing the updated state to its inputs")
    ip.add_argument("--confirm", action="store_true", help="when it does not fit, compile the planner's nearest plan "
                    "that fits too")
    ip.add_argument("--json", action="store_true", help="print the result as JSON (stdout) instead of the table")
    ip.add_argument("--html", type=Path, default=None, help="write a self-contained HTML page")
    ip.add_argument("--quiet", action="store_true", help="no progress lines")
    return ip


class Progress:
    """Stage and elapsed seconds on the terminal while the step is traced and compiled."""

    def __init__(self, stream: IO[str] | None) -> None:
        self.stream, self.t0, self.stage = stream, time.perf_counter(), ""
        self.tty = bool(stream and stream.isatty())
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __call__(self, stage: str) -> None:
        if self.stream is None:
            return
        self.stage = stage
        self._write(newline=not self.tty)
        if self._thread is None:
            self._thread = threading.Thread(target=self._tick, daemon=True)
            self._thread.start()

    def _write(self, newline: bool) -> None:
        assert self.stream is not None
        line = f"[{time.perf_counter() - self.t0:6.1f} s] {self.stage}"
        self.stream.write(("\r\x1b[K" + line) if self.tty else line + "\n" if newline else "")
        self.stream.flush()

    def _tick(self) -> None:
        last = time.perf_counter()
        while not self._stop.wait(1.0):
            if self.tty:
                self._write(False)
            elif time.perf_counter() - last >= 30:
                last = time.perf_counter()
                self._write(True)

    def close(self) -> None:
        self._stop.set()
        if self.stream is not None and self.tty:
            self.stream.write("\n")
            self.stream.flush()


def _value(text: str) -> Any:
    """A ``--set`` value: JSON (``256``, ``true``, ``null``, ``[1, 2]``), else the text itself (checked against the
    field's type by ``models.check_overrides``)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def check_html_path(path: Path | None) -> None:
    """``--html`` names a file that can be written (checked before any compile, not after minutes of it)."""
    if path is None:
        return
    if path.is_dir():
        raise InspectInputError(f"--html {path}: is a directory; give a file name, e.g. {path / 'inspect.html'}")
    parent = path.parent if str(path.parent) else Path(".")
    existing = next((p for p in (parent, *parent.parents) if p.exists()), Path("."))
    if not existing.is_dir() or not os.access(existing, os.W_OK):
        raise InspectInputError(f"--html {path}: {existing} is not a writable directory")


def save_traceback() -> Path:
    """The current exception's traceback in a new file under the temp directory; its path."""
    fd, name = tempfile.mkstemp(prefix="shardlab-inspect-", suffix=".traceback.txt")
    with os.fdopen(fd, "w") as f:
        traceback.print_exc(file=f)
    return Path(name)


def main(args: argparse.Namespace) -> int:
    """Run ``python -m shardlab inspect`` (see the module note for the exit status)."""
    err = os.fdopen(os.dup(2), "w", buffering=1)
    progress = Progress(None if args.quiet else err)
    try:
        rules = []
        for r in args.rule:
            pattern, sep, spec = r.rpartition("=")
            if not sep or not pattern:
                raise InspectInputError(f"--rule {r!r} is not REGEX=SPEC (e.g. 'down_proj\\.weight$=fsdp,tensor')")
            rules.append((pattern, spec))
        overrides = {}
        for s in args.set:
            k, sep, v = s.partition("=")
            if not sep:
                raise InspectInputError(f"--set {s!r} is not FIELD=VALUE")
            if not k:
                raise InspectInputError(f"--set {s!r}: no field name before '='")
            overrides[k] = _value(v)
        fsdp = None if args.fsdp == "none" else args.fsdp if args.fsdp == "auto" else tuple(args.fsdp.split("+"))
        tensor = None if args.tensor == "none" else args.tensor
        cfg = make_config(args.model, mesh=args.mesh, topology=args.topology, fsdp=fsdp, tensor=tensor, rules=rules,
                          batch=args.batch, seq=args.seq, optimizer=args.optimizer,
                          optimizer_dtype=args.optimizer_dtype, recompute=args.recompute,
                          layers=args.layers, attention=args.attention, strict=args.strict,
                          num_layers=args.num_layers, overrides=overrides,
                          donate=args.donate)
        check_html_path(args.html)
        progress("checking the slice, mesh, batch, model and rules")
        cfg.validate()

        devices = cfg.chips
        if cfg.chips > runtime.MAX_CPU_DEVICES:  # more chips than CPU devices: trace small, compile big
            from shardlab.profile.retarget import RetargetError, trace_mesh

            try:
                devices = math.prod(trace_mesh([n for _, n in cfg.mesh]))
            except RetargetError as exc:
                raise InspectInputError(f"{cfg.topology}: {exc}") from None
        progress(f"starting a {devices}-device CPU world (torch_xla)")
        runtime.setup(num_devices=devices)
        # api imports torch_xla, which must follow runtime.setup() (and costs 5.4 s, bad input exits without it)
        from shardlab.inspect.api import run

        with quiet_libtpu():  # libtpu's missing-TPU warnings (fd 2); other lines are re-emitted afterwards
            result = run(cfg, progress, confirm=args.confirm)
    except InspectInputError as exc:
        progress.close()
        print(f"error: {exc}", file=err)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        progress.close()
        print("interrupted", file=err)
        return EXIT_INTERNAL
    except Exception as exc:  # noqa: BLE001 - inspect itself failed: say so, traceback in a file
        progress.close()
        path = save_traceback()
        print(f"error: inspect itself failed ({type(exc).__name__}: {str(exc)[:300]}); this is a bug in inspect, "
              f"not in your input. Traceback: {path}", file=err)
        return EXIT_INTERNAL
    progress.close()
    if args.html:
        args.html.parent.mkdir(parents=True, exist_ok=True)
        args.html.write_text(output.html_page(result))
        print(f"HTML: {args.html}", file=err)
    print(output.as_json(result) if args.json else output.text(result), file=sys.stdout)
    return result.exit_status
