"""``python -m sim [OPTIONS]``: the same as ``racktwin sim [OPTIONS]`` (see agent/commands/sim_cmd.py)."""

from __future__ import annotations

import sys

from agent.cli import main

if __name__ == "__main__":
    raise SystemExit(main(["sim", *sys.argv[1:]]))
