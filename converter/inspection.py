"""`python -m converter inspect`: the offline Edge TPU analysis (app.edgetpu.compat) as a table or JSON."""

from __future__ import annotations

from pathlib import Path

from app.edgetpu.compat import CompatReport

UNSURE_MARK = "unsure: "


def table(report: CompatReport) -> str:
    """One line per operator: index, operator, where it runs, and why not on the Edge TPU (or why that is unsure)."""
    width = max([len("operator")] + [len(v.opcode) for v in report.ops])
    unsure = {v.index: v.unsure for v in report.unsure}
    lines = [f"{'index':>5}  {'operator':<{width}}  {'runs on':<8}  reason"]
    for op in report.to_dict()["ops"]:
        place = "Edge TPU" if op["on_edgetpu"] else "CPU"
        reason = report.placement(op["index"]) or (UNSURE_MARK + unsure[op["index"]] if op["index"] in unsure else "")
        lines.append(f"{op['index']:>5}  {op['opcode']:<{width}}  {place:<8}  {reason}".rstrip())
    return "\n".join(lines)


def render(report: CompatReport, path: Path) -> str:
    state = "compiled for the Edge TPU" if report.compiled else "not compiled"
    return (f"{path}: {report.total} operators, {state}\n{table(report)}\n{advice(report)}{doubts(report)}"
            f"{report.summary()}")


def advice(report: CompatReport) -> str:
    """What to change for more of the model to map, a paragraph per trap found, before the summary; "" when there is
    nothing to say (no heading without a paragraph under it). A compiled file's traps are changes to the model it was
    compiled from."""
    parts = [f"{a.topic}: {a.finding}.\n" + (f"  change: {a.change}.\n" if a.change.strip() else "") +
             (f"  source: {a.source}\n" if a.source.strip() else "")
             for a in report.advice if a.finding.strip()]
    if not parts:
        return ""
    heading = "what to change (in the model, then compile it again):" if report.compiled else "what to change:"
    return f"\n{heading}\n" + "".join(parts) + "\n"


def doubts(report: CompatReport) -> str:
    """How many Edge TPU placements rest on verdicts no measured compiler output confirms ("" for none)."""
    count = len(report.unsure)
    if not count:
        return ""
    return (f"unsure: {count} op{'s' if count > 1 else ''} placed on the Edge TPU on a verdict no compiler log or "
            "compiled file confirms (marked 'unsure:' above; docs/edgetpu-compiler.md)\n")


def to_json_dict(report: CompatReport, path: Path) -> dict:
    return {"file": str(path), **report.to_dict()}
