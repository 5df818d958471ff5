"""Domain errors. No web import here: the HTTP layer maps each class to a status in one table."""

from __future__ import annotations


class ServeError(Exception):
    """Base of every error the service reports to a client or an operator."""


class ModelDirError(ServeError):
    """A model directory is missing, malformed, or a file does not match its sha256."""


class ModelNotFound(ServeError):
    pass


class BackendNotAvailable(ServeError):
    """The backend is unknown, or not loaded for this model."""


class EngineLoadError(ServeError):
    """An engine could not load a model (runtime missing, bad file, unsupported op)."""


class DeviceUnavailable(EngineLoadError):
    """A backend's device cannot be used: no driver library, no device, no access to it, or versions
    that do not go together. Each accelerator's plug-in package defines and raises its own subclass."""


class NotReady(ServeError):
    """The model is still loading, or failed to load."""


class Busy(ServeError):
    """Every interpreter of a pool is taken and the waiting line is full or timed out."""

    def __init__(self, message: str, retry_after_s: float):
        super().__init__(message)
        self.retry_after_s = retry_after_s


class DeviceHung(Busy):
    """An invoke outlived the watchdog: its device is out of the pool until it is re-created."""


class InvokeTimeout(Busy):
    """An invoke outlived its deadline on a backend without a watchdog: the request is answered."""


class ShuttingDown(NotReady):
    """The service is draining for shutdown: requests already admitted finish, new ones are refused."""


class RequestError(ServeError):
    """Something about the request itself is wrong."""


class InvalidParameter(RequestError):
    """A query parameter outside what the service's settings allow (as a schema violation: 422)."""


class EmptyBody(RequestError):
    pass


class UnsupportedMediaType(RequestError):
    pass


class BodyTooLarge(RequestError):
    pass


class ClientGone(RequestError):
    """The client closed the connection (or was dropped by a read deadline) mid-body."""


class BadImage(RequestError):
    """The bytes are not an image we decode (unknown format, corrupt, truncated)."""


class DamagedImage(BadImage):
    """The decoder reports damaged data (corrupt blocks, a truncated file, a wrong checksum)."""


class ImageTooLarge(RequestError):
    """The image decodes to more pixels than allowed (decompression bomb guard)."""
