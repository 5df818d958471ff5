"""Where a model can be cut into K sequential segments, and what each segment costs: the analysis behind
`python -m converter segment` (converter/segment.py writes the segments this module plans).

A cut point is an operator boundary where one non-constant tensor carries all live state:
on a branchy graph (residual ADDs) the cuts fall between blocks, never inside one. The K-1
cuts are chosen among the cut points to make the most expensive segment as cheap as possible:
the pipeline runs at the pace of its slowest segment.

Cost per operator: `converter.estimate.segment_costs(model_path)` (estimated Edge TPU ms per
operator) when that module is there; otherwise half its share of the model's MACs plus half
its share of the parameter bytes (`params_macs_costs`): an Edge TPU's time is compute and
moving parameters, and without a model of the hardware neither is known to dominate.

A model directory compiled with `converter compile --num-segments N` holds Coral's own segments:
`coral_cut_names` says where edgetpu_compiler cut, so the plain segments can be cut there too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from app.detection_postprocess import POSTPROCESS_OP, postprocess_ops
from app.edgetpu.compat import HOST_TAIL_OPS
from app.tflite_file import TfliteModel, read_tflite

COST_ESTIMATE = "estimated Edge TPU ms per operator (converter.estimate.segment_costs)"
COST_PARAMS_MACS = "half MACs share + half parameter-bytes share per operator (no estimate available)"
CORAL_SEGMENT = re.compile(r"_segment_(\d+)_of_(\d+)_edgetpu\.tflite$")


class SegmentError(Exception):
    """The model cannot be cut as asked; the message says why and what would work."""


@dataclass(frozen=True)
class Cut:
    """A boundary after operator `after` where tensor `tensor` alone crosses."""

    after: int
    tensor: int
    name: str


@dataclass(frozen=True)
class SegmentPlan:
    """One segment: a run of operators, the one tensor entering it and what leaves it."""

    first: int      # first operator index (inclusive)
    last: int       # last operator index (inclusive)
    input: int      # tensor entering (the model's input for the first)
    output: int     # tensor leaving (the model's first output for the last)
    cost: float
    outputs: tuple[int, ...] = ()  # the last segment: every output of the model, in its order

    @property
    def leaving(self) -> tuple[int, ...]:
        return self.outputs or (self.output,)


# ---- where a model can be cut ---------------------------------------------------------------

def check_cuttable(model: TfliteModel) -> None:
    """SegmentError unless the model is one graph with one input, and one output or a detector's outputs."""
    graph = model.graph
    if len(model.subgraphs) != 1:
        raise SegmentError(f"the model has {len(model.subgraphs)} subgraphs (control flow); only a single-graph "
                           "model can be cut")
    if len(graph.inputs) != 1:
        raise SegmentError(f"the model has {len(graph.inputs)} inputs; a segmented model needs exactly one")
    if len(graph.outputs) != 1 and not postprocess_ops(graph):
        raise SegmentError(f"the model has {len(graph.outputs)} outputs; a segmented model needs one, or a "
                           f"detector's {POSTPROCESS_OP} outputs (in its last segment)")


def check_full_integer(model: TfliteModel) -> None:
    """SegmentError when the model's input or an output is float32: each segment must be an int8 model. A float output
    of the host's post-processing (a detector's boxes and scores) is the model's answer, not a float model."""
    graph = model.graph
    made_by = {t: op.opcode for op in graph.operators for t in op.outputs}
    for t in graph.tensors:
        host_output = t.index in graph.outputs and made_by.get(t.index) in HOST_TAIL_OPS
        if not t.is_constant and t.type == "FLOAT32" and t.index in (*graph.inputs, *graph.outputs) and not host_output:
            raise SegmentError(f"tensor {t.name!r} is float32: segment a full-integer model")


def _live_ranges(model: TfliteModel) -> dict[int, tuple[int, int]]:
    """Non-constant tensor -> (operator producing it, last operator reading it); the model's
    input counts as produced at -1, its output as read after the last operator."""
    graph = model.graph
    n = len(graph.operators)
    produced = {t: -1 for t in graph.inputs}
    last_read: dict[int, int] = {}
    for op in graph.operators:
        for t in op.outputs:
            produced[t] = op.index
        for t in op.inputs:
            if t >= 0 and not graph.tensors[t].is_constant:
                last_read[t] = op.index
    for t in graph.outputs:
        last_read[t] = n
    return {t: (produced[t], last_read[t]) for t in produced if t in last_read}


def cut_points(model: TfliteModel) -> list[Cut]:
    """Every operator boundary where exactly one tensor (8-bit, quantized) carries all live state."""
    check_cuttable(model)
    graph = model.graph
    ranges = _live_ranges(model)
    cuts = []
    for j in range(len(graph.operators) - 1):
        crossing = [t for t, (born, dies) in ranges.items() if born <= j < dies]
        if len(crossing) != 1:
            continue
        tensor = graph.tensors[crossing[0]]
        if tensor.type not in ("INT8", "UINT8") or tensor.quantization is None:
            continue  # a float or unquantized tensor between segments would not be an int8 model
        cuts.append(Cut(j, tensor.index, tensor.name))
    return cuts


# ---- what each operator costs -------------------------------------------------------------

def params_and_macs(model: TfliteModel) -> list[tuple[int, int]]:
    """(parameter bytes, multiply-accumulates) per operator, in execution order."""
    graph = model.graph
    out = []
    for op in graph.operators:
        inputs = [graph.tensors[t] for t in op.inputs if t >= 0]
        params = sum(t.data.nbytes for t in inputs if t.is_constant)
        outputs = [graph.tensors[t] for t in op.outputs]
        out_elements = sum(int(np.prod(t.shape)) for t in outputs)
        weights = next((t for t in inputs[1:2] if t.is_constant), None)
        if op.opcode == "CONV_2D" and weights is not None:          # (O, kh, kw, I)
            macs = out_elements * int(np.prod(weights.shape[1:]))
        elif op.opcode == "DEPTHWISE_CONV_2D" and weights is not None:  # (1, kh, kw, C): one tap per output
            macs = out_elements * weights.shape[1] * weights.shape[2]
        elif op.opcode == "FULLY_CONNECTED" and weights is not None:    # (O, I)
            macs = out_elements * weights.shape[-1]
        else:  # elementwise, pooling, reshapes: about one operation per output value
            macs = out_elements
        out.append((params, macs))
    return out


def params_macs_costs(model: TfliteModel) -> list[float]:
    """Half the operator's share of all MACs plus half its share of all parameter bytes."""
    pairs = params_and_macs(model)
    total_params = sum(p for p, _ in pairs) or 1
    total_macs = sum(m for _, m in pairs) or 1
    return [0.5 * m / total_macs + 0.5 * p / total_params for p, m in pairs]


def op_costs(model_path: Path, model: TfliteModel) -> tuple[list[float], str]:
    """Cost per operator in execution order, and what it is: the Edge TPU estimate when
    converter.estimate offers one, else parameters and MACs."""
    try:
        from converter.estimate import segment_costs
    except ImportError:
        segment_costs = None
    if segment_costs is not None:
        try:
            costs = [float(c) for c in segment_costs(model_path)]
        except Exception:  # noqa: BLE001 -- a model the estimate cannot take is balanced by MACs and parameters
            costs = []
        if len(costs) == len(model.graph.operators):
            return costs, COST_ESTIMATE
    return params_macs_costs(model), COST_PARAMS_MACS


# ---- choosing the cuts --------------------------------------------------------------------

def balance(costs: list[float], cuts: list[Cut], k: int) -> list[Cut]:
    """The k-1 cuts that make the most expensive of the k segments the cheapest (ties: the
    smaller sum of squared segment costs, i.e. the more even split). Exact: dynamic programming
    over the cut points (tens of them in a classifier)."""
    if k == 1:
        return []
    if len(cuts) < k - 1:
        raise SegmentError(f"{k} segments need {k - 1} cut points, the model has {len(cuts)} "
                           f"(operator boundaries where one tensor alone crosses); ask for at most {len(cuts) + 1}")
    prefix = np.concatenate([[0.0], np.cumsum(costs)])
    n = len(costs)
    ends = [c.after for c in cuts] + [n - 1]  # a segment ends at a cut or at the last operator

    def seg(a: int, b: int) -> float:  # operators a..b inclusive
        return float(prefix[b + 1] - prefix[a])

    # best[m][e]: (max, sum of squares, cuts) for the first m segments ending at ends[e]
    best: list[dict[int, tuple[float, float, tuple[int, ...]]]] = [dict() for _ in range(k + 1)]
    for e, end in enumerate(ends[:-1]):
        c = seg(0, end)
        best[1][e] = (c, c * c, (e,))
    for m in range(2, k + 1):
        targets = [len(ends) - 1] if m == k else range(len(ends) - 1)
        for e in targets:
            candidates = []
            for p, (worst, squares, chosen) in best[m - 1].items():
                if ends[p] >= ends[e]:
                    continue
                c = seg(ends[p] + 1, ends[e])
                candidates.append((max(worst, c), squares + c * c, chosen + (e,)))
            if candidates:
                best[m][e] = min(candidates)
    final = best[k].get(len(ends) - 1)
    if final is None:
        raise SegmentError(f"cannot make {k} non-empty segments")
    return [cuts[e] for e in final[2][:-1]]


def plan(model: TfliteModel, costs: list[float], chosen: list[Cut]) -> list[SegmentPlan]:
    """The segments the chosen cuts make: their operators, the tensors at their ends, their cost."""
    graph = model.graph
    bounds = [-1] + [c.after for c in chosen] + [len(graph.operators) - 1]
    tensors = [graph.inputs[0]] + [c.tensor for c in chosen] + [graph.outputs[0]]
    last = len(bounds) - 2
    return [SegmentPlan(bounds[i] + 1, bounds[i + 1], tensors[i], tensors[i + 1],
                        float(sum(costs[bounds[i] + 1:bounds[i + 1] + 1])),
                        tuple(graph.outputs) if i == last and len(graph.outputs) > 1 else ())
            for i in range(len(bounds) - 1)]


def cuts_at(model: TfliteModel, names: list[str]) -> list[Cut]:
    """The cut points at the named tensors (Coral's segments, or --at), in order."""
    by_name = {c.name: c for c in cut_points(model)}
    missing = [n for n in names if n not in by_name]
    if missing:
        raise SegmentError(f"no cut point at tensor(s) {missing}: a cut needs a tensor that alone carries all live "
                           f"state; the cut points are {sorted(by_name, key=lambda n: by_name[n].after)}")
    chosen = [by_name[n] for n in names]
    if [c.after for c in chosen] != sorted({c.after for c in chosen}):
        raise SegmentError(f"cut tensors {names} are not in execution order (or repeat)")
    return chosen




# ---- where Coral's compiler cut ------------------------------------------------------------------

def coral_segments(files: list[Path]) -> list[Path]:
    """Coral's `--num_segments` output files (<stem>_segment_<i>_of_<n>_edgetpu.tflite) in order."""
    indexed = []
    for path in files:
        match = CORAL_SEGMENT.search(path.name)
        if match:
            indexed.append((int(match[1]), int(match[2]), path))
    if not indexed:
        return []
    counts = {n for _, n, _ in indexed}
    if len(counts) != 1 or sorted(i for i, _, _ in indexed) != list(range(counts.pop())):
        raise SegmentError(f"incomplete or mixed Coral segments: {sorted(p.name for _, _, p in indexed)}")
    return [p for _, _, p in sorted(indexed)]


def coral_cut_names(compiled: list[Path]) -> list[str]:
    """The tensors where Coral's compiler cut: each segment's output but the last's, checked
    against the next segment's input."""
    names = []
    for a, b in zip(compiled, compiled[1:]):
        out_a, in_b = _io_names(a)[1], _io_names(b)[0]
        if out_a != in_b:
            raise SegmentError(f"{a.name} outputs {out_a!r} but {b.name} takes {in_b!r}: not one pipeline")
        names.append(out_a)
    return names


def _io_names(path: Path) -> tuple[str, str]:
    graph = read_tflite(path).graph
    if len(graph.inputs) != 1 or len(graph.outputs) != 1:
        raise SegmentError(f"{path.name}: a segment needs one input and one output tensor")
    return graph.tensors[graph.inputs[0]].name, graph.tensors[graph.outputs[0]].name
