"""A numpy executor for full-integer TFLite models, bit-exact with TFLite's reference kernels.

Depends on nothing above it in the service (no web framework, no registry): the `emulated`
backend (app/engines/emulated.py) wraps it, and scripts can use Interpreter directly.
"""

from app.emulator.errors import (InvalidTensor, InvokeFailed, UnsupportedModel, UnsupportedOperator,
                                 UnsupportedOperators)
from app.emulator.interpreter import Interpreter
from app.emulator.plan import supported_opcodes

__all__ = ["Interpreter", "InvalidTensor", "InvokeFailed", "UnsupportedModel", "UnsupportedOperator",
           "UnsupportedOperators", "supported_opcodes"]
