"""TEST DOUBLE of Coral's edgetpu_compiler: a stand-in executable for the subprocess boundary.

The real compiler is a closed x86-64 binary from Coral's apt repository and is not installed
here. `install()` writes an executable script named `edgetpu_compiler_test_double` that takes
the real compiler's flags, prints its stdout format, and writes what it writes into --out_dir:
`<stem>_edgetpu.tflite` (built like compiled_model_double: one edgetpu-custom-op node between the
input model's own input and output tensors, carrying a package stamped with the -m runtime version;
no TPU could run it) and `<stem>_edgetpu.log`.
Which operators it reports as mapped comes from the offline analysis of the input, so the
numbers are consistent; nothing here compiles anything. Every invocation's arguments are
appended to `<script>.calls.json` for the tests to read.

Modes: ok, fail (exit 1 with the compiler's error text), nothing-mapped (0 Edge TPU
subgraphs, the input copied), no-output (exit 0, writes nothing), newer-runtime (ignores -m,
stamps runtime 15), old-version (says it is 15.0.340273435).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

PINNED = "16.0.384591198"
OLD = "15.0.340273435"
SCRIPT_NAME = "edgetpu_compiler_test_double"
MODES = ("ok", "fail", "nothing-mapped", "no-output", "newer-runtime", "old-version")


def install(directory: Path, mode: str = "ok") -> Path:
    """Write the executable test double into directory and return its path."""
    if mode not in MODES:
        raise ValueError(f"mode {mode!r}, expected one of {MODES}")
    root = Path(__file__).resolve().parents[2]
    script = Path(directory) / SCRIPT_NAME
    script.write_text(
        f"#!{sys.executable}\n"
        "# TEST DOUBLE of Coral's edgetpu_compiler (tests/doubles/edgetpu_compiler_double.py); compiles nothing.\n"
        "import sys\n"
        f"sys.path.insert(0, {str(root)!r})\n"
        "from tests.doubles.edgetpu_compiler_double import main\n"
        f"sys.exit(main(sys.argv[1:], {mode!r}, __file__))\n")
    script.chmod(0o755)
    return script


def calls(script: Path) -> list[list[str]]:
    path = Path(f"{script}.calls.json")
    return json.loads(path.read_text()) if path.exists() else []


def _size(n: int) -> str:
    for unit, factor in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= factor:
            return f"{n / factor:.2f}{unit}"
    return f"{n:.2f}B"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="edgetpu_compiler")
    p.add_argument("-v", "--version", action="store_true")
    p.add_argument("-s", "--show_operations", action="store_true")
    p.add_argument("-m", "--min_runtime_version", type=int, default=14)
    p.add_argument("-o", "--out_dir", default=".")
    p.add_argument("-t", "--timeout_sec", type=int, default=180)
    p.add_argument("-n", "--num_segments", type=int, default=1)
    p.add_argument("-d", "--search_delegate", action="store_true")
    p.add_argument("-k", "--delegate_search_step", type=int, default=1)
    p.add_argument("-i", "--intermediate_tensors", default=None)
    p.add_argument("model", nargs="?")
    return p


def _table(lines: list[tuple[str, int, str]]) -> str:
    rows = [f"{'Operator':<30} {'Count':<10} Status", ""]
    rows += [f"{op:<30} {count:<10} {status}" for op, count, status in lines]
    return "\n".join(rows)


def _operator_lines(model_path: Path) -> tuple[list[tuple[str, int, str]], int, int]:
    """(table lines, ops mapped, ops total), from the offline analysis of the input."""
    from app.edgetpu.compat import analyze
    from app.tflite_file import read_tflite

    report = analyze(read_tflite(model_path))
    statuses = []
    for verdict in report.ops:
        if report.on_edgetpu(verdict.index):
            statuses.append((verdict.opcode, "Mapped to Edge TPU"))
        elif not verdict.supported and verdict.index == report.first_unsupported.index:
            statuses.append((verdict.opcode, "Operation is working on an unsupported data type"))
        else:
            statuses.append((verdict.opcode, "More than one subgraph is not supported"))
    counted = Counter(statuses)
    return [(op, n, status) for (op, status), n in counted.items()], report.mapped, report.total


def main(argv: list[str], mode: str, script: str) -> int:
    record = Path(f"{script}.calls.json")
    history = json.loads(record.read_text()) if record.exists() else []
    record.write_text(json.dumps(history + [argv]))
    args = _parser().parse_args(argv)
    version = OLD if mode == "old-version" else PINNED
    print(f"Edge TPU Compiler version {version}")
    if args.version:
        return 0
    if mode == "fail":
        print(f"ERROR: Didn't find op for builtin opcode 'RSQRT' version '2'\nERROR: Registration failed.\n\n"
              f"Invalid model: {args.model}\nModel could not be parsed", file=sys.stderr)
        return 1
    print(f"Started a compilation timeout timer of {args.timeout_sec} seconds.\n")
    if mode == "no-output":
        print("Model compiled successfully in 3 ms.\n")
        return 0

    from tests.doubles.compiled_model_double import compiled_model_bytes

    model = Path(args.model)
    out_dir = Path(args.out_dir)
    lines, mapped, total = _operator_lines(model)
    if mode == "nothing-mapped":
        lines, mapped = [(op, n, "Operation is otherwise supported, but not mapped due to some unspecified limitation")
                         for op, n, _ in lines], 0
    runtime = 15 if mode == "newer-runtime" else args.min_runtime_version
    stems = [model.stem] if args.num_segments == 1 else [
        f"{model.stem}_segment_{i}_of_{args.num_segments}" for i in range(args.num_segments)]
    print("Model compiled successfully in 12 ms.\n")
    for stem in stems:
        output = out_dir / f"{stem}_edgetpu.tflite"
        content = model.read_bytes() if mode == "nothing-mapped" else compiled_model_bytes(
            min_runtime_version=runtime, source=model.read_bytes())
        output.write_bytes(content)
        log = out_dir / f"{stem}_edgetpu.log"
        log.write_text(f"Edge TPU Compiler version {version}\nInput: {model}\nOutput: {output}\n\n{_table(lines)}\n")
        parameters = model.stat().st_size
        print(f"Input model: {model}\nInput size: {_size(model.stat().st_size)}\n"
              f"Output model: {output}\nOutput size: {_size(len(content))}\n"
              f"On-chip memory used for caching model parameters: {_size(parameters if mapped else 0)}\n"
              f"On-chip memory remaining for caching model parameters: {_size(8 * (1 << 20) - parameters)}\n"
              "Off-chip memory used for streaming uncached model parameters: 0.00B\n"
              f"Number of Edge TPU subgraphs: {1 if mapped else 0}\n"
              f"Total number of operations: {total}\nOperation log: {log}\n")
    if mapped < total:
        print("Model successfully compiled but not all operations are supported by the Edge TPU. A percentage of "
              "the model will instead run on the CPU, which is slower. If possible, consider updating your model to "
              "use only operations supported by the Edge TPU. For details, visit g.co/coral/model-reqs.\n"
              f"Number of operations that will run on Edge TPU: {mapped}\n"
              f"Number of operations that will run on CPU: {total - mapped}\n")
    if args.show_operations:
        print(_table(lines))
    else:
        print("See the operation log file for individual operation details.")
    print("Compilation child process completed within timeout period.\nCompilation succeeded! ")
    return 0
