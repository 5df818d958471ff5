"""The Edge TPU's own errors: the core knows them as DeviceUnavailable (HTTP 409)."""

from __future__ import annotations

from app.errors import DeviceUnavailable


class EdgeTpuUnavailable(DeviceUnavailable):
    """The Edge TPU cannot be used: no libedgetpu, no device, no access to it, or no delegate."""


class EdgeTpuVersionMismatch(EdgeTpuUnavailable):
    """libedgetpu, the TFLite runtime and the compiled model are not a known-good combination."""
