"""One module per family of TFLite kernels; each exports PREPARE: opcode -> prepare(OpView) -> Step.

An opcode whose 8-bit quantized kernel and float/integer kernel live in different modules (ADD on uint8 in
elementwise.py, ADD on float32 in arithmetic.py) gets one prepare that picks by the output tensor's type.
"""

from __future__ import annotations

from app.emulator.kernels import (activations, arithmetic, conv, detection, elementwise, matmul, pooling, quantize,
                                  reduce, resize, shape, stack)
from app.emulator.kernels.common import by_output_type

PREPARE = {}
for _module in (conv, matmul, elementwise, arithmetic, activations, pooling, reduce, shape, stack, resize, quantize,
                detection):
    PREPARE.update(_module.PREPARE)
for _opcode, _prepare in arithmetic.FLOAT_AND_INTEGER_PREPARE.items():
    PREPARE[_opcode] = by_output_type(PREPARE[_opcode], _prepare)
