"""What every backend offers: a plug-in (Backend) that makes interpreters (Engine).

A Backend is what the registry drives, the same way for every key: check the environment
at start (and say which models it cannot serve, and which backend serves them instead),
name the model file it runs, list the interpreters to make and their options, load one,
reopen a lost device. A plug-in also owns its parts of the service: its own settings (a
PluginSettings class read from EDGETPU_SERVE_<KEY>_*), its report for GET /v1/devices, its
Prometheus gauges, whether the watchdog watches its interpreters by default, and the keys it
adds to GET /v1/models (describe_model, describe_backend): the core names no backend.

An Engine is one interpreter: not thread-safe, used by one request at a time (the
registry pools them). Engines move tensors only: no decoding, no labels, and no idea of a task. An
engine declares every input and output tensor of its graph in the interpreter's order, names
included, and runs with all its inputs, giving back all its outputs: whether a model fits a front
door (one image in) and a task (its outputs by role) is checked at load, by the registry and the
task (app/tasks/), never here.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from app.settings import PluginSettings, Settings

if TYPE_CHECKING:
    from app.model_dir.reading import ModelDir
    from app.tflite_file import TfliteModel

@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: np.dtype
    scale: float
    zero_point: int

    @classmethod
    def from_detail(cls, detail: dict) -> TensorSpec:
        scale, zero_point = detail["quantization"]
        return cls(detail["name"], tuple(int(d) for d in detail["shape"]), np.dtype(detail["dtype"]),
                   float(scale), int(zero_point))


@dataclass(frozen=True)
class EngineOptions:
    cpu_threads: int = 1


class Engine(ABC):
    key: ClassVar[str]
    # which file of the model directory this backend runs (app/model_dir/schema.py kinds)
    model_file: ClassVar[str]

    # Every input and output tensor of the graph, in the interpreter's order.
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    # The graph as app.tflite_file read it, for engines that parse it themselves (emulated): a
    # plug-in's analysis of the model (describe_backend) reuses it rather than reading the file again.
    parsed_model: TfliteModel | None = None

    @classmethod
    @abstractmethod
    def load(cls, path: Path, options: EngineOptions) -> Engine:
        """Create and allocate the interpreter; raise EngineLoadError with the reason."""

    @abstractmethod
    def run(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """One inference: every input tensor in `self.inputs` order (each with its batch dimension) ->
        a copy of every output tensor, in `self.outputs` order."""

    def close(self) -> None:
        """Release the interpreter (and its device) now rather than at garbage collection."""


class InterpreterEngine(Engine):
    """An engine around an object with TFLite's Python Interpreter interface (TFLite's own, or the
    emulator's): any number of input and output tensors, in the interpreter's order."""

    def __init__(self, interpreter):
        self._interpreter = interpreter
        inputs, outputs = interpreter.get_input_details(), interpreter.get_output_details()
        self.inputs = tuple(TensorSpec.from_detail(detail) for detail in inputs)
        self.outputs = tuple(TensorSpec.from_detail(detail) for detail in outputs)
        self._input_indices = tuple(detail["index"] for detail in inputs)
        self._output_indices = tuple(detail["index"] for detail in outputs)

    def run(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        interpreter = self._interpreter
        for index, x in zip(self._input_indices, inputs, strict=True):
            interpreter.set_tensor(index, x)
        interpreter.invoke()
        return [interpreter.get_tensor(index) for index in self._output_indices]  # get_tensor copies

    def close(self) -> None:
        self._interpreter = None


@dataclass(frozen=True)
class MemberView:
    """What a plug-in reads of one pool member running its interpreters (report(), collect()): a copy made by
    the registry when asked, so that plug-ins, below the pool, never reach into the pool's members. A member
    is one interpreter of a whole model, or a pipeline of one per segment."""

    model: str
    device: str | None  # the device it is bound to (a pipeline's: its devices, comma-separated)
    healthy: bool
    problem: str | None  # why it is unhealthy
    load_ms: float
    first_inference_ms: float | None  # None until its first inference (the warm-up)
    options: EngineOptions | None  # how its (first) interpreter was loaded: the plug-in's own options class


@dataclass(frozen=True)
class Fallback:
    """A model a backend cannot serve here, the backend that serves it instead, and why. `backend`
    None: no backend serves it instead (the model has no file this backend runs: a compiled-only
    model on `cpu`); the model is degraded, and a request for it on this backend is told why."""

    backend: str | None
    reason: str


class Backend:
    """A backend plug-in. Subclasses set `key` and `engine`; the defaults suit an interpreter
    that needs no device: `workers` identical interpreters, nothing to check at start."""

    key: ClassVar[str]
    engine: ClassVar[type[Engine]]
    # Whether its interpreters compute on the host's cores or on a device that leaves them
    # free: image work gets the cores the interpreters leave.
    host_cpu: ClassVar[bool] = True
    # Whether the watchdog watches its interpreters unless EDGETPU_SERVE_WATCHDOG_BACKENDS says
    # otherwise: a device that can hang (a USB accelerator until it resets) is; the host's cores are not.
    watched: ClassVar[bool] = False
    # The kind of processor it runs models on, as CodeProject.AI's `executionProvider` names it (CPU, TPU, GPU).
    execution_provider: ClassVar[str] = "CPU"
    # Its own settings class; None: it has none.
    settings_class: ClassVar[type[PluginSettings] | None] = None
    # Whether it lists devices of its own on the host (TPUs): EDGETPU_SERVE_PROCESSES=auto counts them
    # (named_devices, count_devices), and several processes share them.
    lists_devices: ClassVar[bool] = False
    # The keys describe_model and describe_backend add, each with what it means (GET /openapi.json
    # lists them in ModelDescription and BackendDescription, app/core/catalog.py).
    model_keys: ClassVar[dict[str, str]] = {}
    backend_keys: ClassVar[dict[str, str]] = {}

    @classmethod
    def named_devices(cls, settings: Settings) -> int:
        """EDGETPU_SERVE_PROCESSES=auto: how many devices its settings name one by one, counted without
        looking at the host; 0 where they name none (count_devices then lists them)."""
        return 0

    @classmethod
    def count_devices(cls, settings: Settings) -> int:
        """EDGETPU_SERVE_PROCESSES=auto: the devices of its own the host gives the service, listed as at start,
        none opened (app/processes/inventory.py calls it in a child process). A ServeError says why there
        is none."""
        return 0

    def __init__(self, settings: Settings):
        self.settings = settings
        # its own settings, read once (None without a settings class)
        self.config = settings.plugin_settings(type(self))

    @property
    def model_file(self) -> str:
        """Which file of a model directory this backend runs (a kind of app/model_dir/schema.py)."""
        return self.engine.model_file

    def start(self, models: dict[str, ModelDir]) -> dict[str, Fallback]:
        """Check the environment before any interpreter loads. Raise a ServeError to stop the
        service; return the models this backend cannot serve, to be served by another one (or by
        none). By default: the models without the file this backend runs."""
        return {name: Fallback(None, reason) for name, model_dir in models.items()
                if (reason := model_dir.missing(self.model_file)) is not None}

    def fall_back(self, model: str, error: Exception) -> Fallback | None:
        """An interpreter of `model` failed to load (an operator it cannot run, say), or every device serving it
        left: the backend to serve it instead, Fallback(None, why) for none (the model is degraded on this
        backend only, and serves on the others), or None: the model fails (the load), or waits for a device
        (while serving). The policy is the plug-in's; by default the model is degraded on this backend."""
        return Fallback(None, str(error))

    def interpreters(self) -> list[EngineOptions]:
        """One entry per interpreter to make for a model."""
        return [EngineOptions(cpu_threads=self.settings.cpu_threads)] * self.settings.workers

    def load(self, path: Path, options: EngineOptions) -> Engine:
        return self.engine.load(path, options)

    def device(self, options: EngineOptions) -> str | None:
        """The device an interpreter made with these options is bound to (health reports)."""
        return None

    def reopen(self, options: EngineOptions) -> EngineOptions:
        """Options to load a lost interpreter again, on the same device (the watchdog)."""
        return options

    def explain_load_error(self, backend: str, path: Path, error: Exception) -> Exception | None:
        """`backend` failed to load `path`: a clearer error if this plug-in recognises why (a file
        made for its device, given to another backend), else None."""
        return None

    def follow(self, listener: Callable[[bool], bool | None]) -> None:
        """Follow this backend's devices while the service runs (a plug-in whose devices come and go: TPUs
        plugged in and unplugged): look at them again now and then, on a thread of its own, and after each
        look call `listener(changed)`, `changed` saying whether the devices in use changed, so that the
        registry's pools follow `interpreters()` and models move between their fallback and this backend.
        A listener that returns False is gone: stop. By default nothing: devices that never change."""

    def recheck(self, model_dir: ModelDir) -> Fallback | None:
        """A model this backend handed to another one: None when it can serve it now (its devices changed),
        else the fallback that still holds. Never raises."""
        reason = model_dir.missing(self.model_file)
        return None if reason is None else Fallback(None, reason)

    def close(self) -> None:
        """Stop what `follow` started (the registry's close)."""

    def device_problems(self) -> dict[str, str]:
        """Devices that still serve but are in trouble now (a TPU running hot), by device as device()
        names it: what is wrong and the fix. The models with an interpreter on one read "degraded" with it
        in /readyz. Called at each readiness check: keep it cheap."""
        return {}

    def report(self, members: list[MemberView]) -> dict | None:
        """What this backend says about itself and its devices for GET /v1/devices (a JSON object);
        `members`: every pool member it runs, of every model. None: nothing to report."""
        return None

    def collect(self, members: list[MemberView]) -> Iterable:
        """Its Prometheus metric families, read at each scrape (device counts, health, temperature);
        members as for report(). Names start with app.metrics.PREFIX."""
        return ()

    def describe_model(self, model_dir: ModelDir) -> dict:
        """Keys this plug-in adds to a model's entry in GET /v1/models (JSON values; declared in
        model_keys), configured or not: what it reads in the model's directory about its own device.
        Called per request."""
        return {}

    def describe_backend(self, backend: str, engine: Engine, model_dir: ModelDir) -> dict:
        """Keys this plug-in adds to the entry of `backend` (any backend, its own or another's) in a
        model's GET /v1/models answer (declared in backend_keys); `engine` is one of that backend's interpreters of the serving
        version. Called per request: cache what costs (per engine, so per model version)."""
        return {}
