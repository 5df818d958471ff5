"""Which operators edgetpu_compiler would map to the Edge TPU, decided offline from the .tflite alone.

The compiler is a closed x86-64 Linux binary. It maps one subgraph: an operator it cannot take runs on the
CPU, and so does every operator that depends on it (its log says "More than one subgraph is not supported"
for those); an operator on a branch that does not depend on it still maps. This module applies Coral's
documented requirements ("TensorFlow models on the Edge TPU": model requirements and the supported-operations
table) to each operator, corrected and completed by what the compiler's own logs and compiled files show
(app/edgetpu/compiler_limits.py: the limits it does not document, the operators it maps beyond the table),
then follows the data from the inputs to say which operators the one subgraph would hold and why the others
are left out.

Model requirements, checked on every operator's tensors:
  - activations int8/uint8 and quantized; constants int8/uint8, or integer operands such as
    int32 biases, shapes, axes and paddings (no float anywhere);
  - static shapes (no -1 in a shape signature), batch 1;
  - effective rank <= 3: a tensor may have more than 3 dimensions only if every dimension
    outside the 3 innermost is 1 (shape [1, 224, 224, 3] is fine, [2, 224, 224, 3] is not);
  - parameters (weights, biases) constant at compile time;
  - no tensor larger than the compiler takes in its two innermost dimensions (compiler_limits.INNER_PLANE).
Per-operator limits come from the same table and the same logs (OP_LIMITS below).

A verdict the measured compiler output does not confirm (a size between the largest seen mapped and the smallest
seen refused, an operator type no measured file shows mapped) says so: OpVerdict.unsure. Pure: no compiler, no
TensorFlow, no interpreter; the service's emulator uses it too.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np

from app.detection_postprocess import POSTPROCESS_OP
from app.edgetpu import compiler_limits as learned
from app.edgetpu.compiled_model import EDGETPU_CUSTOM_OP
from app.tflite_file import Operator, Subgraph, Tensor, TfliteModel, read_tflite, schema

# Coral's table, "Known limitations" column, as numbers.
MAX_EFFECTIVE_RANK = 3
MAX_SOFTMAX_ELEMENTS = 16_000
MEAN_Z_MULTIPLE = 4
EIGHT_BIT = frozenset({"INT8", "UINT8"})
# Constant operands the compiler folds or reads at compile time: weights (8-bit), biases (int32),
# shapes, axes, paddings, strides (int32/int64).
CONSTANT_TYPES = frozenset({"INT8", "UINT8", "INT32", "INT64"})

# Operator versions. edgetpu_compiler 16.0 parses a model with the TFLite op registry it was built with and
# refuses the WHOLE model ("Didn't find op for builtin opcode 'X' version 'N'. An older version of this builtin
# might be supported. ... Model could not be parsed") when an operator's version is newer than that registry.
# Coral publishes no table of the versions it registers. What is known:
#  - version 1 of every operator in the supported-operations table is registered (it is the op itself);
#  - the lowest refused versions below are compiler 16.0's own error messages, reported in Coral's issue
#    trackers: CONV_2D 6 (google-coral/edgetpu#631, TF 2.9), QUANTIZE 3 (#879), TRANSPOSE_CONV 4 (#845),
#    EXP 2 (google-coral/libedgetpu#71, TF 2.16);
#  - anything between is not documented: op_version_notes() says so rather than guessing.
COMPILER_16_REFUSED_FROM: dict[str, int] = {"CONV_2D": 6, "QUANTIZE": 3, "TRANSPOSE_CONV": 4, "EXP": 2}

# A rule looks at one operator in its graph: None if it holds, else the reason it does not.
Rule = Callable[[Operator, Subgraph], str | None]

# TFLite builtin -> the name Coral's supported-operations table gives it (and the operators compiler 16 maps
# beyond the table, compiler_limits.BEYOND_THE_TABLE, under their TFLite names).
SUPPORTED_OPS: dict[str, str] = {
    "ADD": "Add", "AVERAGE_POOL_2D": "AveragePool2d", "CONCATENATION": "Concatenation",
    "CONV_2D": "Conv2d", "DEPTHWISE_CONV_2D": "DepthwiseConv2d", "EXPAND_DIMS": "ExpandDims",
    "FULLY_CONNECTED": "FullyConnected", "L2_NORMALIZATION": "L2Normalization", "LOGISTIC": "Logistic",
    "UNIDIRECTIONAL_SEQUENCE_LSTM": "LSTM", "MAXIMUM": "Maximum", "MAX_POOL_2D": "MaxPool2d",
    "MEAN": "Mean", "MINIMUM": "Minimum", "MUL": "Mul", "PACK": "Pack", "PAD": "Pad", "PRELU": "PReLU",
    "QUANTIZE": "Quantize", "REDUCE_MAX": "ReduceMax", "REDUCE_MIN": "ReduceMin", "RELU": "ReLU",
    "RELU6": "ReLU6", "RELU_N1_TO_1": "ReLUN1To1", "RESHAPE": "Reshape", "RESIZE_BILINEAR": "ResizeBilinear",
    "RESIZE_NEAREST_NEIGHBOR": "ResizeNearestNeighbor", "SLICE": "Slice", "SOFTMAX": "Softmax",
    "SPACE_TO_DEPTH": "SpaceToDepth", "SPLIT": "Split", "SQUEEZE": "Squeeze", "STRIDED_SLICE": "StridedSlice",
    "SUB": "Sub", "SUM": "Sum", "TANH": "Tanh",
    "TRANSPOSE": "Transpose", "TILE": "Tile",
}

# What to do instead, for operators people often meet in converted models.
UNSUPPORTED_HINTS: dict[str, str] = {
    "DEQUANTIZE": "it produces float; give the model integer output (inference_output_type uint8 or int8)",
    "FLOOR_MOD": "compute it outside the model or on the CPU after the Edge TPU part",
    "SHAPE": "a dynamic shape computation; build the Keras model with Input(..., batch_size=1)",
    "HARD_SWISH": "use ReLU6 (as EfficientNet-Lite does; google-coral/edgetpu#272: a YOLOv5s at 320 took 370 ms "
                  "on the Edge TPU with HardSwish, 100 ms without)",
    "BATCH_MATMUL": "use a Dense/FullyConnected layer with constant weights",
    "GATHER": "compute it outside the model",
}


DEPENDS_ON_CPU = ("depends on {opcode} at index {index}, which runs on the CPU: the Edge TPU runs one subgraph "
                  "(edgetpu_compiler: \"More than one subgraph is not supported\")")
COMPILED_ELSEWHERE = "not part of the compiled Edge TPU op: runs on the CPU"
REFUSED_MODEL = ("edgetpu_compiler 16 refuses the whole model for the version of {opcode} at index {index}: nothing "
                 "maps")

# Operators that run on the host after the Edge TPU's part by design: a detector's box decoding and
# non-maximum suppression, the DEQUANTIZE that feeds it or makes a float output, and a segmenter's
# ARG_MAX to its class map (no Edge TPU operation: Coral's DeepLab files end in it). When everything
# the CPU runs after the Edge TPU's part is such an operator, the partition ends where the model means it to.
HOST_TAIL_OPS = frozenset({POSTPROCESS_OP, "DEQUANTIZE", "ARG_MAX"})
HOST_HEAD = ("input cast or quantized on the CPU before the Edge TPU's part (edgetpu_compiler leaves it there), as "
             "intended")
HOST_TAIL = "runs on the CPU after the Edge TPU's part ({opcode}: host post-processing), as intended"
UNCONFIRMED_OP = ("Coral's table lists {name}, but no compiler log or compiled file this analysis was measured "
                  "against shows {opcode} mapped (docs/edgetpu-compiler.md)")


@dataclass(frozen=True)
class Advice:
    """A trap a model falls into that the per-operator verdicts do not name on their own: what was found (with the
    operators concerned), what to change, and where the fact comes from."""

    topic: str                 # "SiLU", "HARD_SWISH", "TRANSPOSE", "DFL decode", "attention", "subgraphs", ...
    ops: tuple[int, ...]       # the operators concerned (indices in subgraph 0), if any
    finding: str
    change: str
    source: str


@dataclass(frozen=True)
class OpVerdict:
    """One operator: can the Edge TPU take it, and if not, which constraint it breaks.

    `status` is the compiler's word for the operator on its own (compiler_limits: MAPPED when it can take it);
    `unsure` says why the measured compiler output does not confirm the verdict, None when it does."""

    index: int
    opcode: str
    supported: bool
    reason: str | None
    status: str = learned.MAPPED
    unsure: str | None = None


@dataclass(frozen=True)
class CompatReport:
    """The analysis of one graph.

    `mapped` is how many operators the one Edge TPU subgraph would hold: every operator the Edge TPU can
    take that does not depend on one the CPU runs after it (`edgetpu`, their indices). For a model that is
    already compiled (`compiled`), it is the number of edgetpu-custom-op nodes, and every other operator runs
    on the CPU.
    """

    ops: list[OpVerdict]
    compiled: bool
    first_unsupported: OpVerdict | None
    mapped: int
    total: int
    # Host operators at the edges, by design: `head` QUANTIZE/CAST ops of a float input (the compiler leaves
    # them on the CPU and maps what follows), `tail` HOST_TAIL_OPS the CPU runs after the Edge TPU's part (a
    # detector's post-processing, a DEQUANTIZE to a float output).
    head: int = 0
    tail: int = 0
    # what to change in the model so that more of it maps (advise(): YOLO exports' known traps)
    advice: tuple[Advice, ...] = ()
    # the operators on the Edge TPU, and for each CPU operator after its part, the CPU operator where the data
    # first left it (itself, for the first ones)
    edgetpu: frozenset[int] = frozenset()
    after: dict[int, int] | None = None
    # an operator version edgetpu_compiler 16 does not register: it then refuses the whole model, maps nothing
    refused_model: OpVerdict | None = None

    @property
    def all_mapped(self) -> bool:
        return self.mapped == self.total

    @property
    def unsure(self) -> list[OpVerdict]:
        """The operators placed on the Edge TPU on a verdict the measured compiler output does not confirm."""
        return [v for v in self.ops if v.unsure and self.on_edgetpu(v.index)]

    def _host_edge(self, index: int) -> bool:
        """A float input's QUANTIZE before the Edge TPU's part, or host post-processing after it."""
        if index < self.head:
            return True
        return self.ops[index].opcode in HOST_TAIL_OPS and (self.compiled or index in (self.after or {}))

    @property
    def as_intended(self) -> bool:
        """Every operator the Edge TPU could run is mapped; only the host's edges run on the CPU."""
        if self.total == 0:
            return False
        if self.all_mapped:
            return True
        cpu = [v.index for v in self.ops if not self.on_edgetpu(v.index)]
        return self.mapped > 0 and all(self._host_edge(i) for i in cpu)

    def on_edgetpu(self, index: int) -> bool:
        """Whether operator `index` runs (or would run) on the Edge TPU."""
        if self.compiled:
            return self.ops[index].opcode == EDGETPU_CUSTOM_OP
        return index in self.edgetpu

    def status(self, index: int) -> str:
        """What edgetpu_compiler's operator table would say of operator `index` (its own words, compiler_limits)."""
        verdict = self.ops[index]
        if self.on_edgetpu(index):
            return learned.MAPPED
        if not verdict.supported:
            return verdict.status
        if self.refused_model is not None:
            return learned.MODEL_REFUSED
        return learned.MORE_THAN_ONE_SUBGRAPH

    def table(self) -> Counter:
        """(operator type, status) -> count: the compiler's operator table as this analysis predicts it."""
        return Counter((v.opcode, self.status(v.index)) for v in self.ops)

    def _edges(self) -> str:
        parts = []
        if self.head:
            parts.append("the float input's QUANTIZE before it")
        if self.tail:
            names = Counter(v.opcode for v in self.ops if not self.on_edgetpu(v.index)
                            and v.opcode in HOST_TAIL_OPS)
            parts.append(", ".join(f"{op} x{n}" if n > 1 else op for op, n in names.items()) + " after it")
        return " and ".join(parts)

    def summary(self) -> str:
        if self.total == 0:
            return "the graph has no operators"
        if self.compiled:
            cpu = self.total - self.mapped
            text = (f"already compiled for the Edge TPU: {self.mapped} Edge TPU custom op(s); "
                    f"{cpu} of {self.total} ops run on the CPU")
            if cpu and self.as_intended:
                return text + f" ({self._edges()}, as intended)"
            if self.first_unsupported is not None:
                text += f" (first unsupported op: {self.first_unsupported.opcode} at index {self.first_unsupported.index})"
            return text
        if self.refused_model is not None:
            refused = self.refused_model
            return (f"edgetpu_compiler 16 would refuse the whole model ({refused.reason.split(':')[0]} at index "
                    f"{refused.index}); 0 of {self.total} ops would run on the Edge TPU")
        if self.all_mapped:
            return f"all {self.total} ops would run on the Edge TPU"
        if self.as_intended:
            return (f"{self.mapped} of {self.total} ops would run on the Edge TPU, every one it can; the CPU runs "
                    f"{self._edges()}, as intended")
        first = self.first_unsupported
        return (f"first unsupported op: {first.opcode} at index {first.index}; "
                f"{self.mapped} of {self.total} ops would run on the Edge TPU")

    def placement(self, index: int) -> str | None:
        """Why operator `index` runs on the CPU (its own constraint, or what it depends on); None on the TPU."""
        if self.on_edgetpu(index):
            return None
        verdict = self.ops[index]
        if self.refused_model is not None and verdict.supported:
            return REFUSED_MODEL.format(opcode=self.refused_model.opcode, index=self.refused_model.index)
        if self.as_intended and index < self.head:
            return HOST_HEAD
        if self.as_intended and self._host_edge(index):
            return HOST_TAIL.format(opcode=verdict.opcode)
        if not verdict.supported:
            return verdict.reason
        if self.compiled:
            return COMPILED_ELSEWHERE
        cause = (self.after or {})[index]
        return DEPENDS_ON_CPU.format(opcode=self.ops[cause].opcode, index=cause)

    def op_dict(self, index: int) -> dict:
        return dict(asdict(self.ops[index]), on_edgetpu=self.on_edgetpu(index), status=self.status(index))

    def to_dict(self) -> dict:
        """The report as plain values: the one rendering that `converter inspect --json` and the API serve."""
        first = self.first_unsupported
        return {
            "compiled": self.compiled,
            "total": self.total,
            "mapped": self.mapped,
            "as_intended": self.as_intended,
            "first_unsupported": None if first is None else self.op_dict(first.index),
            "summary": self.summary(),
            "ops": [self.op_dict(v.index) for v in self.ops],
            "unsure": [self.op_dict(v.index) for v in self.unsure],
            "advice": [dict(asdict(a), ops=list(a.ops)) for a in self.advice],
        }

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)


def analyze(model: TfliteModel) -> CompatReport:
    """Verdict per operator of the graph the interpreter runs (subgraph 0), and the one subgraph the Edge TPU
    would run."""
    graph = model.graph
    verdicts = [_verdict(op, graph) for op in graph.operators]
    compiled = any(v.opcode == EDGETPU_CUSTOM_OP for v in verdicts)
    head = 0
    while head < len(verdicts) and _quantizes_float_input(graph.operators[head], graph):
        head += 1
    head = 0 if head and graph.operators[head - 1].opcode == "CAST" else head  # a CAST alone is no head
    first = next((v for v in verdicts[head:] if not v.supported), None)
    advice = tuple(advise(model))
    if compiled:
        mapped = sum(v.opcode == EDGETPU_CUSTOM_OP for v in verdicts)
        host = [v for v in verdicts if v.opcode != EDGETPU_CUSTOM_OP]
        tail = sum(v.opcode in HOST_TAIL_OPS for v in host)
        head = sum(_quantizes_float_input(graph.operators[v.index], graph) for v in host)
        return CompatReport(ops=verdicts, compiled=True, first_unsupported=first, mapped=mapped,
                            total=len(verdicts), head=head, tail=tail, advice=advice)
    refused = next((v for v in verdicts if _op_version(graph.operators[v.index], graph)), None)
    if refused is not None:  # the compiler stops parsing: nothing maps, every operator runs on the CPU
        return CompatReport(ops=verdicts, compiled=False, first_unsupported=refused, mapped=0, total=len(verdicts),
                            advice=advice, refused_model=refused, after={v.index: refused.index for v in verdicts})
    edgetpu, after = partition(graph, [v.supported for v in verdicts])
    tail = sum(v.opcode in HOST_TAIL_OPS and v.index in after for v in verdicts)
    return CompatReport(ops=verdicts, compiled=False, first_unsupported=first, mapped=len(edgetpu),
                        total=len(verdicts), head=head, tail=tail, advice=advice, edgetpu=frozenset(edgetpu),
                        after=after)


def partition(graph: Subgraph, supported: list[bool]) -> tuple[set[int], dict[int, int]]:
    """The one subgraph edgetpu_compiler would map, from what each operator allows on its own.

    Operators are visited in the order TFLite stores them, which is an order the data allows. One runs on the
    Edge TPU when it can, unless an input comes through an operator the CPU runs after some Edge TPU operator:
    mapping it would need a second Edge TPU subgraph. A CPU operator with nothing of the Edge TPU's before it
    (a float input's QUANTIZE) does not stop what follows. Returns the Edge TPU operators, and for each CPU
    operator after their part the CPU operator where the data first left it (itself, for the first ones).
    """
    producer = {t: op.index for op in graph.operators for t in op.outputs}
    edgetpu: set[int] = set()
    after: dict[int, int] = {}
    for op in graph.operators:
        sources = [producer[t] for t in _used(op.inputs) if t in producer]
        waits = next((after[s] for s in sources if s in after), None)
        if supported[op.index] and waits is None:
            edgetpu.add(op.index)
        elif waits is not None:
            after[op.index] = waits
        elif any(s in edgetpu for s in sources):
            after[op.index] = op.index
    return edgetpu, after


def _verdict(op: Operator, graph: Subgraph) -> OpVerdict:
    if op.opcode == EDGETPU_CUSTOM_OP:
        return OpVerdict(op.index, op.opcode, True, None)
    reason, status = check(op, graph)
    return OpVerdict(op.index, op.opcode, reason is None, reason, status, None if reason else doubt(op, graph))


def _quantizes_float_input(op: Operator, graph: Subgraph) -> bool:
    """The host's part of a float-I/O model's edge: a QUANTIZE of a float model input into 8 bits, or of the CAST
    to float of an unquantized 8-bit input (MoveNet: CAST uint8 -> float32, QUANTIZE -> int8), or that CAST."""
    if len(op.inputs) != 1 or len(op.outputs) != 1:
        return False
    source, result = graph.tensors[op.inputs[0]], graph.tensors[op.outputs[0]]
    if op.opcode == "CAST":
        return op.inputs[0] in graph.inputs and source.type in EIGHT_BIT and source.quantization is None \
            and result.type not in EIGHT_BIT
    if op.opcode != "QUANTIZE" or source.type in EIGHT_BIT or result.type not in EIGHT_BIT:
        return False
    if op.inputs[0] in graph.inputs:
        return True
    cast = next((other for other in graph.operators if op.inputs[0] in other.outputs), None)
    return cast is not None and cast.opcode == "CAST" and _quantizes_float_input(cast, graph)


def analyze_file(source) -> CompatReport:
    """analyze() of a .tflite path or bytes (TfliteFileError if it is not one)."""
    return analyze(read_tflite(source))


def check_operator(op: Operator, graph: Subgraph) -> str | None:
    """None if the Edge TPU can take this operator, else the broken constraint with the actual value."""
    return check(op, graph)[0]


def check(op: Operator, graph: Subgraph) -> tuple[str | None, str]:
    """(reason, status): the broken constraint (None when the Edge TPU can take the operator), and what the
    compiler's operator table says for it (compiler_limits: its own words)."""
    if op.custom:
        return (f"custom operator {op.opcode!r}: the Edge TPU runs only builtin operators from Coral's table",
                learned.UNSUPPORTED_DATA_TYPE)  # a compiler log's "CUSTOM ... unsupported data type"
    if op.opcode not in SUPPORTED_OPS:
        hint = UNSUPPORTED_HINTS.get(op.opcode)
        # the compiler checks the types first: its logs say "unsupported data type" for a DEQUANTIZE
        status = learned.UNSUPPORTED_DATA_TYPE if _types(op, graph) else learned.NOT_AN_EDGETPU_OP
        return (f"{op.opcode} is not an Edge TPU operation (not in Coral's supported-operations table)"
                + (f": {hint}" if hint else ""), status)
    # the operator's own limit first: it names the cause (a PAD of the batch) rather than its effect (a batch of 2)
    for rules, status in ((BASIC_RULES, learned.UNSUPPORTED_DATA_TYPE),
                          (OP_LIMITS.get(op.opcode, ()), learned.UNSPECIFIED_LIMITATION),
                          (SHAPE_RULES, learned.UNSUPPORTED_RANK),
                          (SIZE_RULES, learned.UNSPECIFIED_LIMITATION)):
        for rule in rules:
            reason = rule(op, graph)
            if reason is not None:
                return reason, _compiler_status(op, graph, status)
    return None, learned.MAPPED


def _compiler_status(op: Operator, graph: Subgraph, status: str) -> str:
    # A float input's QUANTIZE: the compiler's log says "otherwise supported, but not mapped" (an int8 model's
    # float edge), not "unsupported data type" as for a DEQUANTIZE.
    if op.opcode == "QUANTIZE" and graph.tensors[op.inputs[0]].type not in EIGHT_BIT:
        return learned.UNSPECIFIED_LIMITATION
    return status


def doubt(op: Operator, graph: Subgraph) -> str | None:
    """Why the measured compiler output does not confirm that the Edge TPU takes this operator (None: it does)."""
    for measure in MEASURES.get(op.opcode, ()) + (_inner_plane,):
        limit, value, what = measure(op, graph)
        if limit.unsure(value):
            return (f"{what} is {learned.number(value)}: between the largest seen mapped and the smallest seen refused "
                    f"({limit.bounds()}); predicted to map")
    if op.opcode not in learned.SEEN_MAPPED:
        return UNCONFIRMED_OP.format(name=SUPPORTED_OPS[op.opcode], opcode=op.opcode)
    return None


# ---- model requirements (every operator) -------------------------------------------------------

def _used(indices) -> list[int]:
    return [i for i in indices if i >= 0]  # -1: an omitted optional input


def _data_operands(op: Operator) -> list[int]:
    """The tensors that carry activations through the TPU (an LSTM's other inputs are its parameters and state)."""
    if op.opcode == "UNIDIRECTIONAL_SEQUENCE_LSTM":
        return _used(op.inputs[:1]) + _used(op.outputs)
    return _used(op.inputs) + _used(op.outputs)


def _types(op: Operator, graph: Subgraph) -> str | None:
    for index in _data_operands(op):
        tensor = graph.tensors[index]
        if tensor.is_constant:
            if tensor.type not in CONSTANT_TYPES:
                return (f"constant tensor {tensor.name!r} is {tensor.type}: the Edge TPU takes int8/uint8 "
                        "parameters (int32 biases and shapes); the model is not fully integer-quantized")
        elif tensor.type not in EIGHT_BIT:
            return (f"tensor {tensor.name!r} is {tensor.type}: the Edge TPU computes on int8/uint8 tensors only "
                    "(full-integer quantization)")
        elif tensor.quantization is None:
            return f"tensor {tensor.name!r} is {tensor.type} without quantization parameters: not a quantized model"
    return None


def _static_shapes(op: Operator, graph: Subgraph) -> str | None:
    """No dimension decided at run time. A batch left open in the signature ([-1, 28, 28]) over a static shape of
    batch 1 is the compiler's batch 1: it maps such a model (MarcelloCeresini/Franco, compiler 15.0, all 3 ops)."""
    for index in _used(op.inputs) + _used(op.outputs):
        tensor = graph.tensors[index]
        if tensor.is_dynamic and not _open_batch_only(tensor):
            return (f"tensor {tensor.name!r} has a dynamic shape {list(tensor.shape_signature)}: the Edge TPU needs "
                    "static shapes (export with a fixed batch size of 1)")
    return None


def _open_batch_only(tensor: Tensor) -> bool:
    signature = tensor.shape_signature
    return len(signature) == len(tensor.shape) > 1 and -1 not in signature[1:] and tensor.shape[0] == 1


def _effective_rank(op: Operator, graph: Subgraph) -> str | None:
    for index in _data_operands(op):
        tensor = graph.tensors[index]
        if tensor.is_constant:
            continue  # parameters are laid out by the compiler
        outer = tensor.shape[:-MAX_EFFECTIVE_RANK]
        if any(d != 1 for d in outer):
            batch = f" (batch {tensor.shape[0]}: the Edge TPU runs batch 1 only)" if len(tensor.shape) == 4 else ""
            return (f"tensor {tensor.name!r} has shape {list(tensor.shape)}: only the {MAX_EFFECTIVE_RANK} innermost "
                    f"dimensions may be larger than 1 (effective rank <= {MAX_EFFECTIVE_RANK}){batch}")
    return None


def _batch_one(op: Operator, graph: Subgraph) -> str | None:
    """A [batch, features] model input must have batch 1.

    For 4-D tensors the effective-rank rule is the batch rule; a 3-D tensor is [y, x, z] to the
    Edge TPU (Coral's Squeeze example), so only the 2-D Keras convention is checked here.
    """
    for index in _used(op.inputs):
        tensor = graph.tensors[index]
        if index in graph.inputs and len(tensor.shape) == 2 and tensor.shape[0] != 1:
            return (f"model input {tensor.name!r} has shape {list(tensor.shape)}, batch {tensor.shape[0]}: "
                    "the Edge TPU runs batch 1 only")
    return None


def _op_version(op: Operator, graph: Subgraph) -> str | None:
    refused = COMPILER_16_REFUSED_FROM.get(op.opcode)
    if refused is not None and op.version >= refused:
        return (f"{op.opcode} version {op.version}: edgetpu_compiler 16.0 refuses the whole model from version "
                f"{refused} (\"Didn't find op for builtin opcode\"); produce the model with an older converter "
                "or one that writes lower op versions")
    return None


@dataclass(frozen=True)
class OpVersionNote:
    """What is known about one (operator, version) pair of a model and edgetpu_compiler 16.0."""

    opcode: str
    version: int
    status: str  # "accepted", "refused" or "unknown"
    text: str


def op_version_notes(model: TfliteModel) -> list[OpVersionNote]:
    """Per distinct (operator, version) in the graph: accepted, refused, or unknown to us (see COMPILER_16_REFUSED_FROM)."""
    notes = []
    for opcode, version in sorted({(op.opcode, op.version) for op in model.graph.operators if not op.custom}):
        refused = COMPILER_16_REFUSED_FROM.get(opcode)
        if opcode not in SUPPORTED_OPS:
            continue  # not an Edge TPU op at any version: the analysis says so
        if refused is not None and version >= refused:
            notes.append(OpVersionNote(opcode, version, "refused",
                                       f"{opcode} v{version}: edgetpu_compiler 16.0 refuses v{refused} and later"))
        elif version == 1:
            notes.append(OpVersionNote(opcode, version, "accepted", f"{opcode} v1: registered in every compiler"))
        else:
            bound = f" (v{refused} and later are refused)" if refused else ""
            notes.append(OpVersionNote(opcode, version, "unknown",
                                       f"{opcode} v{version}: whether edgetpu_compiler 16.0 registers it is not "
                                       f"documented{bound}; only the compiler can tell"))
    return notes


BASIC_RULES: tuple[Rule, ...] = (_op_version, _static_shapes, _types)
SHAPE_RULES: tuple[Rule, ...] = (_batch_one, _effective_rank)


# ---- per-operator limits (Coral's table) ---------------------------------------------------------

def _activation_name(code: int) -> str:
    names = {v: k for k, v in vars(schema().ActivationFunctionType).items() if not k.startswith("_")}
    return names.get(code, str(code))


def _no_fused_activation(op: Operator, graph: Subgraph) -> str | None:
    code = op.options.get("fusedActivationFunction", 0)
    if code:
        return (f"{op.opcode} has a fused {_activation_name(code)} activation: the Edge TPU's "
                f"{SUPPORTED_OPS[op.opcode]} takes no fused activation function")
    return None


def _same_dilation(op: Operator, graph: Subgraph) -> str | None:
    w, h = op.options.get("dilationWFactor", 1), op.options.get("dilationHFactor", 1)
    if w != h:
        return f"dilation {w} in x and {h} in y: the Edge TPU needs the same dilation in x and y"
    return None


def _constant_parameters(op: Operator, graph: Subgraph) -> str | None:
    """Weights (input 1) and bias (input 2) must be known at compile time."""
    for index in _used(op.inputs[1:3]):
        tensor = graph.tensors[index]
        if not tensor.is_constant:
            return (f"parameter tensor {tensor.name!r} of {op.opcode} is computed at run time: the Edge TPU needs "
                    "weights and biases that are constant at compile time")
    return None


def _innermost_only(shape: tuple[int, ...]) -> bool:
    """1-D in effect: every dimension but the last is 1."""
    return all(d == 1 for d in shape[:-1])


def _fully_connected(op: Operator, graph: Subgraph) -> str | None:
    weights_format = op.options.get("weightsFormat", 0)
    if weights_format:
        names = {v: k for k, v in vars(schema().FullyConnectedOptionsWeightsFormat).items() if not k.startswith("_")}
        return (f"FULLY_CONNECTED weights in {names.get(weights_format, weights_format)} format: the Edge TPU "
                "takes only the default format")
    output = graph.tensors[op.outputs[0]]
    if not _innermost_only(output.shape):
        return (f"FULLY_CONNECTED output {output.name!r} has shape {list(output.shape)}: the Edge TPU needs a "
                "one-dimensional output (every dimension but the last 1)")
    return None


def _softmax(op: Operator, graph: Subgraph) -> str | None:
    """Over the innermost axis, at most MAX_SOFTMAX_ELEMENTS. Coral's table says one-dimensional, but compiler 16
    maps a YOLOv8 DFL's SOFTMAX over [1, 4, 756, 16] (sebastianfis/edgetpu-yolo, 192 x 192: "SOFTMAX 1 Mapped to
    Edge TPU"), and at 640 leaves [1, 4, 8400, 16] out only for what it depends on."""
    tensor = graph.tensors[op.inputs[0]]
    size = tensor.shape[-1] if tensor.shape else 1
    if size > MAX_SOFTMAX_ELEMENTS:
        return f"SOFTMAX over {size} elements: the Edge TPU's softmax takes at most {MAX_SOFTMAX_ELEMENTS}"
    return None


def _constant(op: Operator, graph: Subgraph, position: int, what: str) -> tuple[np.ndarray | None, str | None]:
    """The constant operand at `position` (axis, paddings, strides), or the reason it cannot be read."""
    if position >= len(op.inputs) or op.inputs[position] < 0:
        return None, f"{op.opcode} has no {what} input"
    tensor: Tensor = graph.tensors[op.inputs[position]]
    if not tensor.is_constant:
        return None, f"{op.opcode}'s {what} ({tensor.name!r}) is computed at run time: the Edge TPU needs it constant"
    return tensor.data, None


def _strided_slice(op: Operator, graph: Subgraph) -> str | None:
    strides, problem = _constant(op, graph, 3, "strides")
    if problem:
        return problem
    if np.any(strides != 1):
        return f"STRIDED_SLICE strides {strides.tolist()}: the Edge TPU needs all strides equal to 1"
    for mask in ("ellipsisMask", "newAxisMask"):
        if op.options.get(mask, 0):
            return f"STRIDED_SLICE {mask} {op.options[mask]}: the Edge TPU needs it 0"
    return None


def _concatenation(op: Operator, graph: Subgraph) -> str | None:
    """A constant input is allowed only as zero padding: exactly 2 inputs, the constant all (real) zeros."""
    inputs = [graph.tensors[i] for i in _used(op.inputs)]
    constants = [t for t in inputs if t.is_constant]
    if not constants:
        return None
    if len(inputs) != 2:
        return (f"CONCATENATION of {len(inputs)} inputs with a constant one ({constants[0].name!r}): with a "
                "constant input the Edge TPU needs exactly 2 inputs (a zero padding)")
    constant = constants[0]
    # real = scale * (q - zero_point): the real value is 0 exactly where q == zero_point
    zero_point = constant.quantization.zero_point if constant.quantization is not None else np.zeros(1, np.int64)
    if constant.data.size and not np.all(constant.data.astype(np.int64) == zero_point.reshape(-1)[0]):
        return (f"CONCATENATION with constant input {constant.name!r} that is not all zeros: the Edge TPU takes a "
                "constant input only as zero padding")
    return None


def _axes(op: Operator, graph: Subgraph, position: int, rank: int) -> tuple[list[int], str | None]:
    data, problem = _constant(op, graph, position, "axis")
    if problem:
        return [], problem
    return sorted({int(a) % max(rank, 1) for a in np.asarray(data).reshape(-1)}), None


def _batch_axes(rank: int) -> range:
    """Dimensions outside the innermost three: the batch, to the Edge TPU."""
    return range(max(0, rank - MAX_EFFECTIVE_RANK))


def _no_batch_reduction(op: Operator, graph: Subgraph) -> str | None:
    shape = graph.tensors[op.inputs[0]].shape
    axes, problem = _axes(op, graph, 1, len(shape))
    if problem:
        return problem
    batch = [a for a in axes if a in _batch_axes(len(shape))]
    if batch:
        return (f"{op.opcode} reduces axes {axes} of shape {list(shape)}, including the batch dimension: the "
                "Edge TPU cannot reduce over the batch")
    if op.opcode == "MEAN" and len(shape) - 1 in axes and shape[-1] % MEAN_Z_MULTIPLE:
        return (f"MEAN reduces the innermost (z) dimension of size {shape[-1]}: the Edge TPU needs it a "
                f"multiple of {MEAN_Z_MULTIPLE}")
    return None


def _no_batch_padding(op: Operator, graph: Subgraph) -> str | None:
    shape = graph.tensors[op.inputs[0]].shape
    paddings, problem = _constant(op, graph, 1, "paddings")
    if problem:
        return problem
    paddings = np.asarray(paddings).reshape(-1, 2)
    for axis in _batch_axes(len(shape)):
        if axis < len(paddings) and np.any(paddings[axis] != 0):
            return f"PAD pads the batch dimension by {paddings[axis].tolist()}: the Edge TPU cannot pad the batch"
    return None


def _no_batch_packing(op: Operator, graph: Subgraph) -> str | None:
    rank = len(graph.tensors[op.outputs[0]].shape)
    axis = op.options.get("axis", 0) % max(rank, 1)
    if axis in _batch_axes(rank):
        return f"PACK along axis {axis} of a rank-{rank} output, the batch dimension: the Edge TPU cannot pack the batch"
    return None


def _no_batch_split(op: Operator, graph: Subgraph) -> str | None:
    """Not along the batch; for a rank-3 tensor not along its outermost axis either: YOLO11's C2PSA attention
    splits [2, 64, 32] into two [1, 64, 32] and compiler 16 leaves that SPLIT on the CPU with nothing before it
    there (mark81681/rasp yolo11n_full_integer_quant_edgetpu.tflite, 256 x 256)."""
    # SPLIT's inputs are (axis, tensor)
    shape = graph.tensors[op.inputs[1]].shape
    axes, problem = _axes(op, graph, 0, len(shape))
    if problem:
        return problem
    if any(a in _batch_axes(len(shape)) for a in axes):
        return f"SPLIT along axis {axes[0]} of shape {list(shape)}, the batch dimension: the Edge TPU cannot split the batch"
    if len(shape) == MAX_EFFECTIVE_RANK and 0 in axes and shape[0] > 1:
        return (f"SPLIT along the outermost axis of shape {list(shape)}: edgetpu_compiler 16 leaves it on the CPU "
                "(YOLO11's attention, a compiled yolo11n)")
    return None


def _prelu_alpha(op: Operator, graph: Subgraph) -> str | None:
    alpha = graph.tensors[op.inputs[1]]
    if not _innermost_only(alpha.shape):
        return (f"PRELU alpha {alpha.name!r} has shape {list(alpha.shape)}: the Edge TPU needs it one-dimensional "
                "(in Keras, PReLU(shared_axes=[1, 2]))")
    return None


def _squeeze_leading(op: Operator, graph: Subgraph) -> str | None:
    """Only leading 1s may be squeezed (no relayout): [1, 5, 10] -> [5, 10] is fine, [5, 1, 10] -> [5, 10] is not."""
    shape = graph.tensors[op.inputs[0]].shape
    dims = [d % len(shape) for d in op.options.get("squeezeDims") or []] or [i for i, d in enumerate(shape) if d == 1]
    first_large = next((i for i, d in enumerate(shape) if d != 1), len(shape))
    late = [d for d in dims if d > first_large]
    if late:
        return (f"SQUEEZE removes dimension {late[0]} of shape {list(shape)}, after a dimension larger than 1: "
                "the Edge TPU squeezes only leading 1s")
    return None


# ---- limits the compiler's output shows (compiler_limits) -------------------------------------------------------

# A measure: (the limit, the operator's value, what was measured in words).
Measure = Callable[[Operator, Subgraph], tuple[learned.Limit, float, str]]


def _inner_plane(op: Operator, graph: Subgraph) -> tuple[learned.Limit, float, str]:
    """The largest of the operator's tensors in its two innermost dimensions."""
    tensors = [graph.tensors[i] for i in _data_operands(op) if not graph.tensors[i].is_constant]
    sizes = [(int(np.prod(t.shape[-2:])) if t.shape else 1, t) for t in tensors]
    value, tensor = max(sizes, key=lambda pair: pair[0], default=(0, None))
    what = "no tensor" if tensor is None else \
        f"tensor {tensor.name!r} {list(tensor.shape)}: the count of values in its two innermost dimensions"
    return learned.INNER_PLANE, value, what


def _values_moved(limit: learned.Limit) -> Measure:
    def measure(op: Operator, graph: Subgraph) -> tuple[learned.Limit, float, str]:
        tensor = graph.tensors[op.inputs[0]]
        return limit, int(np.prod(tensor.shape)), f"the {op.opcode} of {list(tensor.shape)}: the count of values it moves"
    return measure


def _bilinear_scale(op: Operator, graph: Subgraph) -> tuple[learned.Limit, float, str]:
    source, result = graph.tensors[op.inputs[0]].shape, graph.tensors[op.outputs[0]].shape
    if len(source) != 4 or len(result) != 4:
        return learned.BILINEAR_SCALE, 1, "RESIZE_BILINEAR"
    scale = max(result[1] / max(source[1], 1), result[2] / max(source[2], 1))
    return (learned.BILINEAR_SCALE, scale,
            f"RESIZE_BILINEAR {list(source)} -> {list(result)}: its scale factor")


MEASURES: dict[str, tuple[Measure, ...]] = {
    "TRANSPOSE": (_values_moved(learned.TRANSPOSE_VALUES),),
    "RESHAPE": (_values_moved(learned.RESHAPE_VALUES),),
    "RESIZE_BILINEAR": (_bilinear_scale,),
}


def _refused(measure: Measure) -> Rule:
    """The rule a measured limit makes: refused from the smallest value the compiler's output shows refused."""
    def rule(op: Operator, graph: Subgraph) -> str | None:
        limit, value, what = measure(op, graph)
        if limit.refuses(value):
            return f"{what} is {learned.number(value)}: edgetpu_compiler 16 leaves that on the CPU ({limit.bounds()})"
        return None
    return rule


SIZE_RULES: tuple[Rule, ...] = (_refused(_inner_plane),)


OP_LIMITS: dict[str, tuple[Rule, ...]] = {
    "AVERAGE_POOL_2D": (_no_fused_activation,),
    "MAX_POOL_2D": (_no_fused_activation,),
    "CONV_2D": (_same_dilation, _constant_parameters),
    "DEPTHWISE_CONV_2D": (_same_dilation, _constant_parameters),
    "FULLY_CONNECTED": (_fully_connected, _constant_parameters),
    "SOFTMAX": (_softmax,),
    "STRIDED_SLICE": (_strided_slice,),
    "CONCATENATION": (_no_fused_activation, _concatenation),
    "MEAN": (_no_batch_reduction,),
    "SUM": (_no_batch_reduction,),
    "REDUCE_MAX": (_no_batch_reduction,),
    "REDUCE_MIN": (_no_batch_reduction,),
    "PAD": (_no_batch_padding,),
    "PACK": (_no_batch_packing,),
    "SPLIT": (_no_batch_split,),
    "PRELU": (_prelu_alpha,),
    "SQUEEZE": (_squeeze_leading,),
    **{opcode: tuple(_refused(m) for m in measures) for opcode, measures in MEASURES.items()},
}


# ---- advice: the traps YOLO exports fall into ------------------------------------------------------------------

# The strides of YOLO heads (P3-P5): an input side not a multiple of the largest leaves grids that do not tile it.
YOLO_STRIDES = (8, 16, 32)
# The input side Frigate's YOLOv9 for the Coral and Ultralytics' Coral guide use; larger heads map worse.
YOLO_CORAL_SIDE = 320
DFL_BINS = 16


def advise(model: TfliteModel) -> list[Advice]:
    """What to change for more of the model to map, where it shows a known trap (none for a clean model)."""
    graph = model.graph
    found = []
    for rule in (_silu_advice, _hard_swish_advice, _dfl_advice, _transpose_advice, _attention_advice,
                 _pack_upsampling_advice, _input_advice):
        advice = rule(graph)
        if advice is not None:
            found.append(advice)
    if len(model.subgraphs) > 1:
        found.append(Advice(
            "subgraphs", (), f"the file holds {len(model.subgraphs)} subgraphs (control flow: WHILE or IF, e.g. an "
            "NMS exported inside the model); the Edge TPU and this analysis take the first",
            "export without control flow (Ultralytics: nms=False); this service runs NMS on the CPU after the model",
            "ultralytics/ultralytics#4719 (\"More than one subgraph is not supported\")"))
    return found


def _count(n: int, thing: str) -> str:
    return f"{n} {thing}" + ("" if n == 1 else "s")


def _silu_advice(graph: Subgraph) -> Advice | None:
    """SiLU: a LOGISTIC whose output a MUL multiplies by the LOGISTIC's own input (x * sigmoid(x))."""
    pairs = []
    for op in graph.operators:
        if op.opcode != "LOGISTIC":
            continue
        x, s = op.inputs[0], op.outputs[0]
        partner = next((m for m in graph.operators if m.opcode == "MUL" and set(m.inputs[:2]) == {x, s}), None)
        if partner is not None:
            pairs += [op.index, partner.index]
    if not pairs:
        return None
    return Advice(
        "SiLU", tuple(pairs), f"{_count(len(pairs) // 2, 'SiLU activation')} (LOGISTIC then MUL by its input): each maps "
        "(a YOLOv8n's 57 all do), at twice an activation's work: the Edge TPU's time goes to them",
        "train or fine-tune with ReLU6 (or ReLU) instead of SiLU, as Frigate's YOLOv9 for the Coral does (mAP50 "
        "40.6% at 10 ms, 320x320 int8)",
        "ultralytics/ultralytics#4719; ultralytics#18615 (yolo11n at 320: 53 ms on a USB Coral); "
        "blakeblackshear/frigate#21124; nerbivol/edgetpu_lite's log (LOGISTIC 57 and MUL 57 mapped)")


def _hard_swish_advice(graph: Subgraph) -> Advice | None:
    ops = tuple(op.index for op in graph.operators if op.opcode == "HARD_SWISH")
    if not ops:
        return None
    return Advice("HARD_SWISH", ops, f"{_count(len(ops), 'HARD_SWISH op')}: not an Edge TPU operation; "
                  "each runs on the CPU with everything that depends on it", "use ReLU6 where HARD_SWISH is (its int8 range maps), then re-export",
                  "google-coral/edgetpu#272 (YOLOv5s at 320: 370 ms with HardSwish, 100 ms without)")


def _dfl_advice(graph: Subgraph) -> Advice | None:
    """A YOLO head decoded inside the graph: a SOFTMAX over 16 DFL bins (then the expected bin, the anchors)."""
    ops = tuple(op.index for op in graph.operators if op.opcode == "SOFTMAX"
                and graph.tensors[op.inputs[0]].shape[-1:] == (DFL_BINS,)
                and not _innermost_only(graph.tensors[op.inputs[0]].shape))
    if not ops:
        return None
    shape = list(graph.tensors[graph.operators[ops[0]].inputs[0]].shape)
    return Advice(
        "DFL decode", ops, f"the boxes are decoded inside the model: a SOFTMAX over {DFL_BINS} bins of {shape}, then "
        "the anchors' arithmetic; edgetpu_compiler 16 maps all of it at 192 x 192, but at larger inputs the head's "
        "TRANSPOSE and RESHAPE ops grow past what it takes and the decode runs on the CPU after them",
        "export the head undecoded: class logits [1, N, C] and DFL distributions [1, N, 64] (the Coral layout "
        "Frigate's yolo-generic reads); this service decodes them on the CPU (model.json detection.decoder yolo_dfl)",
        "blakeblackshear/frigate#21124; ultralytics/ultralytics#4719; sebastianfis/edgetpu-yolo "
        "yolov8n_retrained192_full_integer_quant_edgetpu.log (every op mapped, SOFTMAX included); "
        "docs/edgetpu-compiler.md")


def _transpose_advice(graph: Subgraph) -> Advice | None:
    """A TRANSPOSE larger than any the compiler's output shows mapped."""
    ops = [op for op in graph.operators if op.opcode == "TRANSPOSE"]
    sizes = {op.index: int(np.prod(graph.tensors[op.inputs[0]].shape)) for op in ops}
    large = [op for op in ops if sizes[op.index] > learned.TRANSPOSE_VALUES.mapped_up_to]
    if not large:
        return None
    largest = max(large, key=lambda op: sizes[op.index])
    shape = list(graph.tensors[largest.inputs[0]].shape)
    limit = learned.TRANSPOSE_VALUES
    return Advice(
        "TRANSPOSE", tuple(op.index for op in large),
        f"{_count(len(large), 'TRANSPOSE op')} larger than edgetpu_compiler 16 is seen to map, the largest of {shape} ({sizes[largest.index]:,} values): it maps one of up to "
        f"{learned.number(limit.mapped_up_to)} values and refuses one of {learned.number(limit.refused_from)} or more "
        "(\"not mapped due to some unspecified limitation\"), and everything that depends on it runs on the CPU",
        "keep the layout the convolutions make (NHWC) to the end: a YOLO head's [1, N, 4 + C] needs no transpose "
        "(this service reads it: detection.layout anchors_first); or export at a smaller input",
        "google-coral/edgetpu#868 (a YOLOv8n maps whole at 192 and not at 640, the transpose breaking it); "
        "ultralytics/ultralytics#4089 (1 TRANSPOSE mapped, 4 not); docs/edgetpu-compiler.md")


def _attention_advice(graph: Subgraph) -> Advice | None:
    """YOLO11's C2PSA attention: a batched matmul (BATCH_MATMUL, or FULLY_CONNECTED with a computed filter)."""
    ops = tuple(op.index for op in graph.operators if op.opcode == "BATCH_MATMUL" or (
        op.opcode == "FULLY_CONNECTED" and len(op.inputs) > 1 and op.inputs[1] >= 0
        and not graph.tensors[op.inputs[1]].is_constant))
    if not ops:
        return None
    return Advice(
        "attention", ops, f"{_count(len(ops), 'matrix product')} of two computed tensors (an attention block, such "
        "as YOLO11's C2PSA): the Edge TPU multiplies only by constant weights, and edgetpu_compiler 16 stops before "
        "the block (its TRANSPOSE at 640, its SPLIT of [2, 64, N] at 256), leaving it and everything after it, "
        "the neck and the head, to the CPU",
        "for the Coral, use a model without attention (YOLOv8, or YOLO11 with the C2PSA block removed); this service "
        "runs the whole model on cpu or emulated",
        "compiled yolo11n files: mark81681/rasp, freedomwebtech/yolo11-appwrite-rpi4 (256), ClemF4/Cattainer, "
        "JavierSupr/Coral-Inference (640); docs/edgetpu-compiler.md")


def _pack_upsampling_advice(graph: Subgraph) -> Advice | None:
    """The TF object-detection API's nearest-neighbour upsampling: PACK of one tensor repeated, into rank 5 or 6."""
    ops = tuple(op.index for op in graph.operators if op.opcode == "PACK" and len(set(op.inputs)) == 1
                and len(op.inputs) > 1 and len(graph.tensors[op.outputs[0]].shape) > MAX_EFFECTIVE_RANK + 1)
    if not ops:
        return None
    return Advice(
        "PACK upsampling", ops, f"{_count(len(ops), 'PACK op')} stacking a tensor on itself into rank "
        f"{max(len(graph.tensors[graph.operators[i].outputs[0]].shape) for i in ops)}: the TF object-detection API's "
        "nearest-neighbour upsampling (tf.stack, then a reshape) in an FPN; beyond the Edge TPU's 3 dimensions",
        "export with the FPN feature extractor's use_native_resize_op: true, so the upsampling is a "
        "RESIZE_NEAREST_NEIGHBOR, which maps; this service runs the file as it is on cpu and emulated",
        "TF object-detection API, object_detection/utils/ops.py nearest_neighbor_upsampling; TF2 \"SSD MobileNetV2 "
        "FPNLite 320\" exports map 66 of 160 ops, the first to fall off a PACK")


def _yolo_head(graph: Subgraph, width: int, height: int) -> bool:
    """Outputs shaped like a YOLO head's at this input: [1, A, N] or [1, N, A] with N the anchor count (one or
    three a cell) of strides 8, 16, 32."""
    cells = sum((height // s) * (width // s) for s in YOLO_STRIDES)
    for index in graph.outputs:
        shape = graph.tensors[index].shape
        if len(shape) == 3 and ({cells, 3 * cells} & set(shape[1:])):
            return True
    return False


def _input_advice(graph: Subgraph) -> Advice | None:
    if len(graph.inputs) != 1:
        return None
    shape = graph.tensors[graph.inputs[0]].shape
    if len(shape) != 4:
        return None
    height, width = shape[1], shape[2]
    largest = YOLO_STRIDES[-1]
    if height % largest or width % largest:
        if not _yolo_head(graph, width, height) and not any(op.opcode == "SOFTMAX" for op in graph.operators):
            return None
        return Advice("input size", (), f"the input is {width}x{height}, not a multiple of {largest}: a YOLO head's "
                      f"grids (strides {', '.join(map(str, YOLO_STRIDES))}) do not tile it",
                      f"export at a multiple of {largest}, e.g. {YOLO_CORAL_SIDE}x{YOLO_CORAL_SIDE}",
                      "ultralytics/ultralytics#18615")
    if max(width, height) > YOLO_CORAL_SIDE and _yolo_head(graph, width, height):
        factor = width * height / YOLO_CORAL_SIDE**2
        return Advice("input size", (), f"a YOLO head at {width}x{height}: its tensors are {factor:g}x those at "
                      f"{YOLO_CORAL_SIDE}x{YOLO_CORAL_SIDE}, where large RESHAPE and TRANSPOSE ops stop mapping "
                      "(Coral's table: \"certain reshapes might not be mapped for large tensor sizes\")",
                      f"export at {YOLO_CORAL_SIDE}x{YOLO_CORAL_SIDE}, as Frigate's YOLO for the Coral and "
                      "Ultralytics' Coral benchmarks do",
                      "google-coral/edgetpu#868; ultralytics/ultralytics#18615; blakeblackshear/frigate#21124")
    return None
