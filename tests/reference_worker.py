"""TFLite's own kernels in a long-lived subprocess, the ground truth of the emulator's tests.

BUILTIN_REF can abort the whole process (SIGABRT in allocate_tensors on degenerate models),
so it never runs in the test process. One worker serves many models over a pipe (the
interpreter import and process start are paid once); when it dies, the model that killed it
is reported as Aborted and the next call starts a fresh worker.

Run as a script it is the worker: length-prefixed pickles in on stdin, out on stdout.
"""

from __future__ import annotations

import os
import pickle
import struct
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

_HEADER = struct.Struct("<Q")
ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Aborted:
    """The reference process died on this model (the runtime aborts instead of raising)."""

    returncode: int


@dataclass(frozen=True)
class Refused:
    """The reference runtime raised: it does not accept this model (a Prepare check failed)."""

    message: str


def _send(stream, obj) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(data)) + data)
    stream.flush()


def _receive(stream):
    header = stream.read(_HEADER.size)
    if len(header) < _HEADER.size:
        raise EOFError
    (size,) = _HEADER.unpack(header)
    return pickle.loads(stream.read(size))


class ReferenceWorker:
    """run(model_bytes, inputs) -> list of outputs (arrays), or Aborted / Refused."""

    def __init__(self, resolver: str = "BUILTIN_REF"):
        self.resolver = resolver
        self._process: subprocess.Popen | None = None

    def _start(self) -> subprocess.Popen:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        return subprocess.Popen([sys.executable, str(Path(__file__).resolve())], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, cwd=ROOT)

    def run(self, model: bytes, inputs: list[np.ndarray], all_tensors: bool = False):
        """Outputs in order; with all_tensors, {tensor index: array} of every tensor the runtime kept."""
        if self._process is None or self._process.poll() is not None:
            self._process = self._start()
        try:
            _send(self._process.stdin, (model, [np.asarray(x) for x in inputs], self.resolver, all_tensors))
            status, value = _receive(self._process.stdout)
        except (EOFError, BrokenPipeError):
            returncode = self._process.wait()
            self._process = None
            return Aborted(returncode)
        return value if status == "ok" else Refused(value)

    def close(self) -> None:
        if self._process is not None:
            self._process.stdin.close()
            self._process.wait(10)
            self._process = None


def _serve() -> None:
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    while True:
        try:
            model, inputs, resolver, all_tensors = _receive(stdin)
        except EOFError:
            return
        try:
            interpreter = Interpreter(model_content=model, num_threads=1,
                                      experimental_op_resolver_type=getattr(OpResolverType, resolver),
                                      experimental_preserve_all_tensors=all_tensors)
            interpreter.allocate_tensors()
            for detail, x in zip(interpreter.get_input_details(), inputs, strict=True):
                interpreter.set_tensor(detail["index"], x)
            interpreter.invoke()
            if all_tensors:
                outputs = {d["index"]: interpreter.get_tensor(d["index"]).copy()
                           for d in interpreter.get_tensor_details() if d["dtype"] != np.bytes_}
            else:
                outputs = [interpreter.get_tensor(d["index"]).copy() for d in interpreter.get_output_details()]
            _send(stdout, ("ok", outputs))
        except (ValueError, RuntimeError) as e:
            _send(stdout, ("refused", f"{type(e).__name__}: {e}"))


if __name__ == "__main__":
    _serve()
