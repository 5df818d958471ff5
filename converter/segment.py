"""Cut a full-int8 model into K sequential segments, for a pipeline of K devices (or interpreters).

A model bigger than the Edge TPU's ~8 MB parameter cache streams the rest from the host on
every inference; cut into K segments, each on its own TPU, every part stays on chip and the
K devices work on K requests at once (Coral's `edgetpu_compiler --num_segments`, pycoral's
PipelinedModelRunner). The converter makes the segments itself, without the compiler:

    whole model --cut after op j where exactly one tensor crosses--> segment 0 | segment 1 | ...

converter/segment_plan.py decides where to cut (the cut points, each operator's cost, the
balanced choice of cuts). This module writes what it planned: each segment as a plain int8
TFLite flatbuffer holding its operators, their constants, and the cut tensors with their
quantization unchanged, so the segments chained compute exactly what the whole model computes
(same kernels on the same tensors); then the model directory that lists them, and with
--compile each segment through edgetpu_compiler.

Example usage:

    python -m converter segment models/efficientnet_lite0 --segments 3 --out models/efficientnet_lite0_x3
    python -m converter segment models/efficientnet_lite0 --segments 2 --out /tmp/seg --compile
    python -m converter segment model_int8.tflite --segments 2 --out /tmp/parts   # a bare file: no model.json
    python -m converter segment models/big --out models/big_x4     # after `converter compile --num-segments 4`:
                                                                    # cut where Coral's compiler cut
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import flatbuffers
import numpy as np

from app.model_dir.reading import ModelDir, read_model_dir, sha256_file
from app.model_dir.records import EdgeTpuCompile
from app.model_dir.schema import INT8, LABELS, MANIFEST, Build, Segment, Segments, segment_kind
from app.tflite_file import read_tflite, schema
from converter.model_dir import add_files, write_model_dir
from converter.segment_plan import (
    SegmentError,
    SegmentPlan,
    balance,
    check_cuttable,
    check_full_integer,
    coral_cut_names,
    coral_segments,
    cut_points,
    cuts_at,
    op_costs,
    plan,
)
from converter.writing import tool_versions


# ---- one segment's file: flatbuffer surgery -----------------------------------------------------

def extract(source: bytes, part: SegmentPlan) -> bytes:
    """Operators first..last of the model as a model of their own (a valid int8 TFLite flatbuffer):
    their tensors (cut tensors keep name, shape and quantization), constants copied, the operator
    codes they use; input `part.input`, output `part.output`."""
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
    """A model cut as planned: each segment's plan and its file's bytes, and how the cuts were chosen."""

    parts: list[SegmentPlan]
    files: list[bytes]
    cost_kind: str
    names: list[tuple[str, str]]  # (input tensor name, output tensor name) per segment


def segment_bytes(source: bytes, model_path: Path, k: int | None, at: list[str] | None = None) -> SegmentedModel:
    """Cut the model: at the named tensors if given, else balanced over k segments."""
    model = read_tflite(source)
    check_cuttable(model)
    check_full_integer(model)
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
    keep_coral = bool(coral) and not compile_segments  # Coral's compiled segments stay the Edge TPU files
    if keep_coral and at is None:
        at = _follow_coral(model.name, coral, k, say)
    elif k is None and at is None:
        raise SegmentError("--segments K is needed (the model directory has no compiled segments to follow)")
    result = segment_bytes(int8_path.read_bytes(), int8_path, k, at)
    compile_one = (partial(compile_segment, compiler=compiler, check_compiler_version=check_compiler_version)
                   if compile_segments else None)
    files, compiled = _segment_files(model, int8_path, result, coral if keep_coral else [], compile_one, say)
    if at is None:
        chosen_by = result.cost_kind
    else:
        chosen_by = "edgetpu_compiler's own cuts" if keep_coral else "the named cut tensors"
    data = _segmented_manifest(model, int8_path, result, chosen_by, compiled, out,
                               command or f"python -m converter segment {source} --segments {len(result.parts)} "
                                          f"--out {out}")
    return _write_segmented_dir(out, data, files)


def _follow_coral(name: str, coral: list[Path], k: int | None, say: Callable[[str], None]) -> list[str]:
    """The tensors where Coral's compiler cut the model directory's compiled segments, to cut the int8 model there."""
    at = coral_cut_names(coral)
    if k is not None and k != len(coral):
        raise SegmentError(f"{name} was compiled into {len(coral)} segments by edgetpu_compiler; ask for "
                           f"--segments {len(coral)}, or --compile to compile {k} segments of its own")
    say(f"cutting where edgetpu_compiler cut: {at}")
    return at


def _segment_files(model: ModelDir, int8_path: Path, result: SegmentedModel, coral: list[Path],
                   compile_one: Callable[[bytes, str], CompiledSegment] | None,
                   say: Callable[[str], None]) -> tuple[dict[str, tuple[str, bytes]], list[CompiledSegment]]:
    """The segmented directory's files by kind (file name, bytes): the int8 segments, the labels, and the Edge TPU
    segments, Coral's kept or each compiled here by `compile_one`; and what the compiler said of each."""
    count = len(result.parts)
    stem = int8_path.stem
    files = {segment_kind(INT8, i): (segment_filename(stem, i, count), data) for i, data in enumerate(result.files)}
    if model.has(LABELS):
        labels = model.file(LABELS)
        files[LABELS] = (labels.name, labels.read_bytes())
    compiled = []
    if coral:
        for i, path in enumerate(coral):
            files[segment_kind("edgetpu", i)] = (path.name, path.read_bytes())
    elif compile_one is not None:
        for i, data in enumerate(result.files):
            say(f"compiling segment {i} of {count}...")
            compiled.append(compile_one(data, segment_filename(stem, i, count)))
            files[segment_kind("edgetpu", i)] = (segment_filename(stem, i, count, compiled=True), compiled[-1].data)
    return files, compiled


def _segmented_manifest(model: ModelDir, int8_path: Path, result: SegmentedModel, chosen_by: str,
                        compiled: list[CompiledSegment], out: Path, command: str) -> dict:
    """model.json of the segmented model: the whole model's, less its files and compile record, plus the segments
    (and the compiler's record, one report per segment, when they were compiled here)."""
    names = {t.index: t.name for t in read_tflite(int8_path).graph.tensors}
    count = len(result.parts)
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
    if compiled:  # the compiler's record, as `converter compile` writes it: one report per segment
        data["edgetpu_compile"] = EdgeTpuCompile(
            command=compiled[0].command, compiler_version=compiled[0].compiler_version,
            min_runtime_version=compiled[0].min_runtime_version,
            model_min_runtime_version=max((c.model_min_runtime_version or 0) for c in compiled) or None,
            int8_sha256=segments.source_sha256, segments=count, report=compiled[0].report,
            offline_analysis=data.get("edgetpu_analysis") or "", segment_reports=[c.report for c in compiled],
        ).model_dump(mode="json", exclude_none=True)
    data["build"] = Build(command=command, tools=tool_versions("ai-edge-litert", "flatbuffers", "numpy"),
                          segmented_from=model.name).model_dump(mode="json")
    return data


def _write_segmented_dir(out: Path, data: dict, files: dict[str, tuple[str, bytes]]) -> Path:
    """A new model directory `out`; or, where `out` holds segments already, the new segments replace them whole."""
    if (out / MANIFEST).is_file():
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
    """The segment files and segments.json, for a .tflite that came without a model directory."""
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
