"""One module per family of TFLite kernels; each exports PREPARE: opcode -> prepare(OpView) -> Step."""

from __future__ import annotations

from app.emulator.kernels import conv, elementwise, quantize, reduce

PREPARE = {}
for _module in (conv, elementwise, quantize, reduce):
    PREPARE.update(_module.PREPARE)
