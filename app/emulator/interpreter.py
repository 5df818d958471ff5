"""Interpreter: the part of ai_edge_litert.interpreter.Interpreter's interface that code uses.

    from app.emulator import Interpreter
    interpreter = Interpreter(model_path="model_int8.tflite")   # or model_content=bytes
    interpreter.allocate_tensors()
    interpreter.set_tensor(interpreter.get_input_details()[0]["index"], x)
    interpreter.invoke()
    y = interpreter.get_tensor(interpreter.get_output_details()[0]["index"])

Outputs are byte-identical to the real interpreter with OpResolverType.BUILTIN_REF. The model is
read and prepared in the constructor, so a model the emulator cannot run fails there, with every
unsupported operator listed. Like TFLite's, an Interpreter is not thread-safe. Every tensor stays
readable after invoke (TFLite's experimental_preserve_all_tensors), and `model` is the parsed
graph, for tools that inspect it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from app.emulator import accel
from app.emulator.blas import limit_blas_threads
from app.emulator.errors import InvalidTensor
from app.emulator.plan import Plan, prepare
from app.tflite_file import Tensor, TfliteModel, read_tflite


class Interpreter:
    def __init__(self, model_path: str | Path | None = None, model_content: bytes | None = None,
                 num_threads: int | None = 1, accelerate: bool | None = None):
        """num_threads: BLAS threads, set for the whole process (see app/emulator/blas.py); None leaves them.

        accelerate: use the numba kernels (app/emulator/accel.py); None = when numba is installed.
        Results are the same bytes either way.
        """
        if (model_path is None) == (model_content is None):
            raise ValueError("give exactly one of model_path and model_content")
        if num_threads is not None:
            limit_blas_threads(num_threads)
        self.model: TfliteModel = read_tflite(model_path if model_path is not None else model_content)
        self.accelerated = accel.available() if accelerate is None else bool(accelerate and accel.available())
        self.plan: Plan = prepare(self.model, self.accelerated)
        self._tensors = self.model.graph.tensors
        self._values: list[np.ndarray | None] | None = None
        # each tensor's shape: the file's, or the one a kernel gives its output (as TFLite's allocate_tensors does)
        self._resized = {index: shape for step in self.plan.steps for index, shape in step.resized.items()}
        self._shapes = [self._resized.get(t.index, t.shape) for t in self._tensors]
        # per step, (index, shape, dtype) of each output: what invoke checks the kernels' results against
        self._declared = [tuple((i, self._shapes[i], self._tensors[i].dtype) for i in step.outputs)
                          for step in self.plan.steps]

    # ---- tensors ----

    def allocate_tensors(self) -> None:
        self._values = [None if t.data is None else t.data for t in self._tensors]

    def _detail(self, tensor: Tensor) -> dict:
        q = tensor.quantization
        if q is None:
            quantization = (0.0, 0)
            parameters = {"scales": np.zeros(0, np.float32), "zero_points": np.zeros(0, np.int32),
                          "quantized_dimension": 0}
        else:
            quantization = (float(q.scale[0]), int(q.zero_point[0])) if not q.per_channel else (0.0, 0)
            parameters = {"scales": q.scale.astype(np.float32), "zero_points": q.zero_point.astype(np.int32),
                          "quantized_dimension": q.axis}
        return {
            "name": tensor.name,
            "index": tensor.index,
            "shape": np.array(self._shapes[tensor.index], dtype=np.int32),
            "shape_signature": np.array(self._resized.get(tensor.index, tensor.shape_signature), dtype=np.int32),
            "dtype": tensor.dtype.type if tensor.dtype is not None else None,
            "quantization": quantization,
            "quantization_parameters": parameters,
            "sparsity_parameters": {},
        }

    def get_input_details(self) -> list[dict]:
        return [self._detail(self._tensors[i]) for i in self.model.graph.inputs]

    def get_output_details(self) -> list[dict]:
        return [self._detail(self._tensors[i]) for i in self.model.graph.outputs]

    def get_tensor_details(self) -> list[dict]:
        return [self._detail(t) for t in self._tensors]

    def _tensor(self, index: int) -> Tensor:
        if not isinstance(index, (int, np.integer)) or not 0 <= index < len(self._tensors):
            raise InvalidTensor(f"tensor index {index!r} is out of range; the model has {len(self._tensors)} tensors")
        return self._tensors[int(index)]

    def _allocated(self) -> list:
        if self._values is None:
            raise RuntimeError("call allocate_tensors() first")
        return self._values

    def set_tensor(self, tensor_index: int, value: np.ndarray) -> None:
        tensor = self._tensor(tensor_index)
        values = self._allocated()
        value = np.asarray(value)
        if value.dtype != tensor.dtype:
            raise InvalidTensor(f"cannot set tensor {tensor.name!r}: got {value.dtype}, expected {tensor.dtype}")
        if value.shape != self._shapes[tensor.index]:
            raise InvalidTensor(f"cannot set tensor {tensor.name!r}: got shape {value.shape}, "
                                f"expected {self._shapes[tensor.index]}")
        values[tensor.index] = np.array(value, copy=True)

    def get_tensor(self, tensor_index: int) -> np.ndarray:
        tensor = self._tensor(tensor_index)
        value = self._allocated()[tensor.index]
        if value is None:
            return np.zeros(self._shapes[tensor.index], tensor.dtype)  # like TFLite: not yet written, zero-filled
        return np.array(value, copy=True)

    # ---- running ----

    def invoke(self) -> None:
        values = self._allocated()
        for index in self.model.graph.inputs:
            if values[index] is None:
                raise RuntimeError(f"input tensor {self._tensors[index].name!r} was not set")
        for step, declared in zip(self.plan.steps, self._declared):
            result = step.run(*[values[i] for i in step.inputs])
            results = (result,) if len(declared) == 1 else result
            for (index, shape, dtype), array in zip(declared, results, strict=True):
                if array.shape != shape or array.dtype != dtype:  # a kernel bug, never the model's
                    raise AssertionError(f"operator #{step.operator.index} {step.operator.opcode} produced "
                                         f"{array.dtype}{list(array.shape)} for tensor "
                                         f"{self._tensors[index].name!r}, declared {dtype}{list(shape)}")
                values[index] = array
