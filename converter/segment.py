"""Cut a full-int8 model into K sequential segments, for a pipeline of K devices (or interpreters).

A model bigger than the Edge TPU's ~8 MB parameter cache streams the rest from the host on
every inference; cut into K segments, each on its own TPU, every part stays on chip and the
K devices work on K requests at once (Coral's `edgetpu_compiler --num_segments`, pycoral's
PipelinedModelRunner). This module makes the segments itself, without the compiler:

    whole model --cut after op j where exactly one tensor crosses--> segment 0 | segment 1 | ...

A cut point is an operator boundary where one non-constant tensor carries all live state:
on a branchy graph (residual ADDs) the cuts fall between blocks, never inside one. Every
segment is a plain int8 TFLite flatbuffer holding its operators, their constants, and the
cut tensors with their quantization unchanged, so the segments chained compute exactly what
the whole model computes (same kernels on the same tensors). The K-1 cuts are chosen among
the cut points to make the most expensive segment as cheap as possible: the pipeline runs at
the pace of its slowest segment.

Cost per operator: `converter.estimate.segment_costs(model_path)` (estimated Edge TPU ms per
operator) when that module is there; otherwise half its share of the model's MACs plus half
its share of the parameter bytes (`params_macs_costs`): an Edge TPU's time is compute and
moving parameters, and without a model of the hardware neither is known to dominate.

Example usage:

    python -m converter segment models/efficientnet_lite0 --segments 3 --out models/efficientnet_lite0_x3
    python -m converter segment models/efficientnet_lite0 --segments 2 --out /tmp/seg --compile
    python -m converter segment model_int8.tflite --segments 2 --out /tmp/parts   # a bare file: no model.json
    python -m converter segment models/big --out models/big_x4     # after `converter compile --num-segments 4`:
                                                                    # cut where Coral's compiler cut
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from app.detection_postprocess import POSTPROCESS_OP
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

def _check_cuttable(model: TfliteModel) -> None:
    graph = model.graph
    if len(model.subgraphs) != 1:
        raise SegmentError(f"the model has {len(model.subgraphs)} subgraphs (control flow); only a single-graph "
                           "model can be cut")
    if len(graph.inputs) != 1:
        raise SegmentError(f"the model has {len(graph.inputs)} inputs; a segmented model needs exactly one")
    if len(graph.outputs) != 1 and not any(op.opcode == POSTPROCESS_OP for op in graph.operators):
        raise SegmentError(f"the model has {len(graph.outputs)} outputs; a segmented model needs one, or a "
                           f"detector's {POSTPROCESS_OP} outputs (in its last segment)")


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
    _check_cuttable(model)
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


# ---- writing one segment ----------------------------------------------------------------------

def extract(source: bytes, part: SegmentPlan) -> bytes:
    """Operators first..last of the model as a model of their own (a valid int8 TFLite flatbuffer):
    their tensors (cut tensors keep name, shape and quantization), constants copied, the operator
    codes they use; input `part.input`, output `part.output`."""
    import copy

    import flatbuffers

    from app.tflite_file import schema

    s = schema()
    whole = s.ModelT.InitFromPackedBuf(source, 0)
    graph = whole.subgraphs[0]
    operators = graph.operators[part.first:part.last + 1]
    used: list[int] = []
    for op in operators:
        for t in [*(op.inputs if op.inputs is not None else []), *(op.outputs if op.outputs is not None else []),
                  *(op.intermediates if op.intermediates is not None else [])]:
            if t >= 0 and t not in used:
                used.append(int(t))
    for t in (part.input, *part.leaving):
        if t not in used:
            raise SegmentError(f"tensor {t} is not used by operators {part.first}..{part.last}")
    new_index = {old: new for new, old in enumerate(used)}
    buffers = [s.BufferT()]  # buffer 0: the empty one, by convention
    tensors = []
    for old in used:
        tensor = copy.copy(graph.tensors[old])
        buffer = whole.buffers[tensor.buffer] if tensor.buffer < len(whole.buffers) else None
        data = None if buffer is None else buffer.data
        if buffer is not None and (buffer.offset or 0) > 1 and buffer.size:
            # stored after the flatbuffer (ai-edge-quantizer's layout): written inline in the segment
            data = np.frombuffer(source, np.uint8, count=int(buffer.size), offset=int(buffer.offset))
        if data is not None and len(data):
            fresh = s.BufferT()
            fresh.data = data
            buffers.append(fresh)
            tensor.buffer = len(buffers) - 1
        else:
            tensor.buffer = 0
        tensors.append(tensor)
    codes, code_index = [], {}
    new_ops = []
    for op in operators:
        if op.opcodeIndex not in code_index:
            code_index[op.opcodeIndex] = len(codes)
            codes.append(whole.operatorCodes[op.opcodeIndex])
        fresh = copy.copy(op)
        fresh.opcodeIndex = code_index[op.opcodeIndex]
        fresh.inputs = [new_index[int(t)] if t >= 0 else -1 for t in op.inputs]
        fresh.outputs = [new_index[int(t)] for t in op.outputs]
        if op.intermediates is not None:
            fresh.intermediates = [new_index[int(t)] for t in op.intermediates]
        new_ops.append(fresh)
    sub = s.SubGraphT()
    sub.tensors, sub.operators, sub.name = tensors, new_ops, graph.name
    sub.inputs, sub.outputs = [new_index[part.input]], [new_index[t] for t in part.leaving]
    model = s.ModelT()
    model.version = whole.version
    model.description = f"segment of: {(whole.description or b'').decode('utf-8', 'replace')}"
    model.operatorCodes, model.subgraphs, model.buffers = codes, [sub], buffers
    metadata = []
    for entry in whole.metadata or []:  # e.g. min_runtime_version: a small string buffer, kept
        data = whole.buffers[entry.buffer].data
        if data is None or len(data) > 1024:
            continue
        fresh = s.BufferT()
        fresh.data = data
        buffers.append(fresh)
        kept = copy.copy(entry)
        kept.buffer = len(buffers) - 1
        metadata.append(kept)
    model.metadata = metadata or None
    builder = flatbuffers.Builder(max(1024, len(source) // 2))
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())


@dataclass(frozen=True)
class SegmentedModel:
    parts: list[SegmentPlan]
    files: list[bytes]
    cost_kind: str
    names: list[tuple[str, str]]  # (input tensor name, output tensor name) per segment


def segment_bytes(source: bytes, model_path: Path, k: int | None, at: list[str] | None = None) -> SegmentedModel:
    """Cut the model: at the named tensors if given, else balanced over k segments."""
    model = read_tflite(source)
    _check_cuttable(model)
    graph = model.graph
    made_by = {t: op.opcode for op in graph.operators for t in op.outputs}
    for t in graph.tensors:
        # a float output of the host's post-processing (a detector's) is the model's answer, not a float model
        host_output = t.index in graph.outputs and made_by.get(t.index) in HOST_TAIL_OPS
        if not t.is_constant and t.type == "FLOAT32" and t.index in (*graph.inputs, *graph.outputs) and not host_output:
            raise SegmentError(f"tensor {t.name!r} is float32: segment a full-integer model")
    costs, kind = op_costs(model_path, model)
    if at is not None:
        chosen = cuts_at(model, at)
        if k is not None and len(chosen) + 1 != k:
            raise SegmentError(f"{len(chosen)} cut tensors make {len(chosen) + 1} segments, not {k}")
    else:
        chosen = balance(costs, cut_points(model), k or 1)
    parts = plan(model, costs, chosen)
    tensors = model.graph.tensors
    return SegmentedModel(parts, [extract(source, p) for p in parts], kind,
                          [(tensors[p.input].name, tensors[p.output].name) for p in parts])


# ---- Coral's own segments ------------------------------------------------------------------------

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


# ---- the model directory ------------------------------------------------------------------------

def segment_filename(stem: str, i: int, k: int, compiled: bool = False) -> str:
    """<stem>_segment_<i>_of_<k>.tflite; compiled: Coral's <stem>_segment_<i>_of_<k>_edgetpu.tflite."""
    return f"{stem}_segment_{i}_of_{k}{'_edgetpu' if compiled else ''}.tflite"


def segment_model_dir(source: Path, out: Path, k: int | None, at: list[str] | None = None,
                      compiler: Path | None = None, compile_segments: bool = False,
                      check_compiler_version: bool = True, command: str = "", progress=None) -> Path:
    """Segment models/<name> (or a bare .tflite) into the directory `out`; returns it.

    A model directory gives a model directory (model.json lists the segments, labels copied,
    input spec the same); a bare .tflite gives the segment files and segments.json. A model
    directory compiled with `converter compile --num-segments N` is cut where Coral's compiler
    cut, and its compiled segments are kept as the Edge TPU files."""
    from app.model_dir import (
        INT8,
        LABELS,
        MANIFEST,
        Build,
        EdgeTpuCompile,
        Segment,
        Segments,
        add_files,
        read_model_dir,
        segment_kind,
        sha256_file,
        write_model_dir,
    )
    from converter.writing import tool_versions

    say = progress or (lambda message: None)
    out = Path(out)
    source = Path(source)
    if source.is_file():
        return _segment_bare_file(source, out, k, at)
    model = read_model_dir(source)
    if model.manifest.segments is not None:
        raise SegmentError(f"{source} is already segmented ({model.manifest.segments.count} segments); segment "
                           f"the whole model it was cut from ({model.manifest.segments.source}) instead")
    int8_path = model.file(INT8)
    coral = coral_segments([model.path / e.path for kind, e in model.manifest.files.items()
                            if kind.startswith("edgetpu_segment_")])
    if coral and at is None and not compile_segments:
        at = coral_cut_names(coral)
        if k is not None and k != len(coral):
            raise SegmentError(f"{model.name} was compiled into {len(coral)} segments by edgetpu_compiler; ask for "
                               f"--segments {len(coral)}, or --compile to compile {k} segments of its own")
        say(f"cutting where edgetpu_compiler cut: {at}")
    elif k is None and at is None:
        raise SegmentError("--segments K is needed (the model directory has no compiled segments to follow)")
    result = segment_bytes(int8_path.read_bytes(), int8_path, k, at)
    names = {t.index: t.name for t in read_tflite(int8_path).graph.tensors}
    count = len(result.parts)
    stem = int8_path.stem
    files = {segment_kind(INT8, i): (segment_filename(stem, i, count), data) for i, data in enumerate(result.files)}
    if model.has(LABELS):
        labels = model.file(LABELS)
        files[LABELS] = (labels.name, labels.read_bytes())
    if coral and not compile_segments:
        for i, path in enumerate(coral):
            files[segment_kind("edgetpu", i)] = (path.name, path.read_bytes())
    elif compile_segments:
        compiled = []
        for i, data in enumerate(result.files):
            say(f"compiling segment {i} of {count}...")
            compiled.append(compile_segment(data, segment_filename(stem, i, count), compiler, check_compiler_version))
            files[segment_kind("edgetpu", i)] = (segment_filename(stem, i, count, compiled=True), compiled[-1].data)
    if at is None:
        chosen_by = result.cost_kind
    else:
        chosen_by = "edgetpu_compiler's own cuts" if coral and not compile_segments else "the named cut tensors"
    segments = Segments(
        source=int8_path.name, source_sha256=sha256_file(int8_path), balanced_by=chosen_by,
        items=[Segment(input=i_name, output=o_name, operators=p.last - p.first + 1, first_operator=p.first,
                       cost=round(p.cost, 6), outputs=[names[t] for t in p.outputs] if p.outputs else None)
               for p, (i_name, o_name) in zip(result.parts, result.names)])
    data = model.manifest.model_dump(mode="json", by_alias=True, exclude_none=True)
    for stale in ("files", "edgetpu_compile", "segments"):
        data.pop(stale, None)
    data["name"] = out.name
    data["description"] = f"{model.manifest.description} -- in {count} segments for a pipeline of {count} devices"
    data["segments"] = segments.model_dump(mode="json")
    if compile_segments:  # the compiler's record, as `converter compile` writes it: one report per segment
        data["edgetpu_compile"] = EdgeTpuCompile(
            command=compiled[0].command, compiler_version=compiled[0].compiler_version,
            min_runtime_version=compiled[0].min_runtime_version,
            model_min_runtime_version=max((c.model_min_runtime_version or 0) for c in compiled) or None,
            int8_sha256=segments.source_sha256, segments=count, report=compiled[0].report,
            offline_analysis=data.get("edgetpu_analysis") or "", segment_reports=[c.report for c in compiled],
        ).model_dump(mode="json", exclude_none=True)
    data["build"] = Build(command=command or f"python -m converter segment {source} --segments {count} --out {out}",
                          tools=tool_versions("ai-edge-litert", "flatbuffers", "numpy"),
                          segmented_from=model.name).model_dump(mode="json")
    if (out / MANIFEST).is_file():  # segmented again: the new segments replace the old ones, whole
        previous = read_model_dir(out)
        if previous.manifest.segments is None:
            raise SegmentError(f"{out} holds a whole model, not segments: choose a new --out")
        stale = tuple(kind for kind in previous.manifest.files if kind not in files)
        add_files(out, files, remove=stale, **{key: value for key, value in data.items() if key != "name"})
        return out
    if out.exists():
        raise SegmentError(f"{out} exists and is not a model directory: choose a new --out")
    return write_model_dir(out.parent, data, files)


def _segment_bare_file(source: Path, out: Path, k: int | None, at: list[str] | None) -> Path:
    from app.model_dir import sha256_file

    if k is None and at is None:
        raise SegmentError("--segments K is needed")
    result = segment_bytes(source.read_bytes(), source, k, at)
    out.mkdir(parents=True, exist_ok=True)
    count = len(result.parts)
    listing = []
    for i, (data, part, (i_name, o_name)) in enumerate(zip(result.files, result.parts, result.names)):
        name = segment_filename(source.stem, i, count)
        (out / name).write_bytes(data)
        listing.append({"file": name, "input": i_name, "output": o_name, "first_operator": part.first,
                        "operators": part.last - part.first + 1, "cost": round(part.cost, 6)})
    (out / "segments.json").write_text(json.dumps(
        {"source": source.name, "source_sha256": sha256_file(source), "balanced_by": result.cost_kind,
         "segments": listing}, indent=2) + "\n")
    return out


@dataclass(frozen=True)
class CompiledSegment:
    data: bytes
    command: str            # as run, the compiler named without its directory
    compiler_version: str
    min_runtime_version: int  # the -m passed
    model_min_runtime_version: int | None
    report: dict            # converter.compiler_log.CompilerReport.as_dict()


def compile_segment(data: bytes, name: str, compiler: Path | None,
                    check_compiler_version: bool = True) -> CompiledSegment:
    """One segment through edgetpu_compiler, with converter/compile.py's checks (pinned version,
    something mapped, runtime no newer than the pinned libedgetpu's)."""
    import shlex
    import tempfile

    from app.edgetpu.compiled_model import read_compiled_model
    from app.edgetpu.versions import compiler_pin
    from converter import compile as edgetpu_compile
    from converter import compiler_log

    pin = compiler_pin()
    executable = edgetpu_compile.find_compiler(compiler)
    version = edgetpu_compile.compiler_version(executable)
    if check_compiler_version:
        edgetpu_compile.check_version(version, pin)
    options = edgetpu_compile.CompileOptions()
    with tempfile.TemporaryDirectory(prefix="edgetpu-segment-") as tmp:
        work = Path(tmp)
        (work / name).write_bytes(data)
        (work / "out").mkdir()
        cmd = edgetpu_compile.command(executable, Path(name), Path("out"), pin.min_runtime_version, options)
        done = edgetpu_compile.run_compiler(cmd, work, options)
        output = work / "out" / f"{Path(name).stem}_edgetpu.tflite"
        if not output.is_file():
            raise edgetpu_compile.CompilerFailed(f"{executable.name} exited 0 but did not write {output.name}",
                                                 done.stdout, done.stderr, done.returncode)
        compiled = read_compiled_model(output)
        if compiled.edgetpu_ops == 0:
            raise edgetpu_compile.NothingMapped(f"{executable.name} mapped no operator of {name} to the Edge TPU",
                                                done.stdout, done.stderr, done.returncode)
        if (compiled.min_runtime_version or 0) > pin.min_runtime_version:
            raise edgetpu_compile.CompilerFailed(
                f"{name} compiled for Edge TPU runtime {compiled.min_runtime_version}, the pinned libedgetpu has "
                f"{pin.min_runtime_version}", done.stdout, done.stderr, done.returncode)
        log = output.with_suffix(".log")
        report = compiler_log.parse(done.stdout, log.read_text(errors="replace") if log.is_file() else None)
        return CompiledSegment(output.read_bytes(), shlex.join([executable.name, *cmd[1:]]), version,
                               pin.min_runtime_version, compiled.min_runtime_version, report.as_dict())
