"""``python -m shardlab.memory flash|roam|verdict|verdict-70b``: measure notebook 08b's full-size results and write
their cache (``shardlab.memory.full_size``), in a world of the devices each needs (flash, roam: one; verdict:
notebook 07's 8-chip step, verdict-70b: its 64-chip 70B step)
so that every full-size program compiles in this process."""

from __future__ import annotations

import argparse

from shardlab import runtime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("what", choices=("flash", "roam", "verdict", "verdict-70b"))
    what = ap.parse_args().what
    devices = {"verdict": 8, "verdict-70b": 64}.get(what, 1)  # = full_size.WHAT (not imported before setup)
    runtime.setup(num_devices=devices)
    # after setup: full_size imports torch_xla, which must see the device count first (the ordering rule)
    from shardlab.memory import full_size

    print("wrote", full_size.write(what))


if __name__ == "__main__":
    main()
