"""A simulated Edge TPU for benchmarks: one interpreter = one device that takes D ms per inference.

`run()` copies the inputs (as a delegate's set_tensor does), sleeps D ms with the GIL released
(time.sleep releases it, as libedgetpu's invoke does), and returns copies of real outputs: the
model's own output tensors (all of them: a detector's boxes, classes, scores and count) for a real
photo, computed once on the `cpu` backend at load, so post-processing (a classifier's dequantize,
softmax, top-k over 1000 classes; a detector's boxes to the photo's pixels) is real work.
It also runs inside a checkout from before the task seam (bench --checkout), whose engines took one
tensor and gave one.

Never in the product's backend list: bench/device_launcher.py plugs it in with
`app.engines.register()` (or, on a checkout without plug-ins, into `app.engines.ENGINES`).
Configured from the environment, since the service reads its own settings from there too:
  BENCH_DEVICE_MS   device time per inference, ms (default 2.5)
  BENCH_DEVICES     devices (interpreters) per model (default 1)
  BENCH_DEVICE_PHOTO  the photo whose outputs the device returns (default china.jpg): the photo the
                    benchmark sends, so that a detector's objects are that photo's
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np

from app.engines import Engine, EngineOptions, TensorSpec

KEY = "simtpu"
DEVICE_MS_ENV = "BENCH_DEVICE_MS"
DEVICES_ENV = "BENCH_DEVICES"
PHOTO_ENV = "BENCH_DEVICE_PHOTO"
MAX_PIXELS = 50_000_000


def default_photo() -> Path:
    """scikit-learn's china.jpg (as bench/common.py finds it; this module is also imported by
    a launcher running another checkout, whose bench/ package is not this one)."""
    from importlib import metadata

    return Path(metadata.distribution("scikit-learn").locate_file("sklearn/datasets/images/china.jpg"))


def device_ms() -> float:
    return float(os.environ.get(DEVICE_MS_ENV, "2.5"))


def devices() -> int:
    return int(os.environ.get(DEVICES_ENV, "1"))


Outputs = tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...], list[np.ndarray]]


def real_output(int8_path: Path, photo: bytes | None = None) -> Outputs:
    """The model's input and output specs and its outputs for a real photo, on the cpu backend."""
    from app.engines.cpu import CpuEngine
    from app.imaging import prepare
    from app.imaging.quantization import InputQuantizer
    from app.model_dir.reading import read_model_dir

    cpu = CpuEngine.load(int8_path, EngineOptions(cpu_threads=1))
    try:
        model_dir = read_model_dir(int8_path.parent)
        spec = model_dir.manifest.input
        seam = hasattr(cpu, "inputs")  # a checkout from before the task seam: one `input`, one `output`
        inputs, outputs = (cpu.inputs, cpu.outputs) if seam else ((cpu.input,), (cpu.output,))
        quantizer = InputQuantizer(spec, inputs[0].dtype, inputs[0].scale, inputs[0].zero_point)
        if photo is None:
            photo = Path(os.environ.get(PHOTO_ENV) or default_photo()).read_bytes()
        tensor = quantizer(prepare(photo, spec, MAX_PIXELS))
        values = cpu.run([tensor]) if seam else [cpu.run(tensor)]
        return inputs, outputs, [np.array(v, copy=True) for v in values]
    finally:
        cpu.close()


class SimulatedTpuEngine(Engine):
    key = KEY
    model_file = "int8"  # the plain int8 file: its tensor specs, and its real outputs

    def __init__(self, inputs: tuple[TensorSpec, ...], outputs: tuple[TensorSpec, ...], values: list[np.ndarray],
                 seconds: float):
        self.inputs, self.outputs = tuple(inputs), tuple(outputs)
        self.input, self.output = self.inputs[0], self.outputs[0]  # for a checkout from before the task seam
        self._values = values
        self._seconds = seconds
        self._buffers = [np.empty(spec.shape, spec.dtype) for spec in self.inputs]

    @classmethod
    def load(cls, path: Path, options: EngineOptions) -> SimulatedTpuEngine:
        return cls(*real_output(Path(path)), device_ms() / 1000)

    def run(self, inputs):
        """Every input -> every output (a checkout from before the task seam: one array -> one array)."""
        one = isinstance(inputs, np.ndarray)
        for buffer, x in zip(self._buffers, [inputs] if one else inputs):
            np.copyto(buffer, x.reshape(buffer.shape))  # the inputs go to the device
        time.sleep(self._seconds)                       # the device works, GIL released
        return self._values[0].copy() if one else [v.copy() for v in self._values]


def plugin():
    """The Backend plug-in for a checkout with `app.engines.register` (None without)."""
    try:
        from app.engines import Backend
    except ImportError:
        return None

    class SimulatedTpuBackend(Backend):
        """One interpreter per simulated device, like the edgetpu plug-in (WORKERS does not apply)."""

        key = KEY
        engine = SimulatedTpuEngine
        host_cpu = False  # a device: it sleeps, the host's cores stay free

        def interpreters(self) -> list[EngineOptions]:
            return [EngineOptions(cpu_threads=1)] * devices()

        def device(self, options: EngineOptions) -> str | None:
            return "simulated"

    return SimulatedTpuBackend
