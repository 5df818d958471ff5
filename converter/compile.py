"""Edge TPU compilation of a model directory's int8 model with Coral's edgetpu_compiler.

    models/<name>/<name>_int8.tflite --edgetpu_compiler -m <runtime>--> models/<name>/<name>_int8_edgetpu.tflite

The compiler is a closed x86-64 Linux binary from Coral's apt repository. It runs in a
temporary directory; its output is checked (it must contain Edge TPU custom ops, for a runtime
no newer than the pinned libedgetpu's) before it is placed into the model directory together
with the parsed report in model.json, in one atomic swap. A compilation that fails, or that maps
nothing, places nothing: no file here is ever called compiled that the compiler did not compile.
"""

from __future__ import annotations

import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from app.edgetpu.compat import CompatReport, analyze
from app.edgetpu.compiled_model import read_compiled_model
from app.edgetpu.versions import CompilerPin, compiler_pin
from app.model_dir.reading import read_model_dir, sha256_file
from app.model_dir.records import EdgeTpuCompile
from app.model_dir.schema import EDGETPU, edgetpu_filename
from app.tflite_file import read_tflite
from converter import compiler_log
from converter.model_dir import add_files

COMPILER = "edgetpu_compiler"
DEFAULT_COMPILER_TIMEOUT_S = 180  # the compiler's own default for -t
# our wait on top of the compiler's timeout: it needs a moment to stop its child and report
TIMEOUT_MARGIN_S = 60
VERSION_TIMEOUT_S = 30
SEGMENT_KIND = "edgetpu_segment_{}"
COMPILE_RECORD = "edgetpu_compile"


class CompileError(Exception):
    """The compilation did not produce a model to place. Carries what the compiler printed."""

    def __init__(self, message: str, stdout: str = "", stderr: str = "", returncode: int | None = None):
        super().__init__(message)
        self.stdout, self.stderr, self.returncode = stdout, stderr, returncode


class CompilerNotFound(CompileError):
    pass


class CompilerVersionMismatch(CompileError):
    pass


class CompilerFailed(CompileError):
    pass


class NothingMapped(CompileError):
    """The compiler succeeded but put no operator on the Edge TPU: the output is a CPU model."""


@dataclass(frozen=True)
class CompileOptions:
    """The compiler's useful flags (edgetpu_compiler --help)."""

    num_segments: int = 1                  # -n: split for pipelining over several TPUs
    search_delegate: bool = False          # -d: search for an earlier stopping point when compilation fails
    delegate_search_step: int | None = None  # -k: step of that search (default 1)
    timeout_s: int = DEFAULT_COMPILER_TIMEOUT_S  # -t
    intermediate_tensors: tuple[str, ...] = ()   # -i: tensors to make outputs of the Edge TPU op

    def flags(self) -> list[str]:
        flags = ["--timeout_sec", str(self.timeout_s)]
        if self.num_segments != 1:
            flags += ["--num_segments", str(self.num_segments)]
        if self.search_delegate:
            flags.append("--search_delegate")
            if self.delegate_search_step is not None:
                flags += ["--delegate_search_step", str(self.delegate_search_step)]
        if self.intermediate_tensors:
            flags += ["--intermediate_tensors", ",".join(self.intermediate_tensors)]
        return flags


@dataclass
class CompileResult:
    model_dir: Path
    files: dict[str, str]            # kind -> filename placed
    report: compiler_log.CompilerReport
    compiler_version: str
    min_runtime_version: int         # the -m passed
    model_min_runtime_version: int | None  # what the compiled file says it needs
    offline: CompatReport
    segment_reports: list[compiler_log.CompilerReport] = field(default_factory=list)


def install_instructions(pin: CompilerPin | None = None) -> str:
    pin = pin or compiler_pin()
    machine = platform.machine()
    where = "" if machine in ("x86_64", "AMD64") and sys.platform.startswith("linux") else (
        f" This machine is {platform.system()} {machine}: compile on an x86-64 Linux host or container "
        "(e.g. docker run --platform linux/amd64 debian:bookworm) and copy the model directory back.")
    return (
        f"{COMPILER} runs on x86-64 Linux (Debian/Ubuntu) only; install version {pin.version} from Coral's apt "
        "repository:\n"
        f"    curl -fsSL {pin.apt_key} | sudo gpg --dearmor -o /usr/share/keyrings/coral-edgetpu.gpg\n"
        f"    echo \"{pin.apt_source.replace('deb ', 'deb [signed-by=/usr/share/keyrings/coral-edgetpu.gpg] ', 1)}\""
        " | sudo tee /etc/apt/sources.list.d/coral-edgetpu.list\n"
        f"    sudo apt-get update && sudo apt-get install {pin.package}\n"
        f"or give its path with --compiler.{where}"
    )


def find_compiler(explicit: Path | None = None) -> Path:
    """The compiler given, or edgetpu_compiler on PATH; CompilerNotFound says how to get one."""
    if explicit is not None:
        path = Path(explicit)
        if path.is_file() and os.access(path, os.X_OK):
            return path
        raise CompilerNotFound(f"--compiler {path}: not an executable file.\n{install_instructions()}")
    found = shutil.which(COMPILER)
    if found is None:
        raise CompilerNotFound(f"{COMPILER} is not on PATH.\n{install_instructions()}")
    return Path(found)


def compiler_version(compiler: Path) -> str:
    """`edgetpu_compiler -v` -> '16.0.384591198'."""
    try:
        done = subprocess.run([str(compiler), "-v"], capture_output=True, text=True, timeout=VERSION_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise CompilerFailed(f"{compiler} -v did not run: {e}") from None
    version = compiler_log.parse_version(done.stdout + "\n" + done.stderr)
    if version is None:
        raise CompilerFailed(f"{compiler} -v did not print 'Edge TPU Compiler version ...' (exit {done.returncode})",
                             done.stdout, done.stderr, done.returncode)
    return version


def check_version(actual: str, pin: CompilerPin | None = None) -> None:
    pin = pin or compiler_pin()
    if actual != pin.version:
        raise CompilerVersionMismatch(
            f"{COMPILER} is version {actual}, the converter expects {pin.version} (app/edgetpu/versions.toml "
            f"[compiler]): models for runtime {pin.min_runtime_version} and the report format were checked against "
            f"it. Install {pin.package} {pin.version}, or pass --ignore-compiler-version to compile with {actual} "
            "anyway (model.json records the version used).")


def command(compiler: Path, model: Path, out_dir: Path, min_runtime_version: int, options: CompileOptions) -> list[str]:
    # -s: print the operator table too; -o: outputs (model and .log) into out_dir
    return [str(compiler), "--show_operations", "--min_runtime_version", str(min_runtime_version),
            "--out_dir", str(out_dir), *options.flags(), str(model)]


def run_compiler(cmd: list[str], cwd: Path, options: CompileOptions) -> subprocess.CompletedProcess:
    timeout = options.timeout_s + TIMEOUT_MARGIN_S
    try:
        done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise CompilerFailed(f"{cmd[0]} did not finish within {timeout} s", _text(e.stdout), _text(e.stderr)) from None
    except OSError as e:
        raise CompilerFailed(f"{cmd[0]} could not be started: {e}") from None
    if done.returncode != 0:
        raise CompilerFailed(
            f"{Path(cmd[0]).name} failed (exit {done.returncode}):\n{_tail(done.stderr or done.stdout)}",
            done.stdout, done.stderr, done.returncode)
    return done


def _text(value) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else (value or "")


def _tail(text: str, lines: int = 20) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def _outputs(out_dir: Path, stem: str, segments: int) -> list[Path]:
    """The compiled files, in segment order: <stem>_edgetpu.tflite or <stem>_segment_<i>_of_<n>_edgetpu.tflite."""
    if segments == 1:
        names = [f"{stem}_edgetpu.tflite"]
    else:
        names = [f"{stem}_segment_{i}_of_{segments}_edgetpu.tflite" for i in range(segments)]
    return [out_dir / name for name in names]


def compile_model_dir(model_dir: Path, compiler: Path | None = None, options: CompileOptions = CompileOptions(),
                      check_compiler_version: bool = True, progress=None) -> CompileResult:
    """Compile models/<name>/<name>_int8.tflite and place the result; CompileError if nothing is placed."""
    say = progress or (lambda message: None)
    model = read_model_dir(model_dir)
    int8_path = model.file("int8")  # sha256 checked
    offline = analyze(read_tflite(int8_path))
    pin = compiler_pin()
    executable = find_compiler(compiler)
    version = compiler_version(executable)
    if check_compiler_version:
        check_version(version, pin)
    with tempfile.TemporaryDirectory(prefix="edgetpu-compile-") as tmp:
        work = Path(tmp)
        source = work / int8_path.name
        shutil.copyfile(int8_path, source)
        out_dir = work / "out"
        out_dir.mkdir()
        cmd = command(executable, Path(source.name), Path("out"), pin.min_runtime_version, options)
        say(f"compiling {int8_path.name} with {executable} {version} (-m {pin.min_runtime_version})...")
        done = run_compiler(cmd, work, options)
        outputs = _outputs(out_dir, source.stem, options.num_segments)
        missing = [p.name for p in outputs if not p.is_file()]
        if missing:
            raise CompilerFailed(f"{executable.name} exited 0 but did not write {missing}:\n{_tail(done.stdout)}",
                                 done.stdout, done.stderr, done.returncode)
        logs = [p.with_suffix(".log") for p in outputs]
        segment_reports = [compiler_log.parse("", log.read_text(errors="replace")) for log in logs if log.is_file()]
        report = compiler_log.parse(done.stdout, logs[0].read_text(errors="replace") if logs[0].is_file() else None)
        compiled = [read_compiled_model(p) for p in outputs]
        if any(c.edgetpu_ops == 0 for c in compiled):
            raise NothingMapped(
                f"{executable.name} mapped no operator to the Edge TPU ({offline.summary()}); nothing was placed",
                done.stdout, done.stderr, done.returncode)
        needed = max((c.min_runtime_version or 0) for c in compiled) or None
        if needed is not None and needed > pin.min_runtime_version:
            raise CompilerFailed(
                f"the compiled model needs Edge TPU runtime {needed}, the pinned libedgetpu has "
                f"{pin.min_runtime_version}: nothing was placed", done.stdout, done.stderr, done.returncode)
        files = _placement(model.name, outputs)
        shown = [Path(cmd[0]).name, *cmd[1:]]
        record = EdgeTpuCompile(
            command=shlex.join(shown), compiler_version=version, min_runtime_version=pin.min_runtime_version,
            model_min_runtime_version=needed, int8_sha256=sha256_file(int8_path), segments=options.num_segments,
            report=report.as_dict(), offline_analysis=offline.summary(),
            segment_reports=[r.as_dict() for r in segment_reports] if options.num_segments != 1 else None,
        )
        stale = tuple(kind for kind in model.manifest.files if kind == EDGETPU or kind.startswith("edgetpu_segment_"))
        add_files(model.path, {kind: (name, path.read_bytes()) for kind, (name, path) in files.items()},
                  remove=stale, **{COMPILE_RECORD: record})
    return CompileResult(model.path, {kind: name for kind, (name, _) in files.items()}, report, version,
                         pin.min_runtime_version, needed, offline, segment_reports)


def _placement(name: str, outputs: list[Path]) -> dict[str, tuple[str, Path]]:
    """kind -> (filename in the model directory, compiled file)."""
    if len(outputs) == 1:
        return {EDGETPU: (edgetpu_filename(name), outputs[0])}
    return {SEGMENT_KIND.format(i): (path.name, path) for i, path in enumerate(outputs)}
