"""Domain errors, each carrying the HTTP status that says what went wrong (as MLServer's errors do).

No web import here: a status is a number. Each protocol's HTTP layer reads `error.status` once
(app/api/errors.py for /v1; app/api/v2/errors.py for v2, which says 503 or 400 where the Open
Inference Protocol has no 409, 415 or 422). A subclass inherits its parent's status unless it says otherwise.
"""

from __future__ import annotations

from typing import Any


class ServeError(Exception):
    """Base of every error the service reports to a client or an operator."""

    status = 500  # a fault of the service itself; the subclasses say what a client can do about it
    # the model and backend the failed request was for, once known (app/core: a door counts it under them)
    target: Any = None

    def alone(self) -> ServeError:
        """This error without the frames that raised it, nor the errors it was raised from: a refusal handed to
        another thread or a future keeps nothing alive (those frames hold the request's body, and the future that
        holds the error: a cycle that only a full collection frees). Its message already says what went wrong."""
        self.__traceback__ = self.__cause__ = self.__context__ = None
        return self


class ModelDirError(ServeError):
    """A model directory is missing, malformed, or a file does not match its sha256."""

    status = 409  # a reload that finds a broken model on disk: the version already loaded keeps serving


class ModelNotFound(ServeError):
    status = 404


class BackendNotAvailable(ServeError):
    """The backend is unknown, or not loaded for this model: a `backend` value outside those served,
    which GET /openapi.json lists as an enum, so a violation of the schema like any other (422)."""

    status = 422


class EngineLoadError(ServeError):
    """An engine could not load a model (runtime missing, bad file, unsupported op)."""

    status = 409  # as ModelDirError: a reload that fails leaves the loaded version serving


class DeviceUnavailable(EngineLoadError):
    """A backend's device cannot be used: no driver library, no device, no access to it, or versions
    that do not go together. Each accelerator's plug-in package defines and raises its own subclass."""


class NotReady(ServeError):
    """The model is still loading, or failed to load."""

    status = 503


class Busy(ServeError):
    """Every interpreter of a pool is taken and the waiting line is full or timed out."""

    status = 503  # with Retry-After

    def __init__(self, message: str, retry_after_s: float):
        super().__init__(message)
        self.retry_after_s = retry_after_s


class DeviceHung(Busy):
    """An invoke outlived the watchdog: its device is out of the pool until it is re-created."""


class DeviceGone(Busy):
    """A device left while serving (a USB Accelerator unplugged): its interpreters are out of the pool. A
    request inside one is handed to another interpreter, or to the backend the model falls back to; with
    none left, a 503 with Retry-After, until a device is back."""

    def __init__(self, message: str, retry_after_s: float = 1.0, device: str | None = None):
        super().__init__(message, retry_after_s)
        self.device = device  # the device that left, as the plug-in names it (Backend.device)


class InvokeTimeout(Busy):
    """An invoke outlived its deadline on a backend without a watchdog: the request is answered."""

    status = 504


class ShuttingDown(NotReady):
    """The service is draining for shutdown: requests already admitted finish, new ones are refused."""


class RequestError(ServeError):
    """Something about the request itself is wrong."""

    status = 400


class InvalidParameter(RequestError):
    """A query parameter outside what the service's settings allow (as a schema violation: 422)."""

    status = 422


class EmptyBody(RequestError):
    pass


class UnsupportedMediaType(RequestError):
    status = 415


class BodyTooLarge(RequestError):
    status = 413


class ClientGone(RequestError):
    """The client closed the connection (or was dropped by a read deadline) mid-body."""


class BadImage(RequestError):
    """The bytes are not an image we decode (unknown format, corrupt, truncated)."""


class DamagedImage(BadImage):
    """The decoder reports damaged data (corrupt blocks, a truncated file, a wrong checksum)."""


class ImageTooLarge(RequestError):
    """The image decodes to more pixels than allowed (decompression bomb guard)."""

    status = 413
