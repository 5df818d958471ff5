"""`python -m converter import`: a .tflite a Coral owner already has -> a model directory, served as it is.

Coral's model zoo, Model Maker and Teachable Machine hand out full-integer files (TF1-style uint8
everywhere, or TF2 int8 with uint8, int8 or float edges) and often their `_edgetpu.tflite`, with the
labels packed inside (TFLite metadata: app/importing/metadata.py). This module reads what such a
file says about itself and writes the same model directory a build writes (app/model_dir/):

    FILE.tflite [FILE_edgetpu.tflite] --> checks: one image input, full-integer, a classifier, a
        detector (TFLite_Detection_PostProcess, a YOLO head, a face detector with prior boxes, which is run
        once on a synthetic image to tell its box form), a segmenter, a pose model or an embedder, the two
        files the same model
      --> labels (--labels, else the file's own), the input spec (size, normalization, resize),
          the outputs by role, provenance "imported" --> models/<name>/ (model.json, labels.txt,
          <name>_int8.tflite and/or <name>_int8_edgetpu.tflite)

Every fact model.json gets is recorded with where it came from (model.json `imported`). Where the
file cannot tell (a float input without normalization metadata, the meaning of a compiled file's
output), the command refuses and names the flag that tells it.

Example usage:

    python -m converter import mobilenet_v2_1.0_224_quant.tflite --name mobilenet_v2_quant
    python -m converter import model.tflite model_edgetpu.tflite --name birds --labels labels.txt
    python -m converter import ssd_mobilenet_v2_coco_quant_postprocess_edgetpu.tflite --name ssd \\
        --labels coco_labels.txt --licence Apache-2.0
    python -m converter import version-RFB-320_int8.tflite --name ulfd_rfb320 --licence MIT
    python -m converter import mobilefacenet_int8.tflite --name mobilefacenet --task embedding
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from app.detection_postprocess import POSTPROCESS_OP
from app.errors import ServeError
from app.edgetpu.compat import EIGHT_BIT, CompatReport, analyze
from app.edgetpu.compiled_model import EDGETPU_CUSTOM_OP, read_compiled_model
from app.importing import EDGE_OPS, GraphFacts, ImportRefused, TfliteSource, graph_facts, producer, read_tflite_source
from app.importing.detectors import DetectorOptions, Family
from app.importing.faces import FACE_LABEL
from app.importing.metadata import Metadata
from app.importing.preprocessing import InputChoice, NormalizationRefused, choose_input, convention, maker_of
from app.importing.tasks import EMBEDDING, KEYPOINT_NAMES, full_integer_twin
from app.tasks.embed import MIN_DIMENSION
from app.model_dir.schema import (
    EDGETPU,
    INT8,
    LABELS,
    MANIFEST,
    Build,
    ImportedFile,
    InputSpec,
    ULTRALYTICS,
    ULTRALYTICS_FILES,
    Manifest,
    OutputSpec,
    edgetpu_filename,
    int8_filename,
)
from app.model_dir.schema import Imported as ImportedRecord
from app.tflite_file import Subgraph, Tensor
from converter.model_dir import write_model_dir
from converter.writing import LABELS_FILE, tool_versions

UNKNOWN_LICENCE = "unknown, given by the user"
# What the importer looks through to find what made an output (TF1 classifiers may end in a RESHAPE after
# their SOFTMAX), beside a float-I/O model's edges (EDGE_OPS).
SHAPE_OPS = ("RESHAPE", "SQUEEZE")
# A label file's placeholder for an id without a class (TF's label maps write "???").
PLACEHOLDER = "???"
# Label lines that stand for the background class some label files list first.
BACKGROUND = re.compile(r"^(background|__background__|\?\?\?|unlabeled|none)$", re.I)
# Coral's `id label` lines (pycoral's read_label_file splits on whitespace or a colon).
ID_LABEL = re.compile(r"^\s*(\d+)[:\s]\s*(.*?)\s*$")


@dataclass(frozen=True)
class SourceFile(TfliteSource):
    """One file given to the importer, read and checked once (app/importing: its graph, its metadata)."""


def read_source(path: Path) -> SourceFile:
    """Read a .tflite file; ImportRefused with the reason if it is missing, truncated or not TFLite."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ImportRefused(f"cannot read {path}: {e.strerror or e}") from None
    source = read_tflite_source(path, data)
    return SourceFile(source.path, source.data, source.model, source.metadata)


# What the graph is (graph_facts: one image input, integer inside, the task it answers) is app/importing's, which
# the service's uploads check files with too.


# ---- two files, one model -------------------------------------------------------------------------

def _io(graph: Subgraph) -> list[tuple]:
    def spec(index: int) -> tuple:
        t = graph.tensors[index]
        q = t.quantization
        quant = None if q is None else (tuple(np.round(q.scale.astype(np.float64), 9)), tuple(q.zero_point.tolist()))
        return t.name, tuple(t.shape), t.type, quant

    return [spec(i) for i in graph.inputs] + [None] + [spec(i) for i in graph.outputs]


def check_pair(plain: SourceFile, compiled: SourceFile) -> list[str]:
    """The compiled file is the plain one compiled: same input and output tensors, and its CPU ops the
    plain model's. ImportRefused otherwise; returns notes."""
    if plain.compiled:
        raise ImportRefused(f"{plain.path.name} is already compiled for the Edge TPU (it holds {EDGETPU_CUSTOM_OP}); "
                            "give the plain .tflite first and the _edgetpu.tflite second")
    if not compiled.compiled:
        raise ImportRefused(f"{compiled.path.name} is not compiled for the Edge TPU (no {EDGETPU_CUSTOM_OP}): give "
                            "the output of edgetpu_compiler as the second file")
    a, b = _io(plain.graph), _io(compiled.graph)
    if a != b:
        split = a.index(None)
        diffs = [f"{'input' if i < split else 'output'} {x[0] if x else '-'!r}: {x} vs {y}"
                 for i, (x, y) in enumerate(zip(a, b)) if x != y] or [f"{len(a)} vs {len(b)} tensors"]
        raise ImportRefused(f"{compiled.path.name} is not {plain.path.name} compiled: their input and output tensors "
                            f"differ ({'; '.join(diffs[:3])}). Give the _edgetpu.tflite that edgetpu_compiler made "
                            "from this very file")
    plain_ops = Counter((op.opcode, op.custom_options) for op in plain.graph.operators)
    host_ops = Counter((op.opcode, op.custom_options) for op in compiled.graph.operators
                       if op.opcode != EDGETPU_CUSTOM_OP)
    extra = host_ops - plain_ops
    if extra:
        names = sorted({opcode for opcode, _ in extra})
        raise ImportRefused(f"{compiled.path.name} runs {names} on the CPU, which {plain.path.name} does not hold (or "
                            "holds with other options): not compiled from this file")
    notes = []
    if compiled.path.name != f"{plain.path.stem}_edgetpu.tflite":
        notes.append(f"{compiled.path.name} is not named {plain.path.stem}_edgetpu.tflite; its tensors and CPU ops "
                     "match, so it is taken as that file compiled")
    return notes


# ---- labels -------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class LabelFile:
    by_id: dict[int, str]
    form: str  # "one per line" | "id label"


def parse_labels(text: str) -> LabelFile:
    """One label per line (line i names class i), or Coral's `id label` lines (ids may have gaps)."""
    lines = text.splitlines()
    while lines and not lines[-1].strip():
        lines.pop()
    filled = [line for line in lines if line.strip()]
    matches = [ID_LABEL.match(line) for line in filled]
    if filled and all(m and m.group(2) for m in matches):
        ids = [int(m.group(1)) for m in matches]
        if len(set(ids)) == len(ids):
            return LabelFile({int(m.group(1)): m.group(2) for m in matches}, "id label")
    return LabelFile({i: line.strip() for i, line in enumerate(lines)}, "one per line")


@dataclass(frozen=True)
class Labels:
    lines: list[str]   # line i names class i ("" for an id without a label)
    origin: str        # where they came from, said to the user and recorded
    notes: list[str] = field(default_factory=list)


def _fit(found: LabelFile, count: int, task: str, where: str) -> Labels:
    """Line i names class i of `count`, or ImportRefused saying why the labels do not fit."""
    by_id, notes = dict(found.by_id), []
    what = "outputs" if task == "classification" else "keypoints" if task == "pose" else "classes"
    if found.form == "one per line":
        entries = len(by_id)
        if entries > count and not by_id.get(count, "").strip():
            # the labels, a blank line, then prose (Coral's pascal_voc_segmentation_labels.txt ends with a note
            # on the ignore label 255)
            rest = [line for i, line in sorted(by_id.items()) if i > count and line.strip()]
            by_id = {i: label for i, label in by_id.items() if i < count}
            entries = count
            notes.append(f"{where}: {count} labels, then a blank line and {len(rest)} line(s) of text after them "
                         f"({rest[0][:60]!r}...), taken as a note, not labels")
        if entries == count + 1 and task in ("detection", "segmentation") and BACKGROUND.match(by_id.get(0, "")):
            by_id = {i - 1: label for i, label in by_id.items() if i > 0}
            maker = POSTPROCESS_OP if task == "detection" else f"the model ({count} classes)"
            notes.append(f"{where}: its first line {found.by_id[0]!r} is the background class, which "
                         f"{maker} does not output: dropped, so that line i names class id i")
        elif entries == count - 1 and task == "classification":
            by_id = {0: "background", **{i + 1: label for i, label in by_id.items()}}
            notes.append(f"{where}: {entries} labels for {count} outputs: output 0 is taken as the background class "
                         f"(as in TF-slim's ImageNet models with {count} outputs) and named 'background'; the labels "
                         f"name outputs 1-{count - 1}")
        elif entries != count:
            raise ImportRefused(f"{where} has {entries} labels, the model has {count} {what}: give the labels of "
                                "this model, one per line in output order (or Coral's `id label` lines)")
    else:
        top = max(by_id)
        if top >= count and task == "detection" and top == count and min(by_id) >= 1:
            by_id = {i - 1: label for i, label in by_id.items()}
            notes.append(f"{where}: ids 1-{count} for {count} classes: taken as 1-based (a label map), so id 1 "
                         f"names the op's class 0")
        elif top >= count:
            raise ImportRefused(f"{where} names id {top}, the model has {count} {what} (ids 0-{count - 1})")
        gaps = count - len(by_id)
        if gaps:
            notes.append(f"{where}: {len(by_id)} ids for {count} {what}; the {gaps} without a label stay blank")
    lines = [by_id.get(i, "") for i in range(count)]
    return Labels(["" if line == PLACEHOLDER else line for line in lines], where, notes)


def resolve_labels(given: Path | None, source: SourceFile, facts: GraphFacts) -> Labels:
    """--labels if given, else the file's own (metadata, or the one text file packed in it), fitted to the outputs;
    a pose model's keypoints are COCO's 17 unless --labels renames them."""
    count = facts.classes
    if facts.task == EMBEDDING:
        if given is not None:
            raise ImportRefused(f"--labels {given}: an embedder has no classes to name (its output is a "
                                f"{count}-value vector)")
        return Labels([], "none: an embedder has no classes")
    if given is None and facts.task == "pose":
        return Labels(list(KEYPOINT_NAMES), f"COCO's {count} keypoint names, in MoveNet's order (the file names none)")
    if given is not None:
        try:
            text = given.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise ImportRefused(f"cannot read the labels {given}: {e}") from None
        found = parse_labels(text)
        labels = _fit(found, count, facts.task, f"--labels {given.name} ({found.form})")
        own = _packed_label_name(source)
        if own:
            labels.notes.append(f"the file's own labels ({own}) were not used: --labels wins")
        return labels
    if facts.detector is not None and facts.detector.labels:
        return Labels(list(facts.detector.labels), facts.detector.labels_origin)
    metadata = source.metadata
    name = _packed_label_name(source)
    if name is None:
        if facts.task == "detection" and count == 1 and FACE_LABEL in source.path.name.lower():
            return Labels([FACE_LABEL], f"one class and no labels in the file, named {FACE_LABEL!r} after the file's "
                                        f"name ({source.path.name}); --labels to name it otherwise")
        # a segmenter's class map does not say how many classes it has: blank lines keep the count
        lines = [""] * count if facts.task == "segmentation" else []
        return Labels(lines, "none: the file carries no labels and --labels was not given; classes are named by number",
                      [f"{source.path.name} carries no labels: give --labels FILE to name the classes"])
    raw = metadata.packed.get(name)
    if raw is None:
        raise ImportRefused(f"{source.path.name}'s metadata names the label file {name!r}, but the zip packed in the "
                            "file does not hold it (a truncated download?): download it again, or give --labels")
    found = parse_labels(raw.decode("utf-8", "replace"))
    where = (f"the file's metadata ({name}, packed in the file)" if metadata.label_files()
             else f"the file's packed zip ({name}; no metadata names it)")
    return _fit(found, count, facts.task, where)


def _packed_label_name(source: SourceFile) -> str | None:
    """The label file the metadata names for the classes (or, without metadata, the only .txt packed); never
    Ultralytics' temp_meta.txt, which its 8.2-8.3 exports name as the output's labels but holds a dict of facts."""
    metadata = source.metadata
    listed = [f for f in metadata.label_files() if f.name not in ULTRALYTICS_FILES]
    if listed:
        return listed[0].name
    texts = [name for name in metadata.packed if name.lower().endswith(".txt") and name not in ULTRALYTICS_FILES]
    return texts[0] if len(texts) == 1 else None


# ---- the input spec ------------------------------------------------------------------------------------

# What feeds the input (its normalization and its maker's convention) is app/importing/preprocessing.py's, which the
# service's uploads use too.


# ---- the output's meaning ---------------------------------------------------------------------------

def _through_edges(graph: Subgraph, tensor: int):
    op = producer(graph, tensor)
    while op is not None and op.opcode in (*EDGE_OPS, *SHAPE_OPS):
        op = producer(graph, op.inputs[0])
    return op


def choose_scores(plain: SourceFile | None, compiled: SourceFile | None, output: Tensor, given: str | None) -> tuple[str, str]:
    """(logits | probabilities, why): the flag, else the op that makes the output, else its quantization."""
    if given:
        return given, "--scores as given"
    if plain is not None:
        last = _through_edges(plain.graph, plain.graph.outputs[0])
        if last is not None and last.opcode == "SOFTMAX":
            return "probabilities", "the output comes from a SOFTMAX: probabilities, used as they are"
        return "logits", f"the output comes from {last.opcode if last else 'the input'}: logits, the service applies a softmax"
    q = output.quantization
    if q is not None and output.type in EIGHT_BIT:
        scale, zero_point = float(q.scale[0]), int(q.zero_point[0])
        softmax_zero = 0 if output.type == "UINT8" else -128
        if abs(scale - 1 / 256) < 1e-9 and zero_point == softmax_zero:
            return "probabilities", ("the output's quantization is a softmax's (scale 1/256, zero point at the "
                                     "bottom of the range): probabilities")
    raise ImportRefused(f"{compiled.path.name if compiled else 'the file'}'s output is made inside the Edge TPU's "
                        "compiled op, so the file does not say whether it holds logits or probabilities: give "
                        "--scores logits or --scores probabilities (or import the plain .tflite beside it)")


def quantization_record(source: SourceFile) -> dict | None:
    """model.json `quantization` for a model with 8-bit input and output (None for float edges or a detector)."""
    graph = source.graph
    ends = [graph.tensors[graph.inputs[0]], graph.tensors[graph.outputs[0]]] if len(graph.outputs) == 1 else []
    if len(ends) != 2 or any(t.type not in EIGHT_BIT or t.quantization is None for t in ends):
        return None

    def tensor(t: Tensor) -> dict:
        return {"dtype": t.type.lower(), "shape": list(t.shape), "scale": float(t.quantization.scale[0]),
                "zero_point": int(t.quantization.zero_point[0])}

    operators = Counter(op.opcode for op in graph.operators)
    return {"operators": dict(sorted(operators.items())), "input": tensor(ends[0]), "output": tensor(ends[1])}


def analysis(source: SourceFile) -> CompatReport:
    return analyze(source.model)


# ---- the model directory ---------------------------------------------------------------------------------

@dataclass
class ImportOptions:
    name: str
    out: Path = Path("models")
    labels: Path | None = None
    licence: str | None = None
    source: str | None = None
    description: str | None = None
    mean: list[float] | None = None
    std: list[float] | None = None
    resize: str | None = None
    crop_fraction: float = 0.875
    convention: str | None = None  # whose preprocessing (coral, ultralytics), where the file names none or wrongly
    scores: str | None = None
    task: str | None = None    # where the graph cannot tell: classification, detection, segmentation, pose, embedding
    replace: bool = False
    command: str = ""
    # a detector's decoding, where the file cannot tell it (--classes, --box-scale, ...: app/importing/detectors.py)
    detector: DetectorOptions = field(default_factory=DetectorOptions)


@dataclass(frozen=True)
class Imported:
    path: Path
    report: CompatReport        # the Edge TPU analysis of what the Edge TPU will run (or would)
    notes: list[str]


def _split(files: list[Path]) -> tuple[SourceFile | None, SourceFile | None]:
    """(plain, compiled) from one or two files, whichever order they came in."""
    if not 1 <= len(files) <= 2:
        raise ImportRefused(f"give one .tflite, one _edgetpu.tflite, or both (got {len(files)} files)")
    sources = [read_source(path) for path in files]
    if len(sources) == 1:
        only = sources[0]
        return (None, only) if only.compiled else (only, None)
    first, second = sources
    if first.compiled and not second.compiled:
        first, second = second, first
    return first, second


def import_model(files: list[Path], options: ImportOptions, say=lambda message: None) -> Imported:
    """Check the file(s), work out labels, input spec and outputs, and write models/<name>/ whole."""
    _check_target(options)
    plain, compiled = _split(files)
    main = plain or compiled
    notes: list[str] = []
    if plain is not None and compiled is not None:
        notes += check_pair(plain, compiled)
    try:
        facts = graph_facts(main, dataclasses.replace(options.detector, scores=options.detector.scores or
                                                      options.scores), options.task,
                            probe=lambda tensor: _probe(main, tensor), labelled=options.labels is not None)
    except ImportRefused as e:
        raise ImportRefused(_with_twin(str(e), main.path, options)) from None
    notes += facts.notes
    if compiled is not None and plain is None:
        notes.append(f"{compiled.path.name} is compiled for the Edge TPU and came without its plain .tflite: it "
                     "serves on the edgetpu backend only (cpu and emulated need the plain file: import both)")
    labels = resolve_labels(options.labels, plain or compiled, facts)
    notes += labels.notes
    metadata_source = main.metadata if main.metadata.present else (compiled.metadata if compiled else main.metadata)
    spec, input_origin, resize_origin = _input_spec(facts.input, metadata_source, options, main.path.name, notes,
                                                    facts.detector, facts.raw_input)
    if facts.task == "classification":
        scores, scores_origin = choose_scores(plain, compiled, facts.output, options.scores)
        if scores == "logits" and not labels.lines and facts.classes >= MIN_DIMENSION and options.task is None:
            notes.append(f"a classifier of {facts.classes} unnamed classes whose output is no softmax's: if it is an "
                         f"embedder (a face embedder's {facts.classes} values), import it with --task embedding")
    elif facts.task in ("segmentation", "pose"):
        scores, scores_origin = "probabilities", (
            "a segmenter: the class of a pixel is its highest score, whatever their scale" if facts.task ==
            "segmentation" else "a pose model: keypoint scores as the model gives them (0-1)")
    elif facts.task == EMBEDDING:
        scores, scores_origin = "probabilities", ("an embedder: its output vector, dequantized and L2-normalized "
                                                  "(no scores)")
        unused = [main.graph.tensors[t].name for t in main.graph.outputs if main.graph.tensors[t] is not facts.output]
        if unused:
            notes.append(f"outputs {unused} are not read: the embedding is {facts.output.name!r}")
    else:
        family = facts.detector
        scores, scores_origin = "probabilities", f"a detector, {family.name}: {family.origin}"
        order = [main.graph.tensors[t].name for t in main.graph.outputs]
        made_by = POSTPROCESS_OP if family.spec.decoder == "postprocess" else "their shapes"
        notes.append(f"detector: outputs by role from {made_by} "
                     f"({', '.join(f'{r} {n!r}' for r, n in family.outputs.items())}); "
                     f"the file lists them as {order}")
        notes += family.notes
    analysed = analysis(compiled if plain is None else plain)
    estimate = _estimate(plain, notes)
    metadata = metadata_source.summary()
    if metadata.get("license") and not options.licence:
        notes.append(f"the file's metadata gives the licence {metadata['license']!r}; pass --licence to record it")
    given = [(plain, INT8, int8_filename(options.name)), (compiled, EDGETPU, edgetpu_filename(options.name))]
    given = [(s, kind, filename) for s, kind, filename in given if s is not None]
    record = ImportedRecord(
        files=[ImportedFile(name=s.path.name, sha256=s.sha256, bytes=len(s.data), kind=kind) for s, kind, _ in given],
        labels=labels.origin, input=f"{input_origin}; resize: {resize_origin}", scores=scores_origin, metadata=metadata,
        compiler=_compiler_record(compiled), task=facts.why, notes=notes)
    manifest = Manifest(
        name=options.name, task=facts.task,
        description=options.description or metadata.get("description") or f"imported from {main.path.name}",
        source=options.source or _source_of([s for s, _, _ in given], metadata),
        licence=options.licence or UNKNOWN_LICENCE, input=spec, output=OutputSpec(scores=scores),
        outputs=facts.detector.outputs if facts.detector is not None else facts.outputs,
        detection=facts.detector.spec if facts.detector is not None else None,
        quantization=quantization_record(plain) if plain is not None else None,
        edgetpu_analysis=analysed.summary(),
        build=Build(command=options.command or f"python -m converter import ... --name {options.name}",
                    route="imported", tools=tool_versions("ai-edge-litert", "flatbuffers", "numpy")),
        edgetpu_estimate=estimate, imported=record)
    written = {kind: (filename, s.data) for s, kind, filename in given}
    if facts.detector is not None:
        written.update(facts.detector.files)  # a face detector's --anchors file
    if labels.lines:
        written[LABELS] = (LABELS_FILE, ("\n".join(labels.lines) + "\n").encode())
    path = write_model_dir(options.out, manifest, written, replace=True)
    counted = "keypoints" if facts.task == "pose" else "classes"
    say(f"labels: {labels.origin}" + (f" ({len(labels.lines)} {counted})" if labels.lines else ""))
    say(f"input: {spec.width}x{spec.height}x{spec.channels} {facts.input.type.lower()}; {input_origin}; "
        f"resize {spec.resize}")
    say(f"convention: {spec.convention.name} ({spec.convention.why})")
    if facts.task == "classification":
        say(f"output: {facts.classes} classes, {scores_origin}")
    elif facts.task == EMBEDDING:
        say(f"embedder: {facts.classes} values, {facts.why}")
    elif facts.task == "detection":
        say(f"detector: {facts.detector.name}, {facts.classes} class{'es' if facts.classes != 1 else ''}; "
            f"{facts.detector.origin}")
    else:
        say(f"task: {facts.task}, {facts.why}")
    for note in notes:
        say(f"note: {note}")
    return Imported(path, analysed, notes)


def _probe(source: SourceFile, tensor: np.ndarray) -> dict[str, np.ndarray]:
    """The file run once on `tensor` on the service's cpu backend (the emulator where TFLite's runtime is missing):
    its outputs by tensor name. ImportRefused where it cannot run here."""
    from converter.local_models import run_once
    from app.engines import ENGINES

    backend = "cpu" if "cpu" in ENGINES else "emulated"
    try:
        return run_once(source.path, tensor, backend)
    except ServeError as e:
        raise ImportRefused(f"{source.path.name} could not be run here to tell its box form ({e}): give --boxes "
                            "priors or --boxes decoded") from None


def _with_twin(message: str, path: Path, options: ImportOptions) -> str:
    """A refusal of an Ultralytics export's float or dynamic-range file, with the command that imports the
    full-integer file where it lies beside it."""
    twin = full_integer_twin(path.name)
    if twin is None or not (path.parent / twin).is_file():
        return message
    command = ["python", "-m", "converter", "import", str(path.parent / twin), "--name", options.name]
    if Path(options.out) != Path("models"):
        command += ["--out", str(options.out)]
    return f"{message}. It is there: {shlex.join(command)}"


def _check_target(options: ImportOptions) -> None:
    """ImportRefused unless --name makes a model name and <out>/<name> is free (or --replace replaces a model)."""
    if not re.match(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", options.name):
        raise ImportRefused(f"--name {options.name!r}: a model name is letters, digits, '_', '.' and '-', starting "
                            "with a letter or digit (it becomes models/<name>/ and the URL /v1/models/<name>)")
    target = Path(options.out) / options.name
    if target.exists():
        if not (target / MANIFEST).is_file():
            raise ImportRefused(f"{target} exists and is not a model directory: choose another --name or --out")
        if not options.replace:
            raise ImportRefused(f"{target} exists: pass --replace to replace it whole, or choose another --name")


def _input_spec(tensor: Tensor, metadata: Metadata, options: ImportOptions, name: str, notes: list[str],
                family: Family | None = None, raw_input: bool = False) -> tuple[InputSpec, str, str]:
    """The service's input spec for the model's input (its convention recorded in it), where its normalization came
    from, and where its resize came from (a note added where the metadata contradicts the input, or where nothing
    names the normalization of an input whose range no pixel normalization makes)."""
    maker = maker_of(family.maker if family is not None else None, options.convention)
    if raw_input and options.mean is None and options.std is None:
        choice = InputChoice([0.0], [1.0], f"the {tensor.type.lower()} input has no quantization and the model casts "
                                           "it to float itself (its normalization is inside, as MoveNet's): the "
                                           "pixels go in as they are")
    else:
        try:
            choice = choose_input(tensor, metadata, options.mean, options.std, name, maker)
        except NormalizationRefused as e:
            raise ImportRefused(str(e)) from None
    if choice.caution:
        notes.append(choice.caution)
    height, width, channels = tensor.shape[1:4]
    info = metadata.inputs[0] if metadata.inputs else None
    if info is not None and info.color_space == "GRAYSCALE" and channels == 3:
        notes.append("the metadata says GRAYSCALE but the input has 3 channels: fed as RGB")
    followed = convention(maker)
    default = family.resize if family is not None else "stretch"
    resize = options.resize or default
    if options.resize:
        resize_origin = f"--resize {options.resize}"
    elif default == "letterbox" and followed.name == ULTRALYTICS:
        resize_origin = ("letterbox: YOLO heads are trained on letterboxed images, aspect ratio kept; centred on grey "
                         "114, as Ultralytics' LetterBox does; --resize stretch to stretch")
    elif default == "letterbox":
        resize_origin = ("letterbox: YOLO heads are trained on letterboxed images, aspect ratio kept; at the top-left "
                         "on black, as pycoral's set_resized_input (nothing in the file names Ultralytics as its "
                         "maker: --convention ultralytics centres it on grey 114 and feeds pixels / 255, as Ultralytics "
                         "does); --resize stretch to stretch")
    else:
        resize_origin = ("stretch: the whole image scaled to the input size, as Coral's examples and TFLite's Task "
                         "Library do (TFLite metadata has no crop field); --resize center_crop to crop")
    try:
        spec = InputSpec(width=width, height=height, channels=channels, resize=resize,
                         crop_fraction=options.crop_fraction, mean=choice.mean, std=choice.std, convention=followed)
    except ValueError as e:
        raise ImportRefused(f"the input spec does not fit: {e}") from None
    return spec, choice.origin, resize_origin


def _estimate(plain: SourceFile | None, notes: list[str]) -> dict | None:
    """model.json's `edgetpu_estimate`, made from the plain model's structure (a note says why there is none)."""
    if plain is None:
        notes.append("no Edge TPU estimate: it is made from the plain model's structure, which a compiled file hides")
        return None
    from converter.estimate import estimate_tflite_bytes  # its public entry point, as builds use it

    estimate = estimate_tflite_bytes(plain.data)
    if estimate is None:
        notes.append("no Edge TPU estimate: converter/estimate.py cannot estimate this model")
    return estimate


def _compiler_record(compiled: SourceFile | None) -> dict | None:
    """What the compiled file says of the compiler that made it (None without a compiled file)."""
    if compiled is None:
        return None
    record = read_compiled_model(compiled.path)
    return {"edgetpu_ops": record.edgetpu_ops, "min_runtime_version": record.min_runtime_version,
            "compiler_version": record.compiler_version}


def _source_of(sources: list[SourceFile], metadata: dict) -> str:
    """model.json's `source` when --source is not given: the files by name and sha256, and the name the file gives
    itself."""
    names = " and ".join(f"{s.path.name} (sha256 {s.sha256[:12]})" for s in sources)
    if not metadata.get("name"):
        return f"imported: {names}"
    author = f" by {metadata['author']}" if metadata.get("author") else ""
    return f"imported: {names}; the file calls itself {metadata['name']!r}{author}"

