"""``python -m shardlab inspect MODEL --topology v6e-8 --mesh fsdp=8 ...``: the command line of :func:`run`.

Design note: the process sets its own device world up with the slice's chip count (at most
``runtime.MAX_CPU_DEVICES``), so the step is traced and compiled here and every stage is shown while it runs
(stage and elapsed seconds, on the terminal's stderr: a copy of fd 2 taken at start, because the compile
redirects fd 2 to filter libtpu's noise). Every bad input is found before the device world starts where it can
be (the slice, the mesh, the batch, the model, the rules) and the rest before any compile.

Exit status: 0 the step fits, 1 it does not fit, 2 bad input (the message names the value and the rule) or
inspect itself failed (with the traceback).

Examples::

    python -m shardlab inspect llama-3-8b --topology v6e-8 --mesh fsdp=8 --seq 8192
    python -m shardlab inspect my_config.json --topology v5e-8 --mesh fsdp=4,tensor=2 --rule 'lm_head=tensor,-'
    python -m shardlab inspect mixtral-8x7b --topology v6e-64 --mesh fsdp=16,tensor=4 --json > out.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import IO, Any

from shardlab import runtime
from shardlab.inspect import output
from shardlab.inspect.config import LAYER_MODES, RECOMPUTE, InspectInputError, make_config
from shardlab.profile.tpu import quiet_libtpu
from shardlab.report.datatypes import EXIT_RUNNER


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """The ``inspect`` subcommand's arguments (on ``python -m shardlab``'s subparsers)."""
    ip = sub.add_parser("inspect", help="compile an HF model's training step for a TPU slice (compile-only)",
                        description="Will this Hugging Face model's training step fit on a TPU slice, and what does "
                                    "it communicate? Weights and inputs are placeholders: nothing is allocated.")
    ip.add_argument("model", help="a preset in data/models (llama-3-8b, mistral-7b, mixtral-8x7b, gpt2, gemma-2b) "
                    "or a config.json path")
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
    ip.add_argument("--recompute", default="full", choices=RECOMPUTE)
    ip.add_argument("--layers", default="scan", choices=LAYER_MODES,
                    help="scan: stacked weights + torch_xla scan; scan_layers: torch_xla's scan_layers; loop: HF's")
    ip.add_argument("--num-layers", type=int, default=None, help="override the layer count (quick checks)")
    ip.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                    help="override a config field (JSON value), e.g. --set hidden_size=256")
    ip.add_argument("--optimizer", default="adamw")
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
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


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
            overrides[k] = _value(v)
        fsdp = None if args.fsdp == "none" else args.fsdp if args.fsdp == "auto" else tuple(args.fsdp.split("+"))
        tensor = None if args.tensor == "none" else args.tensor
        cfg = make_config(args.model, mesh=args.mesh, topology=args.topology, fsdp=fsdp, tensor=tensor, rules=rules,
                          batch=args.batch, seq=args.seq, optimizer=args.optimizer, recompute=args.recompute,
                          layers=args.layers, strict=args.strict, num_layers=args.num_layers, overrides=overrides,
                          donate=args.donate)
        progress("checking the slice, mesh, batch, model and rules")
        cfg.validate()

        if cfg.chips > runtime.MAX_CPU_DEVICES:
            raise InspectInputError(f"{cfg.topology} has {cfg.chips} chips: tracing its step needs that many CPU "
                                    f"devices, and this host allows at most {runtime.MAX_CPU_DEVICES} "
                                    "(runtime.MAX_CPU_DEVICES)")
        progress(f"starting a {cfg.chips}-device CPU world (torch_xla)")
        runtime.setup(num_devices=cfg.chips)
        # api imports torch_xla, which must follow runtime.setup() (and costs 5.4 s, bad input exits without it)
        from shardlab.inspect.api import run

        with quiet_libtpu():  # libtpu's missing-TPU warnings (fd 2); other lines are re-emitted afterwards
            result = run(cfg, progress, confirm=args.confirm)
    except InspectInputError as exc:
        progress.close()
        print(f"error: {exc}", file=err)
        return EXIT_RUNNER
    except KeyboardInterrupt:
        progress.close()
        print("interrupted", file=err)
        return EXIT_RUNNER
    except Exception:  # noqa: BLE001 - inspect itself failed: say so, with the traceback
        progress.close()
        traceback.print_exc(file=err)
        print("error: inspect itself failed (see the traceback above)", file=err)
        return EXIT_RUNNER
    progress.close()
    if args.html:
        args.html.parent.mkdir(parents=True, exist_ok=True)
        args.html.write_text(output.html_page(result))
        print(f"HTML: {args.html}", file=err)
    print(output.as_json(result) if args.json else output.text(result), file=sys.stdout)
    return result.exit_status
