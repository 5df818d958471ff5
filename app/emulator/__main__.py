"""The operators the emulator runs, and whether it runs a given model.

Example usage:

    python -m app.emulator                       # the operators it runs, one a line
    python -m app.emulator model_int8.tflite     # prepares the model: "runs all 62 operators" or why not

The check exits 0 when the emulator runs every operator of every model given, 1 when it refuses some
(listed on one line).
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

from app.emulator.errors import UnsupportedModel, UnsupportedOperators
from app.emulator.plan import prepare, supported_opcodes
from app.tflite_file import TfliteFileError, read_tflite


def check(path: Path) -> tuple[bool, str]:
    """(runs, a line saying so): the model prepared as the emulated backend prepares it at load."""
    try:
        model = read_tflite(path)
        plan = prepare(model)
    except (UnsupportedOperators, UnsupportedModel, TfliteFileError) as e:
        return False, f"{path}: {e}"
    counts = Counter(plan.opcodes)
    return True, (f"{path}: the emulator runs all {len(plan.steps)} operators "
                  f"({', '.join(f'{op} {n}' for op, n in sorted(counts.items()))})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m app.emulator", description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", type=Path, metavar="MODEL", help=".tflite files to check (optional)")
    args = parser.parse_args(argv)
    if not args.models:
        print("\n".join(supported_opcodes()))
        return 0
    every = True
    for path in args.models:
        runs, line = check(path)
        print(line)
        every = every and runs
    return 0 if every else 1


if __name__ == "__main__":
    sys.exit(main())
