"""converter/compiler_agreement.py: the offline analysis against a compiler's log and its compiled twin.

The compiled files here are TEST DOUBLES of edgetpu_compiler's output (tests/doubles/compiled_model_double.py's
custom op and options), built with the plain file's tensor names as the compiler keeps them; the logs are written
by hand in its format. The measurement over real public files is docs/edgetpu-compiler.md's.
"""

import hashlib
import json

import numpy as np
import pytest

from app.tflite_file import read_tflite
from converter.compiler_agreement import NotATwin, Pair, compare, cpu_operators, load_pairs, main, measure, render
from tests.doubles.compiled_model_double import custom_options, package_bytes
from tests.tflite_builder import GraphBuilder, conv_chain

PLAIN = conv_chain("HARD_SWISH")  # QUANTIZE, CONV_2D, HARD_SWISH, CONV_2D, QUANTIZE


def compiled_twin(edgetpu_outputs=("conv1",), cpu=("HARD_SWISH", "CONV_2D", "QUANTIZE"), conv1_scale=None) -> bytes:
    """What the compiler writes for PLAIN: one custom op from the image to `edgetpu_outputs`, then the CPU's ops."""
    g = GraphBuilder()
    image = g.activation("image", [1, 8, 8, 4], "UINT8", zero_point=128)
    conv1 = g.tensor("conv1", [1, 8, 8, 4], "INT8", scale=conv1_scale or 0.05, zero_point=0)
    tensors = {"conv1": conv1, "hard_swish": g.activation("hard_swish", [1, 8, 8, 4]),
               "conv2": g.activation("conv2", [1, 8, 8, 4])}
    scores = g.activation("scores", [1, 8, 8, 4], "UINT8", zero_point=128)
    g.op("CUSTOM", [image], [tensors[name] for name in edgetpu_outputs], custom_code="edgetpu-custom-op")
    g.operators[-1].customOptions = list(custom_options(package_bytes(14)))
    steps = {"HARD_SWISH": ([tensors["conv1"]], [tensors["hard_swish"]]),
             "CONV_2D": ([tensors["hard_swish"], g.constant("conv2/weights", np.ones((4, 1, 1, 4)), "INT8"),
                          g.constant("conv2/bias", np.zeros(4), "INT32")], [tensors["conv2"]]),
             "QUANTIZE": ([tensors["conv2"]], [scores])}
    for opcode in cpu:
        g.op(opcode, *steps[opcode], **({"padding": 0, "strideW": 1, "strideH": 1} if opcode == "CONV_2D" else {}))
    return g.build([image], [scores])


LOG = """\
Edge TPU Compiler version 16.0.384591198
Input: chain.tflite
Output: chain_edgetpu.tflite

Operator                       Count      Status

QUANTIZE                       1          Mapped to Edge TPU
QUANTIZE                       1          More than one subgraph is not supported
CONV_2D                        1          Mapped to Edge TPU
CONV_2D                        1          More than one subgraph is not supported
HARD_SWISH                     1          not an Edge TPU operation
"""


def test_the_analysis_against_its_compiled_twin_and_log():
    plain = read_tflite(PLAIN)
    assert cpu_operators(plain, read_tflite(compiled_twin())) == {2, 3, 4}
    result = compare(plain, LOG, read_tflite(compiled_twin()))
    assert result.agrees and (result.total, result.ours_mapped, result.compiler_mapped) == (5, 2, 2)
    assert result.misplaced == [] and result.table_differences == {}


def test_where_the_compiler_did_otherwise_each_operator_is_named():
    # a compiler that mapped the HARD_SWISH's consumer too: the analysis placed it on the CPU
    subgraph = "CONV_2D                        1          More than one subgraph is not supported\n"
    mapped = "CONV_2D                        {}          Mapped to Edge TPU"
    log = LOG.replace(subgraph, "").replace(mapped.format(1), mapped.format(2))
    result = compare(read_tflite(PLAIN), log)
    assert not result.agrees and result.compiler_mapped == 3 and result.ours_mapped == 2
    assert result.table_differences == {("CONV_2D", "Mapped to Edge TPU"): (1, 2),
                                        ("CONV_2D", "More than one subgraph is not supported"): (1, 0)}
    twin = compare(read_tflite(PLAIN), None, read_tflite(compiled_twin(cpu=("HARD_SWISH", "QUANTIZE"))))
    assert twin.misplaced == [(3, "CONV_2D", "CPU", "Edge TPU")]


def test_a_compiled_file_from_another_export_is_no_twin():
    """Another calibration of the same model has other scales: its CPU ops cannot be matched to these."""
    with pytest.raises(NotATwin, match="tensor 'conv1' differs"):
        compare(read_tflite(PLAIN), None, read_tflite(compiled_twin(conv1_scale=0.07)))
    without_a_line = LOG.replace("HARD_SWISH                     1          not an Edge TPU operation\n", "")
    with pytest.raises(NotATwin, match="the log counts 4 operators and the plain file has 5"):
        compare(read_tflite(PLAIN), without_a_line)
    with pytest.raises(ValueError, match="needs the compiler's log or the compiled file"):
        compare(read_tflite(PLAIN))


def test_the_measured_set_is_read_from_checkouts_and_checked_by_sha256(tmp_path, capsys):
    checkout = tmp_path / "someone" / "models"
    checkout.mkdir(parents=True)
    files = {"chain.tflite": PLAIN, "chain_edgetpu.tflite": compiled_twin(), "chain_edgetpu.log": LOG.encode()}
    for name, data in files.items():
        (checkout / name).write_bytes(data)
    digest = {name: hashlib.sha256(data).hexdigest() for name, data in files.items()}
    entry = {"name": "chain", "family": "other", "repo": "someone/models", "commit": "0" * 40,
             "plain": {"path": "chain.tflite", "sha256": digest["chain.tflite"]},
             "log": {"path": "chain_edgetpu.log", "sha256": digest["chain_edgetpu.log"]},
             "compiled": {"path": "chain_edgetpu.tflite", "sha256": digest["chain_edgetpu.tflite"]}}
    changed = dict(entry, name="changed", plain={"path": "chain.tflite", "sha256": "f" * 64}, taught=["data flow"])
    manifest = tmp_path / "pairs.json"
    manifest.write_text(json.dumps({"pairs": [entry, changed]}))
    rows = measure(tmp_path, load_pairs(manifest))
    assert rows[0][1].agrees and rows[1][1].startswith("not measured:") and "sha256" in rows[1][1]
    table = render(rows)
    assert "chain" in table and "log+compiled" in table
    assert "all: 1 of 2 models agree exactly; 5 of 5 operators placed as the compiler did" in table
    assert "checked only after the rules were written: 1 of 1 models agree exactly" in table
    # the one compiled file maps QUANTIZE and CONV_2D: both in SEEN_MAPPED, which lists more than this set shows
    assert rows[0][1].seen_mapped == {"QUANTIZE", "CONV_2D"}
    assert "compiler_limits.SEEN_MAPPED lacks [], and lists ['ADD', " in table
    assert main([str(tmp_path), "--manifest", str(manifest)]) == 1  # one pair could not be measured
    assert capsys.readouterr().out.strip() == table
    assert main([str(tmp_path), "--manifest", str(manifest), "--json"]) == 1
    rows = json.loads(capsys.readouterr().out)
    assert rows[0]["agrees"] is True and rows[1]["taught"] == ["data flow"] and "sha256" in rows[1]["error"]


def test_the_committed_manifest_names_each_file_by_source_and_digest():
    pairs = load_pairs()
    assert len(pairs) >= 10 and {"YOLOv5", "YOLOv8", "SSD", "classifier"} <= {p.family for p in pairs}
    for pair in pairs:
        assert isinstance(pair, Pair) and len(pair.commit) == 40 and pair.log or pair.compiled
        for entry in (pair.plain, pair.log, pair.compiled):
            assert entry is None or (entry["path"] and len(entry["sha256"]) == 64)


def test_the_checkouts_are_printed_as_git_commands(tmp_path, capsys):
    assert main([str(tmp_path), "--checkouts"]) == 0
    lines = capsys.readouterr().out.splitlines()
    pairs = load_pairs()
    assert len(lines) == len({(p.repo, p.commit) for p in pairs})
    first = pairs[0]
    assert lines[0].startswith(f"git clone --filter=blob:none https://github.com/{first.repo} {tmp_path / first.repo}")
    assert lines[0].endswith(f"checkout --quiet {first.commit}")
