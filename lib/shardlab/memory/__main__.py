"""``python -m shardlab.memory flash|roam``: measure notebook 08b's full-size results and write their cache
(``shardlab.memory.full_size``), in a one-device world: every full-size program compiles in this process."""

from __future__ import annotations

import argparse

from shardlab import runtime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("what", choices=("flash", "roam"))
    what = ap.parse_args().what
    runtime.setup(num_devices=1)
    # after setup: full_size imports torch_xla, which must see the device count first (the ordering rule)
    from shardlab.memory import full_size

    print("wrote", full_size.write(what))


if __name__ == "__main__":
    main()
