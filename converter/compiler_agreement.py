"""The offline Edge TPU analysis held against what edgetpu_compiler really did with the same file.

Two kinds of ground truth, either or both per model:
  - the compiler's log (`NAME_edgetpu.log`): per operator type, how many were mapped and why the others were
    not; compared line by line with the analysis' prediction of that table (CompatReport.table());
  - the compiled file (`NAME_edgetpu.tflite`): every operator other than `edgetpu-custom-op` is one the CPU
    runs, under the same output tensor name as in the plain file; compared operator by operator.
A compiled file is taken as the plain file's twin only if every tensor it shares with it (by name) has the same
shape and quantization, so that a compiled file from another export of the same model cannot pass for it.

Example usage, over the public pairs of converter/data/edgetpu_compiler_pairs.json, each repository checked out
at its commit under FOLDER/OWNER/NAME (docs/edgetpu-compiler.md):

    python -m converter.compiler_agreement FOLDER --checkouts | sh   # git clone each repository, at its commit
    python -m converter.compiler_agreement FOLDER
    python -m converter.compiler_agreement FOLDER --json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from app.edgetpu import compiler_limits as learned
from app.edgetpu.compat import CompatReport, analyze
from app.edgetpu.compiled_model import EDGETPU_CUSTOM_OP
from app.tflite_file import TfliteModel, read_tflite
from converter.compiler_log import CompilerReport, parse

MANIFEST = Path(__file__).with_name("data") / "edgetpu_compiler_pairs.json"


class NotATwin(ValueError):
    """The compiled file was not compiled from this plain file."""


@dataclass
class Agreement:
    """One model: what the compiler mapped, what the analysis says, and where they part."""

    total: int
    ours_mapped: int
    compiler_mapped: int
    # from a compiled twin: the operators placed differently (index, opcode, ours, compiler's)
    misplaced: list[tuple[int, str, str, str]] | None = None
    # from a compiled twin: the operator types it shows on the Edge TPU
    seen_mapped: set[str] = field(default_factory=set)
    # from a log: (type, status) -> (ours, the log's) where the counts differ
    table_differences: dict[tuple[str, str], tuple[int, int]] = field(default_factory=dict)
    unsure: int = 0

    @property
    def agrees(self) -> bool:
        return self.ours_mapped == self.compiler_mapped and not self.misplaced and not self.table_differences

    def as_dict(self) -> dict:
        return {"total": self.total, "ours_mapped": self.ours_mapped, "compiler_mapped": self.compiler_mapped,
                "agrees": self.agrees, "unsure": self.unsure,
                "misplaced": None if self.misplaced is None else [list(m) for m in self.misplaced],
                "table_differences": [{"type": t, "status": s, "ours": o, "log": g}
                                      for (t, s), (o, g) in sorted(self.table_differences.items())]}


def cpu_operators(plain: TfliteModel, compiled: TfliteModel) -> set[int]:
    """The plain file's operators that its compiled twin runs on the CPU (NotATwin when it is not its twin)."""
    ours, theirs = plain.graph, compiled.graph
    by_name = {t.name: t for t in ours.tensors}
    made_by = {ours.tensors[t].name: op for op in ours.operators for t in op.outputs}
    # every tensor the compiled graph passes between operators (the Edge TPU's inputs and outputs, the CPU's
    # tensors) is the plain file's, with its shape and quantization
    passed = {t for op in theirs.operators for t in (*op.inputs, *op.outputs) if t >= 0
              and not theirs.tensors[t].is_constant}
    for tensor in (theirs.tensors[t] for t in sorted(passed)):
        mine = by_name.get(tensor.name)
        if mine is None:
            raise NotATwin(f"the compiled file's tensor {tensor.name!r} is not in the plain file: not compiled from it")
        # a shape of [] is unknown to the writer (an old converter's post-processing outputs): not compared
        known = mine.shape and tensor.shape
        if (known and mine.shape != tensor.shape) or not _same_quantization(mine, tensor):
            raise NotATwin(f"tensor {tensor.name!r} differs between the plain and the compiled file "
                           f"({list(mine.shape)} {_q(mine)} against {list(tensor.shape)} {_q(tensor)}): not compiled "
                           "from this file")
    cpu = set()
    for op in theirs.operators:
        if op.opcode == EDGETPU_CUSTOM_OP:
            continue
        name = theirs.tensors[op.outputs[0]].name
        mine = made_by.get(name)
        if mine is None or mine.opcode != op.opcode:
            raise NotATwin(f"the compiled file's {op.opcode} making {name!r} is not in the plain file")
        cpu.add(mine.index)
    if not any(op.opcode == EDGETPU_CUSTOM_OP for op in theirs.operators):
        raise NotATwin("the compiled file has no edgetpu-custom-op")
    return cpu


def _q(tensor) -> str:
    q = tensor.quantization
    return "unquantized" if q is None else f"scale {q.scale.tolist()[:2]} zero point {q.zero_point.tolist()[:2]}"


def _same_quantization(a, b) -> bool:
    qa, qb = a.quantization, b.quantization
    if qa is None or qb is None:
        return qa is None and qb is None
    return qa.scale.tolist() == qb.scale.tolist() and qa.zero_point.tolist() == qb.zero_point.tolist()


def log_table(report: CompilerReport) -> Counter:
    """(operator type, status) -> count from a compiler log's operator table."""
    table: Counter = Counter()
    for line in report.operators:
        table[(line.type, line.status)] += line.count
    return table


def predicted_table(report: CompatReport, plain: TfliteModel) -> Counter:
    """The analysis' prediction of the compiler's table; custom operators appear there as CUSTOM."""
    table: Counter = Counter()
    for op in plain.graph.operators:
        table[("CUSTOM" if op.custom else op.opcode, report.status(op.index))] += 1
    return table


def compare(plain: TfliteModel, log: str | None = None, compiled: TfliteModel | None = None) -> Agreement:
    """The analysis of `plain` against the compiler's log text and/or its compiled twin."""
    if log is None and compiled is None:
        raise ValueError("compare() needs the compiler's log or the compiled file")
    report = analyze(plain)
    total = report.total
    result = Agreement(total=total, ours_mapped=report.mapped, compiler_mapped=-1, unsure=len(report.unsure))
    if compiled is not None:
        cpu = cpu_operators(plain, compiled)
        result.compiler_mapped = total - len(cpu)
        result.misplaced = [(op.index, op.opcode, _place(report.on_edgetpu(op.index)), _place(op.index not in cpu))
                            for op in plain.graph.operators if report.on_edgetpu(op.index) == (op.index in cpu)]
        result.seen_mapped = {op.opcode for op in plain.graph.operators if op.index not in cpu}
    if log is not None:
        theirs = log_table(parse("", log))
        mapped = sum(n for (_, status), n in theirs.items() if status == learned.MAPPED)
        if result.compiler_mapped >= 0 and mapped != result.compiler_mapped:
            raise NotATwin(f"the log maps {mapped} operators and the compiled file {result.compiler_mapped}")
        result.compiler_mapped = mapped
        ours = predicted_table(report, plain)
        if sum(theirs.values()) != total:
            raise NotATwin(f"the log counts {sum(theirs.values())} operators and the plain file has {total}")
        result.table_differences = {key: (ours[key], theirs[key]) for key in sorted(set(ours) | set(theirs))
                                    if ours[key] != theirs[key]}
    return result


def _place(on_edgetpu: bool) -> str:
    return "Edge TPU" if on_edgetpu else "CPU"


# ---- the measured set ------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Pair:
    """A plain int8 file and what the compiler made of it, as a public repository holds them."""

    name: str
    family: str
    repo: str                 # owner/name on GitHub
    commit: str
    plain: dict               # {"path", "sha256"}
    log: dict | None = None
    compiled: dict | None = None
    note: str = ""
    taught: list[str] = field(default_factory=list)  # the rules it was used to learn; [] if checked only afterwards

    def file(self, folder: Path, which: str) -> Path | None:
        """The file in FOLDER/OWNER/NAME/PATH, checked against its sha256 (ValueError when it differs)."""
        entry = getattr(self, which)
        if entry is None:
            return None
        path = folder / self.repo / entry["path"]
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        if digest != entry["sha256"]:
            raise ValueError(f"{path}: sha256 {digest}, the manifest says {entry['sha256']}")
        return path


def checkout_commands(folder: Path, pairs: list[Pair]) -> str:
    """Shell commands that put each repository at its commit under FOLDER/OWNER/NAME (a repository once)."""
    commands = []
    for repo, commit in dict.fromkeys((p.repo, p.commit) for p in pairs):
        target = folder / repo
        commands.append(f"git clone --filter=blob:none https://github.com/{repo} {target} 2>/dev/null || true; "
                        f"git -C {target} checkout --quiet {commit}")
    return "\n".join(commands)


def load_pairs(manifest: Path = MANIFEST) -> list[Pair]:
    return [Pair(**entry) for entry in json.loads(manifest.read_text())["pairs"]]


def measure(folder: Path, pairs: list[Pair]) -> list[tuple[Pair, Agreement | str]]:
    """Each pair's agreement, or why it could not be measured (a file missing or changed, not a twin)."""
    rows = []
    for pair in pairs:
        try:
            plain = read_tflite(pair.file(folder, "plain"))
            log_path, compiled_path = pair.file(folder, "log"), pair.file(folder, "compiled")
            rows.append((pair, compare(plain, log_path.read_text() if log_path else None,
                                       read_tflite(compiled_path) if compiled_path else None)))
        except (OSError, ValueError) as e:  # NotATwin, a sha256 or a file that is not a .tflite
            rows.append((pair, f"not measured: {e}"))
    return rows


def render(rows: list[tuple[Pair, Agreement | str]]) -> str:
    """One line per model: ops mapped by the compiler and by the analysis, and where they differ."""
    lines = [f"{'model':<50} {'family':<12} {'truth':<12} {'ops':>4} {'compiler':>8} {'ours':>5}  differences"]
    for pair, result in rows:
        truth = "+".join(kind for kind in ("log", "compiled") if getattr(pair, kind))
        if isinstance(result, str):
            lines.append(f"{pair.name:<50} {pair.family:<12} {truth:<12} {result}")
            continue
        lines.append(f"{pair.name:<50} {pair.family:<12} {truth:<12} {result.total:>4} {result.compiler_mapped:>8} "
                     f"{result.ours_mapped:>5}  {_differences(result)}")
    lines.append(_tally("all", rows))
    lines.append(_tally("checked only after the rules were written", [(p, r) for p, r in rows if not p.taught]))
    missing, unseen = seen_mapped_differences(rows)
    if missing or unseen:
        lines.append(f"compiler_limits.SEEN_MAPPED lacks {sorted(missing)}, and lists {sorted(unseen)} that no "
                     "compiled file here shows mapped")
    return "\n".join(lines)


def seen_mapped_differences(rows: list[tuple[Pair, Agreement | str]]) -> tuple[set[str], set[str]]:
    """(types the compiled files show mapped that SEEN_MAPPED lacks, types it lists that none shows)."""
    seen = set().union(*(r.seen_mapped for _, r in rows if not isinstance(r, str)))
    return seen - learned.SEEN_MAPPED, learned.SEEN_MAPPED - seen


def _tally(which: str, rows: list[tuple[Pair, Agreement | str]]) -> str:
    measured = [r for _, r in rows if not isinstance(r, str)]
    ops = sum(r.total for r in measured)
    same = sum(r.total - len(r.misplaced or ()) - _table_misses(r) for r in measured)
    agree = sum(r.agrees for r in measured)
    return (f"{which}: {agree} of {len(rows)} models agree exactly; {same} of {ops} operators placed as the "
            "compiler did")


def _table_misses(result: Agreement) -> int:
    """Operators a log-only comparison shows misplaced: the mapped counts' differences per type."""
    if result.misplaced is not None:
        return 0
    return sum(abs(ours - theirs) for (_, status), (ours, theirs) in result.table_differences.items()
               if status == learned.MAPPED)


def _differences(result: Agreement) -> str:
    if result.agrees:
        return "none"
    parts = [f"op {i} {opcode}: ours {a}, compiler {b}" for i, opcode, a, b in (result.misplaced or ())[:4]]
    parts += [f"{t} {s!r}: ours {o}, log {g}" for (t, s), (o, g) in list(result.table_differences.items())[:4]]
    return "; ".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m converter.compiler_agreement", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path, help="checkouts of the manifest's repositories, as FOLDER/OWNER/NAME")
    parser.add_argument("--manifest", type=Path, default=MANIFEST, help="the pairs (default: %(default)s)")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    parser.add_argument("--checkouts", action="store_true",
                        help="print the git commands that check each repository out under FOLDER, and stop")
    args = parser.parse_args(argv)
    if args.checkouts:
        print(checkout_commands(args.folder, load_pairs(args.manifest)))
        return 0
    rows = measure(args.folder, load_pairs(args.manifest))
    if args.json:
        print(json.dumps([dict(name=p.name, family=p.family, taught=p.taught,
                               **({"error": r} if isinstance(r, str) else r.as_dict())) for p, r in rows], indent=2))
    else:
        print(render(rows))
    agree = all(not isinstance(r, str) and r.agrees for _, r in rows)
    return 0 if agree and not any(seen_mapped_differences(rows)) else 1


if __name__ == "__main__":
    sys.exit(main())
