"""Parsing edgetpu_compiler's stdout and .log.

The texts below are written by hand in the compiler 16.0 format (Coral's docs and published
compiler outputs: the summary block, the "Operator Count Status" table, the partial-mapping
paragraph); no compiler ran to make them.
"""

import pytest

from converter.compiler_log import CompilerLogError, parse, parse_operator_table, parse_version, size_bytes

FULL_STDOUT = """\
Edge TPU Compiler version 16.0.384591198
Started a compilation timeout timer of 180 seconds.

Model compiled successfully in 35 ms.

Input model: fashion_mnist_int8.tflite
Input size: 227.27KiB
Output model: out/fashion_mnist_int8_edgetpu.tflite
Output size: 289.98KiB
On-chip memory used for caching model parameters: 226.50KiB
On-chip memory remaining for caching model parameters: 7.64MiB
Off-chip memory used for streaming uncached model parameters: 0.00B
Number of Edge TPU subgraphs: 1
Total number of operations: 9
Operation log: out/fashion_mnist_int8_edgetpu.log

Operator                       Count      Status

FULLY_CONNECTED                2          Mapped to Edge TPU
QUANTIZE                       2          Mapped to Edge TPU
RESHAPE                        1          Mapped to Edge TPU
CONV_2D                        2          Mapped to Edge TPU
MAX_POOL_2D                    2          Mapped to Edge TPU
Compilation child process completed within timeout period.
Compilation succeeded!
"""

FULL_LOG = """\
Edge TPU Compiler version 16.0.384591198
Input: fashion_mnist_int8.tflite
Output: out/fashion_mnist_int8_edgetpu.tflite

Operator                       Count      Status

FULLY_CONNECTED                2          Mapped to Edge TPU
QUANTIZE                       2          Mapped to Edge TPU
RESHAPE                        1          Mapped to Edge TPU
CONV_2D                        2          Mapped to Edge TPU
MAX_POOL_2D                    2          Mapped to Edge TPU
"""

PARTIAL_STDOUT = """\
Edge TPU Compiler version 16.0.384591198
Started a compilation timeout timer of 180 seconds.

Model compiled successfully in 1524 ms.

Input model: detector_int8.tflite
Input size: 8.05MiB
Output model: out/detector_int8_edgetpu.tflite
Output size: 14.17MiB
On-chip memory used for caching model parameters: 7.14MiB
On-chip memory remaining for caching model parameters: 1.75KiB
Off-chip memory used for streaming uncached model parameters: 6.63MiB
Number of Edge TPU subgraphs: 1
Total number of operations: 141
Operation log: out/detector_int8_edgetpu.log

Model successfully compiled but not all operations are supported by the Edge TPU. A percentage of the model will \
instead run on the CPU, which is slower. If possible, consider updating your model to use only operations supported \
by the Edge TPU. For details, visit g.co/coral/model-reqs.
Number of operations that will run on Edge TPU: 136
Number of operations that will run on CPU: 5

Operator                       Count      Status

TRANSPOSE                      1          Operation not supported
CONV_2D                        2          More than one subgraph is not supported
... All other operators were mapped successfully. See out/detector_int8_edgetpu.log.
Compilation child process completed within timeout period.
Compilation succeeded!
"""

PARTIAL_LOG = """\
Edge TPU Compiler version 16.0.384591198
Input: detector_int8.tflite
Output: out/detector_int8_edgetpu.tflite

Operator                       Count      Status

CONV_2D                        70         Mapped to Edge TPU
CONV_2D                        2          More than one subgraph is not supported
DEPTHWISE_CONV_2D              60         Mapped to Edge TPU
TRANSPOSE                      1          Operation not supported
QUANTIZE                       1          Operation is otherwise supported, but not mapped due to some unspecified limitation
DEQUANTIZE                     1          Operation is working on an unsupported data type
ADD                            5          Mapped to Edge TPU
QUANTIZE                       1          Mapped to Edge TPU
"""


def test_a_fully_mapped_compilation():
    report = parse(FULL_STDOUT, FULL_LOG)
    assert report.compiler_version == "16.0.384591198" and report.compile_ms == 35
    assert [(o.type, o.count, o.mapped) for o in report.operators] == [
        ("FULLY_CONNECTED", 2, True), ("QUANTIZE", 2, True), ("RESHAPE", 1, True), ("CONV_2D", 2, True),
        ("MAX_POOL_2D", 2, True)]
    # no "Number of operations that will run ..." lines when everything maps: counted from the table
    assert (report.operations_on_edgetpu, report.operations_on_cpu) == (9, 0) and report.all_mapped
    assert report.total_operations == 9 and report.edgetpu_subgraphs == 1
    assert report.memory["on_chip_memory_used"] == {"text": "226.50KiB", "bytes": 231936}
    assert report.memory["on_chip_memory_remaining"]["bytes"] == round(7.64 * 2**20)
    assert report.memory["off_chip_memory_used"] == {"text": "0.00B", "bytes": 0}


def test_a_partial_compilation_prefers_the_full_table_of_the_log():
    report = parse(PARTIAL_STDOUT, PARTIAL_LOG)
    assert (report.operations_on_edgetpu, report.operations_on_cpu) == (136, 5) and not report.all_mapped
    assert [(o.type, o.status) for o in report.unmapped()] == [
        ("CONV_2D", "More than one subgraph is not supported"),
        ("TRANSPOSE", "Operation not supported"),
        ("QUANTIZE", "Operation is otherwise supported, but not mapped due to some unspecified limitation"),
        ("DEQUANTIZE", "Operation is working on an unsupported data type")]
    assert report.memory["off_chip_memory_used"]["bytes"] == round(6.63 * 2**20)
    data = report.as_dict()
    assert data["operators"][0] == {"type": "CONV_2D", "count": 70, "status": "Mapped to Edge TPU", "mapped": True}


def test_stdout_alone_gives_the_shown_rows_and_the_printed_counts():
    report = parse(PARTIAL_STDOUT)
    # "... All other operators were mapped successfully" ends the shown table
    assert [o.type for o in report.operators] == ["TRANSPOSE", "CONV_2D"]
    assert (report.operations_on_edgetpu, report.operations_on_cpu) == (136, 5)


def test_counts_that_disagree_are_an_error_not_a_guess():
    inconsistent = PARTIAL_STDOUT.replace("run on CPU: 5", "run on CPU: 4")
    with pytest.raises(CompilerLogError, match="the summary 136 and 4"):
        parse(inconsistent, PARTIAL_LOG)


def test_text_that_is_not_compiler_output():
    with pytest.raises(CompilerLogError, match="not edgetpu_compiler output"):
        parse("Segmentation fault (core dumped)\n")
    assert parse_operator_table("no table here") == ([], False)


def test_versions_and_sizes():
    assert parse_version("Edge TPU Compiler version 15.0.340273435\n") == "15.0.340273435"
    assert parse_version("edgetpu_compiler: command not found") is None
    assert size_bytes("4.49", "MiB") == round(4.49 * 1024 * 1024)
    assert size_bytes("1.5", "GiB") == 3 * 2**29 and size_bytes("0.00", "B") == 0


# As public repositories hold them beside their compiled files: the .log alone, with no stdout (compiler 2.1 wrote
# the SSD post-processing as CUSTOM, cmpss94068/tensorflowlite's detect_edgetpu.log; the rows in its own order).
OLD_LOG = """\
Edge TPU Compiler version 2.1.302470888
Input: detect.tflite
Output: detect_edgetpu.tflite

Operator                       Count      Status

LOGISTIC                       1          Mapped to Edge TPU
CUSTOM                         1          Operation is working on an unsupported data type
ADD                            10         Mapped to Edge TPU
CONV_2D                        55         Mapped to Edge TPU
"""


def test_a_log_on_its_own():
    report = parse("", OLD_LOG)
    assert report.compiler_version == "2.1.302470888"
    assert (report.operations_on_edgetpu, report.operations_on_cpu) == (66, 1)
    assert [(line.type, line.count, line.mapped) for line in report.unmapped()] == [("CUSTOM", 1, False)]
    assert report.total_operations is None and report.memory == {}  # only stdout prints those
