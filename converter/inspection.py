"""`python -m converter inspect`: the offline Edge TPU analysis (app.edgetpu.compat) as a table or JSON."""

from __future__ import annotations

from pathlib import Path

from app.edgetpu.compat import CompatReport

AFTER_PARTITION = "after the first unsupported op: runs on the CPU"
COMPILED_ELSEWHERE = "not part of the compiled Edge TPU op: runs on the CPU"


def table(report: CompatReport) -> str:
    """One line per operator: index, operator, where it runs, and why not on the Edge TPU."""
    width = max([len("operator")] + [len(v.opcode) for v in report.ops])
    lines = [f"{'index':>5}  {'operator':<{width}}  {'runs on':<8}  reason"]
    for verdict in report.ops:
        on_tpu = report.on_edgetpu(verdict.index)
        reason = verdict.reason or ""
        if not on_tpu and verdict.supported:
            reason = COMPILED_ELSEWHERE if report.compiled else AFTER_PARTITION
        place = "Edge TPU" if on_tpu else "CPU"
        lines.append(f"{verdict.index:>5}  {verdict.opcode:<{width}}  {place:<8}  {reason}".rstrip())
    return "\n".join(lines)


def render(report: CompatReport, path: Path) -> str:
    state = "compiled for the Edge TPU" if report.compiled else "not compiled"
    return f"{path}: {report.total} operators, {state}\n{table(report)}\n{report.summary()}"


def to_json_dict(report: CompatReport, path: Path) -> dict:
    return {"file": str(path), **report.to_dict()}
