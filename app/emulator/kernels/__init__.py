"""One module per family of TFLite kernels; each exports PREPARE: opcode -> prepare(OpView) -> Step."""

from __future__ import annotations

from app.emulator.kernels import (activations, conv, detection, elementwise, pooling, quantize, reduce, resize, shape,
                                  stack)

PREPARE = {}
for _module in (conv, elementwise, activations, pooling, reduce, shape, stack, resize, quantize, detection):
    PREPARE.update(_module.PREPARE)
