"""python -m converter compile, up to the subprocess boundary: the compiler here is a TEST DOUBLE
(tests/doubles/edgetpu_compiler_double.py) that takes the real flags and writes the real formats."""

import json
import os

import pytest

from app.edgetpu.compiled_model import read_compiled_model
from app.model_dir.reading import read_model_dir
from converter.__main__ import EXIT_CPU_OPS, EXIT_FAILED, EXIT_NO_COMPILER, EXIT_OK, main
from converter.compile import (
    CompileOptions,
    CompilerFailed,
    CompilerNotFound,
    CompilerVersionMismatch,
    NothingMapped,
    compile_model_dir,
)
from converter.model_dir import write_model_dir
from tests.doubles.edgetpu_compiler_double import OLD, PINNED, calls, install
from tests.tflite_builder import conv_chain

NAME = "tiny"


def model_dir(root, tflite: bytes):
    manifest = {"name": NAME, "source": "built by the test", "licence": "CC0-1.0",
                "input": {"width": 8, "height": 8, "channels": 3, "mean": [0], "std": [1]}}
    return write_model_dir(root, manifest, {"int8": (f"{NAME}_int8.tflite", tflite), "labels": ("labels.txt", b"a\n")})


@pytest.fixture
def clean(tmp_path):
    return model_dir(tmp_path / "models", conv_chain())


def snapshot(directory):
    return {p.name: p.read_bytes() for p in directory.iterdir()}


def test_compiles_and_places_the_model_with_its_report(clean, tmp_path, capsys):
    compiler = install(tmp_path)
    assert main(["compile", str(clean), "--compiler", str(compiler)]) == EXIT_OK
    out = capsys.readouterr().out
    assert "4 ops on the Edge TPU, 0 on the CPU" in out and f"placed {clean / 'tiny_int8_edgetpu.tflite'}" in out

    model = read_model_dir(clean)
    compiled = model.file("edgetpu")  # listed in model.json, sha256 checked
    assert compiled.name == "tiny_int8_edgetpu.tflite"
    assert (read_compiled_model(compiled).edgetpu_ops, read_compiled_model(compiled).min_runtime_version) == (1, 14)
    record = model.manifest.edgetpu_compile.model_dump()
    assert record["compiler_version"] == PINNED and record["min_runtime_version"] == 14
    assert record["model_min_runtime_version"] == 14
    assert record["int8_sha256"] == model.manifest.files["int8"].sha256
    assert record["report"]["operations_on_edgetpu"] == 4 and record["report"]["operations_on_cpu"] == 0
    assert {o["type"]: o["count"] for o in record["report"]["operators"]} == {"QUANTIZE": 2, "CONV_2D": 2}
    assert record["report"]["memory"]["off_chip_memory_used"] == {"text": "0.00B", "bytes": 0}
    assert record["offline_analysis"] == "all 4 ops would run on the Edge TPU"
    assert record["command"].startswith("edgetpu_compiler_test_double --show_operations --min_runtime_version 14")

    version_call, compile_call = calls(compiler)
    assert version_call == ["-v"]
    assert compile_call == ["--show_operations", "--min_runtime_version", "14", "--out_dir", "out",
                            "--timeout_sec", "180", "tiny_int8.tflite"]
    assert sorted(p.name for p in clean.parent.iterdir()) == ["tiny"]  # no staging left behind


def test_the_useful_flags_reach_the_compiler(clean, tmp_path):
    compiler = install(tmp_path)
    options = CompileOptions(num_segments=2, search_delegate=True, delegate_search_step=3, timeout_s=60,
                             intermediate_tensors=("conv1",))
    result = compile_model_dir(clean, compiler, options)
    assert calls(compiler)[-1][:-1] == [
        "--show_operations", "--min_runtime_version", "14", "--out_dir", "out", "--timeout_sec", "60",
        "--num_segments", "2", "--search_delegate", "--delegate_search_step", "3", "--intermediate_tensors", "conv1"]
    # segments are placed as such; the service's single `edgetpu` file is not claimed
    assert result.files == {"edgetpu_segment_0": "tiny_int8_segment_0_of_2_edgetpu.tflite",
                            "edgetpu_segment_1": "tiny_int8_segment_1_of_2_edgetpu.tflite"}
    model = read_model_dir(clean)
    assert not model.has("edgetpu") and model.file("edgetpu_segment_1").is_file()
    assert len(model.manifest.edgetpu_compile.segment_reports) == 2

    # compiling again whole replaces the segments
    compile_model_dir(clean, compiler)
    model = read_model_dir(clean)
    assert model.has("edgetpu") and not model.has("edgetpu_segment_0")
    assert not (clean / "tiny_int8_segment_0_of_2_edgetpu.tflite").exists()


def test_ops_left_on_the_cpu_exit_3(tmp_path, capsys):
    directory = model_dir(tmp_path / "models", conv_chain("HARD_SWISH"))
    assert main(["compile", str(directory), "--compiler", str(install(tmp_path))]) == EXIT_CPU_OPS
    out = capsys.readouterr().out
    assert "2 ops on the Edge TPU, 3 on the CPU" in out
    assert "HARD_SWISH                     1          Operation is working on an unsupported data type" in out
    assert "first unsupported op: HARD_SWISH at index 2; 2 of 5" in out


def test_a_failing_compile_raises_with_the_compilers_stderr_and_places_nothing(clean, tmp_path, capsys):
    before = snapshot(clean)
    compiler = install(tmp_path, "fail")
    with pytest.raises(CompilerFailed) as failure:
        compile_model_dir(clean, compiler)
    assert failure.value.returncode == 1
    assert "Didn't find op for builtin opcode 'RSQRT'" in failure.value.stderr
    assert "failed (exit 1)" in str(failure.value)
    assert main(["compile", str(clean), "--compiler", str(compiler)]) == EXIT_FAILED
    assert "Model could not be parsed" in capsys.readouterr().err
    assert snapshot(clean) == before


@pytest.mark.parametrize("mode, error, message", [
    ("nothing-mapped", NothingMapped, "mapped no operator to the Edge TPU"),
    ("no-output", CompilerFailed, "did not write ['tiny_int8_edgetpu.tflite']"),
    ("newer-runtime", CompilerFailed, "needs Edge TPU runtime 15, the pinned libedgetpu has 14"),
])
def test_outputs_that_are_not_a_usable_compiled_model_are_not_placed(clean, tmp_path, mode, error, message):
    before = snapshot(clean)
    with pytest.raises(error, match=message.replace("[", r"\[").replace("]", r"\]")):
        compile_model_dir(clean, install(tmp_path, mode))
    assert snapshot(clean) == before


def test_the_compiler_version_is_checked_against_the_pin(clean, tmp_path, capsys):
    compiler = install(tmp_path, "old-version")
    with pytest.raises(CompilerVersionMismatch, match=f"version {OLD}, the converter expects {PINNED}"):
        compile_model_dir(clean, compiler)
    assert len(calls(compiler)) == 1  # -v only: nothing compiled
    assert main(["compile", str(clean), "--compiler", str(compiler), "--ignore-compiler-version"]) == EXIT_OK
    assert read_model_dir(clean).manifest.edgetpu_compile.compiler_version == OLD


def test_a_missing_compiler_says_how_to_get_one_and_still_analyses(clean, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert main(["compile", str(clean)]) == EXIT_NO_COMPILER
    captured = capsys.readouterr()
    assert "edgetpu_compiler is not on PATH" in captured.err
    assert "deb [signed-by=/usr/share/keyrings/coral-edgetpu.gpg] https://packages.cloud.google.com/apt " \
           "coral-edgetpu-stable main" in captured.err
    assert "sudo apt-get install edgetpu-compiler" in captured.err and "x86-64 Linux" in captured.err
    assert "offline analysis instead" in captured.out and "all 4 ops would run on the Edge TPU" in captured.out
    assert not read_model_dir(clean).has("edgetpu")

    with pytest.raises(CompilerNotFound, match="not an executable file"):
        compile_model_dir(clean, tmp_path / "nothing-here")


def test_the_compiler_is_found_on_path(clean, tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "edgetpu_compiler").symlink_to(install(tmp_path))
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    result = compile_model_dir(clean)
    assert result.files == {"edgetpu": "tiny_int8_edgetpu.tflite"}
    assert json.loads((clean / "model.json").read_text())["files"]["edgetpu"]["path"] == "tiny_int8_edgetpu.tflite"
