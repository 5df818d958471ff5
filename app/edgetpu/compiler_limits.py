"""What edgetpu_compiler 16 does that Coral's supported-operations table does not say, learned from its own output.

The ground truth is public: compiler logs (`*_edgetpu.log`, a line per operator type and status) and compiled
files (`*_edgetpu.tflite`, whose operators other than `edgetpu-custom-op` are the ones left on the CPU), each
beside the plain int8 file that was compiled. docs/edgetpu-compiler.md names every file (repository, path,
commit, sha256) and bench/edgetpu_agreement.py measures this analysis against them. What they teach:

  - the compiler maps one subgraph and follows the data, not the operator order: an operator it can take stays
    on the Edge TPU unless one of its inputs comes through an operator the CPU runs after the Edge TPU's part
    ("More than one subgraph is not supported"); a branch that does not depend on the refused operator maps;
  - it maps some operators the table leaves out (TRANSPOSE, TILE), and a SOFTMAX over the innermost axis of a
    larger tensor (a YOLOv8 DFL's [1, 4, N, 16]), which the table calls one-dimensional only;
  - it refuses operators on large tensors ("Operation is otherwise supported, but not mapped due to some
    unspecified limitation"): the limits below.

A limit is known only as far as the files show it: the largest value seen mapped and the smallest seen refused.
Between the two nobody here has seen the compiler decide; the analysis predicts that the operator maps (Coral's
table says it is supported) and says that it is unsure.
"""

from __future__ import annotations

from dataclasses import dataclass

# The compiler's own words in its operator table, for the statuses this analysis predicts.
MAPPED = "Mapped to Edge TPU"
MORE_THAN_ONE_SUBGRAPH = "More than one subgraph is not supported"
UNSPECIFIED_LIMITATION = "Operation is otherwise supported, but not mapped due to some unspecified limitation"
UNSUPPORTED_DATA_TYPE = "Operation is working on an unsupported data type"
UNSUPPORTED_RANK = "Tensor has unsupported rank (up to 3 innermost dimensions mapped)"
# For an operator the compiler has no Edge TPU kernel for, no log here shows its wording: this is ours; and for a
# model it will not parse (an operator version it does not register) it writes no table at all.
NOT_AN_EDGETPU_OP = "not an Edge TPU operation"
MODEL_REFUSED = "no table: edgetpu_compiler refuses the whole model"


@dataclass(frozen=True)
class Limit:
    """A size past which edgetpu_compiler leaves an operator on the CPU, bounded by what its output has shown."""

    what: str             # the measure, in words: "values in a tensor's two innermost dimensions"
    mapped_up_to: float   # the largest value a compiler log or compiled file shows mapped
    refused_from: float   # the smallest value one shows refused
    mapped_seen: str      # where: the operator, its shape and the file
    refused_seen: str

    def refuses(self, value: float) -> bool:
        return value >= self.refused_from

    def unsure(self, value: float) -> bool:
        """Between the largest value seen mapped and the smallest seen refused: nobody here has seen the compiler."""
        return self.mapped_up_to < value < self.refused_from

    def bounds(self) -> str:
        return (f"mapped up to {number(self.mapped_up_to)} ({self.mapped_seen}), refused from "
                f"{number(self.refused_from)} ({self.refused_seen})")


def number(value: float) -> str:
    """1632000 -> '1,632,000'; 15.545454 -> '15.5455'."""
    return f"{int(value):,}" if float(value).is_integer() else f"{value:.6g}"


# Ultralytics' YOLOv8n head at 320 and 640: LOGISTIC, QUANTIZE, STRIDED_SLICE, CONCATENATION and RESHAPE on
# [1, C, N] tensors map up to 84 x 2100 and are refused from 144 x 1600 on; YOLOv5n's [1, 3N, 85] RESHAPE and
# CONCATENATION likewise. What counts is the two innermost dimensions: the DFL's [1, 4, 8400, 16] (4.5 times as
# many values as 84 x 2100 in all, 134,400 in its innermost two) maps.
INNER_PLANE = Limit(
    "values in a tensor's two innermost dimensions", 176_400, 230_400,
    "CONCATENATION to [1, 84, 2100], YOLOv8n at 320, MRezqalla/GoalBuddy Models/TPU",
    "RESHAPE [1, 144, 40, 40] -> [1, 144, 1600], the same file; STRIDED_SLICE of [1, 144, 2100] there too")

# The YOLOv8n head's NHWC -> NCHW TRANSPOSE of each level: [1, 20, 20, 144] maps at 640, [1, 40, 40, 64] (a two
# class YOLOv8n at 320) and [1, 40, 40, 144] do not; nor the DFL's [1, 4, 16, 2100]. The innermost dimensions do
# not explain it ([1, 40, 40, 64] -> [1, 64, 40, 40] is small in both); the number of values moved does.
TRANSPOSE_VALUES = Limit(
    "values a TRANSPOSE moves", 57_600, 102_400,
    "[1, 20, 20, 144], YOLOv8n at 640, nerbivol/edgetpu_lite",
    "[1, 40, 40, 64], a YOLOv8n at 320, ClemF4/Cattainer cattainer-core/model_edgetpu.tflite")

# YOLOv5's Detect head reshapes each level's [1, H, W, 255] to [1, H*W, 3, 85]: at 640 the 40 x 40 level's maps
# and the 80 x 80 level's does not, though neither tensor is large in its innermost two dimensions.
RESHAPE_VALUES = Limit(
    "values a RESHAPE moves", 408_000, 1_632_000,
    "[1, 40, 40, 255] -> [1, 1600, 3, 85], YOLOv5n at 640, Sandhya1708/modelnew and pine-book/MyYolov5",
    "[1, 80, 80, 255] -> [1, 6400, 3, 85], the same files")

# Coral's table: ResizeBilinear "might not be mapped to avoid loss in precision", depending on the sizes. MoveNet's
# 2x upsamplings map; DeepLab v3's 1 x 1 -> 33 x 33 image pooling does not, nor the 33 -> 513 output resize of
# Coral's slim DeepLab (which replaces the first with a TILE, and that maps).
BILINEAR_SCALE = Limit(
    "RESIZE_BILINEAR's scale factor", 2, 513 / 33,
    "[1, 24, 24, 24] -> [1, 48, 48, 24], MoveNet Lightning, google-coral/test_data",
    "[1, 33, 33, 19] -> [1, 513, 513, 19], deeplab_mobilenet_edgetpu_slim_cityscapes_quant, google-coral/test_data")

LIMITS = (INNER_PLANE, TRANSPOSE_VALUES, RESHAPE_VALUES, BILINEAR_SCALE)

# Operators outside Coral's table that edgetpu_compiler 16 maps, and where that was seen.
BEYOND_THE_TABLE: dict[str, str] = {
    "TRANSPOSE": "YOLOv8n's [1, 20, 20, 144] at 640 (nerbivol/edgetpu_lite, MRezqalla/GoalBuddy logs: \"TRANSPOSE 1 "
                 "Mapped to Edge TPU\")",
    "TILE": "deeplab_mobilenet_edgetpu_slim_cityscapes_quant (google-coral/test_data): [1, 1, 1, 128] -> "
            "[1, 33, 33, 128] inside its compiled custom op",
}

# Operator types a compiled file in the measured set shows mapped (docs/edgetpu-compiler.md; the measurement,
# converter/compiler_agreement.py, says when this list and the set part). A type from Coral's table that is not
# here is taken as supported on the table's word alone, and the analysis says that no compiler output it was
# checked against confirms it.
SEEN_MAPPED: frozenset[str] = frozenset({
    "ADD", "AVERAGE_POOL_2D", "CONCATENATION", "CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED", "LOGISTIC",
    "MAX_POOL_2D", "MEAN", "MUL", "PAD", "QUANTIZE", "RESHAPE", "RESIZE_BILINEAR", "RESIZE_NEAREST_NEIGHBOR", "SOFTMAX",
    "SPLIT", "STRIDED_SLICE", "SUB", "TILE", "TRANSPOSE", "UNIDIRECTIONAL_SEQUENCE_LSTM",
})
