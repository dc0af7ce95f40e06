"""The committed store of XLA:TPU compile results (``shardlab.profile.tpu_store``): refresh, verify, list.

``refresh`` empties ``data/tpu_store`` and runs the report (every notebook at its defaults) with
``SHARDLAB_TPU_STORE=write``, so the store holds exactly the compiles the report makes; ``verify`` recompiles every
stored proto live (JAX + libtpu only) and compares program text, memory, cost and out-of-memory message exactly;
``list`` prints each entry's label, topology, stored compile seconds and size.

Usage::

    python tools/tpu_store.py refresh            # ~2 min: the report, compiling live and storing
    python tools/tpu_store.py verify             # every entry recompiled and compared (~1 min)
    python tools/tpu_store.py list
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def refresh(jobs: int) -> int:
    from shardlab.profile.tpu_store import ENV, STORE_DIR

    for old in STORE_DIR.glob("*.json.xz"):
        old.unlink()
    with tempfile.TemporaryDirectory(prefix="shardlab-store-report-") as out:
        cmd = [sys.executable, "-m", "shardlab", "report", "--out", out, "--overwrite", "--jobs", str(jobs)]
        code = subprocess.call(cmd, cwd=ROOT, env={**os.environ, ENV: "write"})
    print(f"{len(list(STORE_DIR.glob('*.json.xz')))} compiles stored in {STORE_DIR} (report exit {code})")
    return code


def verify() -> int:
    from shardlab.profile import tpu
    from shardlab.profile.tpu_store import key_of, stored_compiles

    bad = 0
    for key, entry in stored_compiles():
        t0 = time.perf_counter()
        diffs = ([f"file name {key[:12]}… is not the key of its fields"] if key_of(entry.fields) != key else []) \
            + tpu.recompile_stored(entry)
        bad += bool(diffs)
        print(f"{'ok ' if not diffs else 'BAD'} {key[:12]} {entry.fields['topology']:8s} {entry.label or '-':40s} "
              f"{time.perf_counter() - t0:5.1f} s" + ("".join(f"\n    {d}" for d in diffs)))
    print(f"{bad} of {len(stored_compiles())} entries differ from a live compile")
    return int(bad > 0)


def listing() -> int:
    from shardlab.profile.tpu_store import path_of, stored_compiles

    rows = stored_compiles()
    for key, e in sorted(rows, key=lambda kv: -kv[1].compile_s):
        kib = path_of(key).stat().st_size / 1024
        print(f"{key[:12]} {e.fields['topology']:9s} {e.compile_s:6.2f} s {kib:7.1f} KiB "
              f"{'fits' if e.text is not None else 'OOM '} {e.label}")
    total = sum(path_of(k).stat().st_size for k, _ in rows)
    print(f"{len(rows)} entries, {total / 1024:.0f} KiB, {sum(e.compile_s for _, e in rows):.1f} s of compiles stored")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("command", choices=("refresh", "verify", "list"))
    ap.add_argument("--jobs", type=int, default=2, help="refresh: notebooks at once")
    a = ap.parse_args()
    return {"refresh": lambda: refresh(a.jobs), "verify": verify, "list": listing}[a.command]()


if __name__ == "__main__":
    sys.exit(main())
