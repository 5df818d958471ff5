"""What edgetpu_compiler says about a compilation: its stdout summary and its `<name>_edgetpu.log`.

The compiler (16.0) prints, on success:

    Edge TPU Compiler version 16.0.384591198
    Started a compilation timeout timer of 180 seconds.

    Model compiled successfully in 35 ms.

    Input model: m_int8.tflite
    Input size: 25.99KiB
    Output model: out/m_int8_edgetpu.tflite
    Output size: 99.94KiB
    On-chip memory used for caching model parameters: 322.25KiB
    On-chip memory remaining for caching model parameters: 7.65MiB
    Off-chip memory used for streaming uncached model parameters: 0.00B
    Number of Edge TPU subgraphs: 1
    Total number of operations: 29
    Operation log: out/m_int8_edgetpu.log

and, when part of the model stays on the CPU, a paragraph saying so followed by
"Number of operations that will run on Edge TPU: N" / "... on CPU: M". With -s it also prints
the operator table, which the .log file always holds in full:

    Operator                       Count      Status

    CONV_2D                        2          Mapped to Edge TPU
    DEQUANTIZE                     1          Operation is working on an unsupported data type

An operator type can appear on several lines, one per status (some CONV_2D mapped, later ones
"More than one subgraph is not supported"). Sizes are printed with binary units (B, KiB, MiB).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field

MAPPED = "Mapped to Edge TPU"
UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}

_VERSION = re.compile(r"Edge TPU Compiler version (\S+)")
_SIZE = r"([0-9.]+)\s*(B|KiB|MiB|GiB)"
_FIELDS = {
    "on_chip_memory_used": re.compile(r"On-chip memory used for caching model parameters:\s*" + _SIZE),
    "on_chip_memory_remaining": re.compile(r"On-chip memory remaining for caching model parameters:\s*" + _SIZE),
    "off_chip_memory_used": re.compile(r"Off-chip memory used for streaming uncached model parameters:\s*" + _SIZE),
}
_COUNTS = {
    "edgetpu_subgraphs": re.compile(r"Number of Edge TPU subgraphs:\s*(\d+)"),
    "total_operations": re.compile(r"Total number of operations:\s*(\d+)"),
    "operations_on_edgetpu": re.compile(r"Number of operations that will run on Edge TPU:\s*(\d+)"),
    "operations_on_cpu": re.compile(r"Number of operations that will run on CPU:\s*(\d+)"),
}
_COMPILE_MS = re.compile(r"compiled successfully in (\d+) ms")
_TABLE_HEADER = re.compile(r"^\s*Operator\s+Count\s+Status\s*$")
_TABLE_ROW = re.compile(r"^(\S+)\s+(\d+)\s+(\S.*?)\s*$")


class CompilerLogError(ValueError):
    """The text is not in the compiler's format."""


@dataclass(frozen=True)
class OperatorLine:
    """One line of the operator table: `count` operators of `type` with this status."""

    type: str
    count: int
    status: str

    @property
    def mapped(self) -> bool:
        return self.status == MAPPED


@dataclass
class CompilerReport:
    compiler_version: str | None
    operators: list[OperatorLine]
    compile_ms: int | None = None
    # memory for the model's parameters, as printed and in bytes (the printed value is rounded)
    memory: dict[str, dict] = field(default_factory=dict)
    edgetpu_subgraphs: int | None = None
    total_operations: int | None = None
    operations_on_edgetpu: int = 0
    operations_on_cpu: int = 0

    @property
    def all_mapped(self) -> bool:
        return self.operations_on_cpu == 0 and self.operations_on_edgetpu > 0

    def unmapped(self) -> list[OperatorLine]:
        return [line for line in self.operators if not line.mapped]

    def as_dict(self) -> dict:
        data = asdict(self)
        data["operators"] = [dict(asdict(line), mapped=line.mapped) for line in self.operators]
        return data


def size_bytes(value: str, unit: str) -> int:
    """'4.49', 'MiB' -> 4708106 (the compiler rounds to 2 decimals, so this is as exact as the text)."""
    return round(float(value) * UNITS[unit])


def parse_version(text: str) -> str | None:
    found = _VERSION.search(text or "")
    return found.group(1) if found else None


def parse_operator_table(text: str) -> tuple[list[OperatorLine], bool]:
    """The rows after the "Operator Count Status" header, and whether the table is complete.

    With -s the compiler prints only the unmapped rows when the table is long and ends with
    "... All other operators were mapped successfully. See <log>.": not complete.
    """
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if _TABLE_HEADER.match(line)), None)
    if start is None:
        return [], False
    rows = []
    for line in lines[start + 1:]:
        if not line.strip():
            if rows:
                break
            continue
        match = _TABLE_ROW.match(line)
        if match is None:
            return rows, not line.lstrip().startswith("...")
        rows.append(OperatorLine(match.group(1), int(match.group(2)), match.group(3)))
    return rows, True


def parse(stdout: str, log: str | None = None) -> CompilerReport:
    """The report of one compilation from the compiler's stdout and its .log (preferred for the table)."""
    text = stdout or ""
    version = parse_version(text) or parse_version(log or "")
    operators, complete = parse_operator_table(log) if log else ([], False)
    if not operators:
        operators, complete = parse_operator_table(text)
    if version is None and not operators:
        raise CompilerLogError("no 'Edge TPU Compiler version' line and no operator table: not edgetpu_compiler output")
    report = CompilerReport(compiler_version=version, operators=operators)
    found = _COMPILE_MS.search(text)
    report.compile_ms = int(found.group(1)) if found else None
    for key, pattern in _FIELDS.items():
        match = pattern.search(text)
        if match:
            report.memory[key] = {"text": f"{match.group(1)}{match.group(2)}",
                                  "bytes": size_bytes(match.group(1), match.group(2))}
    counts = {key: int(m.group(1)) for key, pattern in _COUNTS.items() if (m := pattern.search(text))}
    report.edgetpu_subgraphs = counts.get("edgetpu_subgraphs")
    report.total_operations = counts.get("total_operations")
    # A complete table is the full account; the stdout counts appear only when something stays on the CPU.
    table_tpu = sum(line.count for line in operators if line.mapped)
    table_cpu = sum(line.count for line in operators if not line.mapped)
    report.operations_on_edgetpu = counts.get("operations_on_edgetpu", table_tpu)
    report.operations_on_cpu = counts.get("operations_on_cpu", table_cpu)
    if complete and operators and (table_tpu, table_cpu) != (report.operations_on_edgetpu, report.operations_on_cpu):
        raise CompilerLogError(
            f"the operator table counts {table_tpu} ops on the Edge TPU and {table_cpu} on the CPU, the summary "
            f"{report.operations_on_edgetpu} and {report.operations_on_cpu}")
    return report
