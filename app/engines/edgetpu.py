"""`edgetpu`: the compiled model (<name>_int8_edgetpu.tflite) through libedgetpu's delegate.

One engine = one interpreter bound to one TPU (the delegate opened with device ":N");
the plug-in asks for one per TPU and the registry pools them, so requests spread over
every TPU. Ops the compiler did not map run on the CPU kernels of the same interpreter.
Running is the CPU engine's: set the input, invoke, copy the output; only loading differs.

The plug-in owns the start-up policy: library, version pair, devices and each model's
compiled file are checked before anything loads; with EDGETPU_ON_FAILURE=fail a problem
stops the service, with fallback the model is served on `cpu` (its plain int8 file) and
readiness says so and why. It owns its settings (EdgeTpuSettings, EDGETPU_SERVE_EDGETPU_*), its
report for GET /v1/devices, its gauges on /metrics, and is watched by the watchdog by default.
It adds its keys to GET /v1/models, configured or not: each model's `edgetpu_estimate` (model.json)
and, on every backend's entry, `edgetpu_view`: what edgetpu_compiler would map of the graph that
backend parsed (the emulator's), null where the backend parsed none.
"""

from __future__ import annotations

import dataclasses
import logging
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal

from prometheus_client.core import GaugeMetricFamily
from pydantic import AliasChoices, Field, field_validator
from pydantic_settings import NoDecode

from app.edgetpu.access import custom_op_message, delegate_failure_message, is_custom_op_error
from app.edgetpu.compat import analyze
from app.edgetpu.compiled_model import read_compiled_model
from app.edgetpu.compiler_view import compiler_view
from app.edgetpu.delegate import PERFORMANCE, delegate_options, index_of_path, is_device_spec
from app.edgetpu.environment import EdgeTpuEnvironment, Probe, VersionCheck, check_environment, probe
from app.edgetpu.library import Device, default_library_name
from app.edgetpu.report import EdgeTpuReport
from app.edgetpu.temperature import apex_temperatures
from app.edgetpu.versions import check_model_runtime, package_too_new, pins
from app.engines.base import Backend, Engine, EngineOptions, Fallback
from app.engines.cpu import CpuEngine
from app.engines.litert import Runtime, prefer_tflite_runtime, runtime
from app.metrics import PREFIX as METRICS_PREFIX, merged_by
from app.edgetpu.errors import EdgeTpuUnavailable, EdgeTpuVersionMismatch
from app.errors import EngineLoadError, ModelDirError, ServeError
from app.model_dir import EDGETPU, INT8, ModelDir, edgetpu_filename
from app.settings import ENV_PREFIX, DeviceShare, PluginSettings, plugin_config, words

log = logging.getLogger(__name__)

KEY = "edgetpu"
# libedgetpu and the TFLite runtime must come from the same TensorFlow build: where an image
# installs a pinned tflite_runtime (app/edgetpu/versions.toml), every backend uses it.
prefer_tflite_runtime(version_set.tflite_runtime for version_set in pins().sets)


class EdgeTpuSettings(PluginSettings):
    """The Edge TPU plug-in's settings, EDGETPU_SERVE_EDGETPU_*. One interpreter per TPU: the core's
    WORKERS does not apply to it."""

    model_config = plugin_config(KEY, populate_by_name=True)

    # The platform's libedgetpu (libedgetpu.so.1, libedgetpu.1.dylib, edgetpu.dll) unless a path is given.
    library: str | None = None
    # Delegate device specs, one interpreter each (":0", "usb", "usb:1", "pci:0"); empty = every TPU listed.
    devices: Annotated[list[str], NoDecode] = []
    performance: Literal[PERFORMANCE] | None = Field(
        default=None, description="the delegate's Performance option; unset = the library's default (Max)")
    # fail: refuse to start without a usable TPU; fallback: serve those models on `cpu` (plain int8 file).
    on_failure: Literal["fail", "fallback"] = "fail"
    # strict: libedgetpu + TFLite runtime must be a pinned set (app/edgetpu/versions.toml); warn: log and go on.
    version_check: Literal["strict", "warn"] = "strict"
    # Where the PCIe driver (gasket/apex) exposes each TPU's `temp`, read for /metrics. Its variable
    # keeps its first name, EDGETPU_SERVE_APEX_SYSFS_DIR.
    apex_sysfs_dir: Path = Field(default=Path("/sys/class/apex"), validation_alias=AliasChoices(
        f"{ENV_PREFIX}APEX_SYSFS_DIR", f"{ENV_PREFIX}{KEY.upper()}_APEX_SYSFS_DIR"))

    @field_validator("devices", mode="before")
    @classmethod
    def _device_specs(cls, value):
        value = words(value)
        wrong = [spec for spec in value if not is_device_spec(spec)]
        if wrong:
            raise ValueError(f"{wrong}: each device is ':N', 'usb', 'usb:N', 'pci' or 'pci:N'")
        return value


@dataclass(frozen=True)
class EdgeTpuOptions(EngineOptions):
    """Which TPU this interpreter opens, and how."""

    library: str = field(default_factory=default_library_name)
    device: str | None = None           # a delegate `device` spec; None = any TPU
    tpu: Device | None = None           # the listed device it resolved to (for messages)
    performance: str | None = None      # Low | Medium | High | Max; None = the library's default


class EdgeTpuEngine(CpuEngine):
    key = KEY
    model_file = EDGETPU

    @classmethod
    def load(cls, path: Path, options: EngineOptions) -> EdgeTpuEngine:
        if not isinstance(options, EdgeTpuOptions):
            options = EdgeTpuOptions(cpu_threads=options.cpu_threads)
        rt = runtime()
        where = options.device or "any TPU"
        try:
            delegate = rt.load_delegate(options.library, delegate_options(options.device, options.performance))
        except OSError as e:  # the library itself did not load
            raise EdgeTpuUnavailable(f"edgetpu: cannot load the delegate library {options.library}: {e}") from None
        except ValueError as e:  # the library loaded, the device did not open
            device = options.tpu or Device("unknown", "")
            raise EdgeTpuUnavailable(
                "edgetpu: " + delegate_failure_message(options.library, device, where, str(e))) from None
        try:
            interpreter = rt.Interpreter(model_path=str(path), experimental_delegates=[delegate],
                                         num_threads=options.cpu_threads)
            interpreter.allocate_tensors()
        except (ValueError, RuntimeError) as e:
            too_new = package_too_new(str(e))
            if too_new:
                required, installed = too_new
                raise EdgeTpuVersionMismatch(
                    f"edgetpu: {path.name} needs Edge TPU runtime {required}, libedgetpu here is runtime "
                    f"{installed}. Fix: recompile with `edgetpu_compiler -m {installed}`, or install a "
                    f"libedgetpu with runtime {required} or newer") from None
            raise EngineLoadError(f"edgetpu: cannot load {path} on {where}: {e}") from None
        cls.check_single_io(interpreter, cls.key, path)
        return cls(interpreter)


def check_tpus(library: str | None, devices: list[str], version_check: VersionCheck) -> EdgeTpuEnvironment:
    """The start-up check against the TFLite runtime this process uses."""
    rt = runtime()
    return check_environment(library or default_library_name(), devices, rt.name, rt.version, version_check)


def check_compiled_model(model_dir: ModelDir, environment: EdgeTpuEnvironment) -> Path:
    """The model's compiled file: present, unaltered, and not newer than the library's runtime.
    A segmented model (app/pipeline.py): every segment's compiled file, checked the same way."""
    if model_dir.manifest.segments is not None:
        try:
            paths = model_dir.segment_files(EDGETPU)
        except ModelDirError as e:
            raise ModelDirError(f"{e}. Fix: segment it again with --compile (python -m converter segment "
                                "models/<name> --segments K --out DIR --compile), or serve it on cpu") from None
        for path in paths:
            _check_compiled_file(model_dir, path, environment)
        return paths[0]
    if not model_dir.has(EDGETPU):
        plain = model_dir.manifest.files[INT8].path if model_dir.has(INT8) else "its int8 model"
        raise ModelDirError(
            f"model {model_dir.name!r} has no Edge TPU file ({edgetpu_filename(model_dir.name)}, kind "
            f"{EDGETPU!r} in model.json). Fix: compile {plain} with `edgetpu_compiler -m "
            f"{environment.version.runtime_version} {plain}` (x86-64 Linux, Coral's edgetpu-compiler package) "
            "and add the output to the model directory, or serve this model on cpu "
            "(EDGETPU_SERVE_EDGETPU_ON_FAILURE=fallback)")
    path = model_dir.file(EDGETPU)
    _check_compiled_file(model_dir, path, environment)
    return path


def _check_compiled_file(model_dir: ModelDir, path: Path, environment: EdgeTpuEnvironment) -> None:
    compiled = read_compiled_model(path)
    if compiled.edgetpu_ops == 0:
        log.warning("model %s: %s has no edgetpu-custom-op node: edgetpu_compiler mapped nothing, every op "
                    "runs on the CPU", model_dir.name, path.name)
    check_model_runtime(model_dir.name, path, compiled.min_runtime_version, compiled.compiler_version,
                        environment.version)


def tpu_options(environment: EdgeTpuEnvironment, cpu_threads: int, performance: str | None) -> list[EdgeTpuOptions]:
    """One engine's options per TPU the start-up check resolved."""
    return [EdgeTpuOptions(cpu_threads=cpu_threads, library=environment.library.path, device=target.spec,
                           tpu=target.device, performance=performance)
            for target in environment.targets]


def take_share(environment: EdgeTpuEnvironment, share: DeviceShare | None,
               models: dict[str, ModelDir]) -> EdgeTpuEnvironment:
    """This process's TPUs when several processes serve the host (app/processes): its share of the
    TPUs resolved, so that no TPU is opened by two processes. A process with no TPU, or with fewer than
    a segmented model's segments (a pipeline's TPUs live in one process), is a configuration error: it
    stops the start whatever EDGETPU_ON_FAILURE says, rather than serve some requests on the CPU."""
    if share is None:
        return environment
    targets = share.of(environment.targets)
    found = len(environment.targets)
    segments = {name: m.manifest.segments.count for name, m in models.items() if m.manifest.segments is not None}
    needed = max(segments.values(), default=1)
    if len(targets) < needed:
        most = found // needed
        why = (f"model {max(segments, key=segments.get)!r} is cut into {needed} segments, whose TPUs must be "
               f"in one process, and share {share} of {found} TPU(s) has {len(targets)}" if segments else
               f"share {share} of {found} TPU(s) has none: a TPU is opened by one process only")
        fix = (f"at most {most} process(es) (EDGETPU_SERVE_PROCESSES, or gunicorn's --workers), or "
               "EDGETPU_SERVE_PROCESSES=auto" if most else "add TPUs, or segment the model into fewer parts")
        raise ServeError(f"edgetpu: {share.count} processes for {found} TPU(s): {why}. Fix: {fix}")
    return dataclasses.replace(environment, targets=targets)


def reopen_options(options: EdgeTpuOptions, environment: EdgeTpuEnvironment) -> EdgeTpuOptions:
    """The same TPU, found again by its path: after a reset a USB Accelerator may list elsewhere."""
    devices = environment.library.list_devices()
    index = index_of_path(options.tpu.path, devices) if options.tpu else None
    if index is None:
        raise EdgeTpuUnavailable(f"the Edge TPU {options.tpu.type if options.tpu else ''} "
                                 f"{options.tpu.path if options.tpu else options.device} is not listed any more")
    return dataclasses.replace(options, device=f":{index}")


@dataclass(frozen=True)
class Inventory:
    """libedgetpu and the TFLite runtime as they are now, never raising: for GET /v1/devices."""

    runtime: Runtime | None
    probe: Probe
    error: str | None  # why the edgetpu backend cannot be used here


def inventory(library: str | None) -> Inventory:
    try:
        rt = runtime()
    except EngineLoadError as e:
        return Inventory(None, probe(library or default_library_name(), "", ""), str(e))
    found = probe(library or default_library_name(), rt.name, rt.version)
    return Inventory(rt, found, found.error)


class EdgeTpuBackend(Backend):
    """One interpreter per TPU the start-up check resolved; fail or fall back to `cpu` by setting."""

    key = EdgeTpuEngine.key
    engine = EdgeTpuEngine
    fallback_backend = CpuEngine.key
    host_cpu = False  # the TPU computes; the host's cores only move tensors
    watched = True    # a USB Accelerator can hang until it resets
    settings_class = EdgeTpuSettings
    model_keys = {"edgetpu_estimate": "Edge TPU latency per invoke ESTIMATED from the model's structure (converter "
                                      "estimate, model.json), per link, with its stated error; not a measurement. "
                                      "Null when not estimated"}
    backend_keys = {"edgetpu_view": "which operators the Edge TPU would run of the graph this backend parsed "
                                    "(offline analysis of what edgetpu_compiler would map: summary, mapped, total, "
                                    "first_unsupported, ops); null when the backend parsed none"}

    config: EdgeTpuSettings

    def __init__(self, settings):
        super().__init__(settings)
        self.environment: EdgeTpuEnvironment | None = None
        # engine -> its graph's compiler view: analysed once per interpreter (so per model version),
        # forgotten with the interpreter
        self._views: weakref.WeakKeyDictionary[Engine, dict] = weakref.WeakKeyDictionary()

    def start(self, models: dict[str, ModelDir]) -> dict[str, Fallback]:
        """Library, version pair, devices, then each model's compiled file: fail or fall back."""
        config = self.config
        try:
            self.environment = check_tpus(config.library, config.devices, config.version_check)
        except EdgeTpuUnavailable as e:
            every = self._fallback(list(models), e)
            return dict.fromkeys(models, every)
        env = self.environment = take_share(self.environment, self.settings.device_share, models)
        log.info("Edge TPU: %s, pinned set %s, %d TPU(s)%s: %s", env.version.describe(),
                 env.pinned_set.name if env.pinned_set else "none (version check: warn)", len(env.targets),
                 f" (share {self.settings.device_share})" if self.settings.device_share else "",
                 ", ".join(t.label for t in env.targets))
        fallbacks = {}
        for name, model_dir in models.items():
            try:
                check_compiled_model(model_dir, env)
            except (EdgeTpuUnavailable, ModelDirError) as e:
                fallbacks[name] = self._fallback([name], e)
        return fallbacks

    def fall_back(self, model: str, error: Exception) -> Fallback | None:
        """A delegate that would not open: the policy decides."""
        if isinstance(error, EdgeTpuUnavailable) and self.config.on_failure == "fallback":
            return self._fallback([model], error)
        return None

    def _fallback(self, names: list[str], error: ServeError) -> Fallback:
        if self.config.on_failure == "fail":
            raise error
        log.warning("edgetpu unavailable for %s, serving on %s (EDGETPU_SERVE_EDGETPU_ON_FAILURE=fallback): %s",
                    ", ".join(names), self.fallback_backend, error)
        return Fallback(self.fallback_backend, str(error))

    def interpreters(self) -> list[EngineOptions]:
        return tpu_options(self.environment, self.settings.cpu_threads, self.config.performance)

    def device(self, options: EngineOptions) -> str | None:
        tpu = getattr(options, "tpu", None)
        return tpu.path if tpu else None

    def reopen(self, options: EngineOptions) -> EngineOptions:
        return reopen_options(options, self.environment)

    def explain_load_error(self, backend: str, path: Path, error: Exception) -> Exception | None:
        """A compiled model given to a backend without the delegate (listed as the plain int8 file)."""
        if backend != self.key and is_custom_op_error(str(error)):
            return ModelDirError(custom_op_message(path, backend))
        return None

    def describe_model(self, model_dir: ModelDir) -> dict:
        """GET /v1/models: the latency per invoke estimated from the model's structure (converter
        estimate, model.json), labelled as an estimate; null when it was not estimated."""
        estimate = model_dir.manifest.edgetpu_estimate
        return {"edgetpu_estimate": estimate.model_dump() if estimate else None}

    def describe_backend(self, backend: str, engine: Engine, model_dir: ModelDir) -> dict:
        """GET /v1/models, each backend's entry: which ops of the graph it parsed edgetpu_compiler
        would map (offline analysis), null when the backend parsed none."""
        model = getattr(engine, "parsed_model", None)
        if model is None:
            return {"edgetpu_view": None}
        view = self._views.get(engine)
        if view is None:
            view = self._views[engine] = compiler_view(analyze(model))
        return {"edgetpu_view": view}

    def report(self, members) -> dict:
        """GET /v1/devices: the TPUs libedgetpu lists now, what runs on each, the runtime versions."""
        found_inventory = inventory(self.config.library)
        rt, found = found_inventory.runtime, found_inventory.probe
        by_path: dict[str, list[dict]] = {}
        types: dict[str, str] = {}
        for model, member in members:
            by_path.setdefault(member.device, []).append(dict(
                model=model, healthy=member.healthy, problem=member.problem, load_ms=member.load_ms,
                first_inference_ms=member.first_inference_ms))
            types[member.device] = member.options.tpu.type
        devices = [dict(index=i, type=d.type, path=d.path, health=_health(by_path.get(d.path, []), True),
                        interpreters=by_path.pop(d.path, []))
                   for i, d in enumerate(found.devices)]
        devices += [dict(index=None, type=types[path], path=path, health="missing", interpreters=interpreters)
                    for path, interpreters in by_path.items()]
        version = found.version
        return EdgeTpuReport.model_validate(dict(
            library=dict(path=found.library_path, loaded=found.loaded, version=version and version.text,
                         runtime_version=version and version.runtime_version,
                         package_version=version and version.package),
            tflite_runtime=dict(name=rt.name, version=rt.version, module=rt.module.__name__) if rt else None,
            pinned_set=found.pinned_set,
            devices=devices,
            error=found_inventory.error,
        )).model_dump()

    def collect(self, members):
        """/metrics: the TPUs found at start and used, each TPU's health, and the PCIe TPUs' temperature."""
        prefix = f"{METRICS_PREFIX}_{KEY}"
        count = GaugeMetricFamily(f"{prefix}_devices", "Edge TPUs found at start and used by the service")
        count.add_metric([], len(self.environment.targets) if self.environment is not None else 0)
        yield count
        healthy = GaugeMetricFamily(f"{prefix}_device_healthy", "1 when every interpreter on the TPU is healthy",
                                    labels=("device",))
        by_device: dict[str, bool] = {}
        for _, member in members:
            by_device[member.device] = by_device.get(member.device, True) and member.healthy
        for device, ok in sorted(by_device.items()):
            healthy.add_metric([device], 1.0 if ok else 0.0)
        yield merged_by(healthy, "min")  # several processes: each TPU is one worker's, and healthy only if so there
        temperature = GaugeMetricFamily(f"{prefix}_temperature_celsius",
                                        "TPU temperature from <apex_dir>/apex_N/temp (PCIe and Dev Board)",
                                        labels=("device",))
        for device, celsius in apex_temperatures(self.config.apex_sysfs_dir):
            temperature.add_metric([device], celsius)
        yield merged_by(temperature, "max")  # every worker reads the same sysfs file


def _health(interpreters: list[dict], listed: bool) -> str:
    if not listed:
        return "missing"
    if not interpreters:
        return "unused"
    return "healthy" if all(i["healthy"] for i in interpreters) else "unhealthy"


PLUGIN = EdgeTpuBackend
