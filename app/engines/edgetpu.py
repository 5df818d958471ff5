"""`edgetpu`: the compiled model (<name>_int8_edgetpu.tflite) through libedgetpu's delegate.

One engine = one interpreter bound to one TPU (the delegate opened with device ":N");
the plug-in asks for one per TPU and the registry pools them, so requests spread over
every TPU. Ops the compiler did not map run on the CPU kernels of the same interpreter.
Running is the CPU engine's (set the input, invoke, copy the output), except that an invoke
failing on a TPU that libedgetpu no longer lists is DeviceGone: its request goes to another TPU.

The plug-in owns the start-up policy: library, version pair, devices and each model's compiled file
are checked before anything loads; with EDGETPU_ON_FAILURE=fail a problem stops the service, with
fallback the model is served on `cpu` (its plain int8 file) and readiness says so and why. It owns
the inventory of TPUs (app/edgetpu/inventory.py): which ones this process serves on, listed again by
a probe thread every PROBE_INTERVAL_S, so that TPUs plugged in, unplugged or missing at start are
followed without a restart (the registry's pools follow `interpreters()` after each round). `mine()`
chooses which TPUs found are this process's, at start and at each round: every one, or, where several
processes share the host's TPUs (DEVICE_SHARE), those it claims (app/edgetpu/claims.py); an interpreter
is made only on a TPU this process holds. It owns its settings (EdgeTpuSettings, EDGETPU_SERVE_EDGETPU_*),
its report for GET /v1/devices, its gauges on /metrics, and is watched by the watchdog by default. It
adds its keys to GET /v1/models, configured or not: each model's `edgetpu_estimate` (model.json) and, on
every backend's entry, `edgetpu_view`: what edgetpu_compiler would map of the graph that backend parsed
(the emulator's), null where the backend parsed none.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AliasChoices, Field, field_validator
from pydantic_settings import NoDecode

from app.edgetpu.access import (HOST, DeviceTree, custom_op_message, delegate_failure_message, is_custom_op_error,
                                usb_bus_warning)
from app.edgetpu.claims import Claims
from app.edgetpu.compat import analyze
from app.edgetpu.compiled_model import read_compiled_model
from app.edgetpu.compiler_view import compiler_view
from app.edgetpu.delegate import PERFORMANCE, delegate_options, index_of_path, is_device_spec
from app.edgetpu.delegate import Target
from app.edgetpu.environment import (CheckedLibrary, EdgeTpuEnvironment, Probe, VersionCheck, check_environment,
                                     check_library, probe)
from app.edgetpu.inventory import Inventory, Prober
from app.edgetpu.library import Device, EdgeTpuLibrary, default_library_name
from app.edgetpu.metrics import device_families
from app.edgetpu.report import ServingOn, device_report, probe_report
from app.edgetpu.shortage import no_tpu, probe_note, too_few
from app.edgetpu.temperature import TemperatureWatch
from app.edgetpu.versions import check_model_runtime, package_too_new, pins
from app.engines.base import Backend, Engine, EngineOptions, Fallback, MemberView
from app.engines.cpu import CpuEngine
from app.engines.litert import Runtime, interpreter_threads, prefer_tflite_runtime, runtime
from app.metrics import PREFIX as METRICS_PREFIX, merged_by
from app.edgetpu.errors import EdgeTpuUnavailable, EdgeTpuVersionMismatch
from app.errors import DeviceGone, EngineLoadError, ModelDirError, ServeError
from app.model_dir.reading import ModelDir
from app.model_dir.schema import EDGETPU, INT8, edgetpu_filename
from app.settings import ENV_PREFIX, PluginSettings, plugin_config, words

log = logging.getLogger(__name__)

KEY = "edgetpu"
# Fixed: the shortest PROBE_INTERVAL_S. A round lists the TPUs through libedgetpu and reads sysfs; more often
# than this it would take a core's share for nothing (the tests probe every 0.2 s).
MIN_PROBE_INTERVAL_S = 0.05
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
    # At or above this a PCIe TPU is "hot": a warning line, and its models degraded in /readyz with the
    # reason. 80 °C as Frigate and CodeProject.AI warn, below the driver's first trip point (85 °C).
    temperature_warn_celsius: float = Field(default=80.0, gt=0, le=150)
    # Where the USB Accelerator is looked for when it cannot be used (its nodes, and sysfs' view of the
    # bus): the bootloader-mode diagnosis at start. Other values are for tests and unusual hosts.
    usb_dir: Path = HOST.usb
    usb_sysfs_dir: Path = HOST.usb_sysfs
    # The TPUs are listed again every this many seconds while the service runs: one plugged in (or missing
    # at start) is taken into service, its models loaded and warmed up on it, and those served on the CPU
    # fallback for want of a TPU move back to it; one unplugged leaves the pools. Each round also reads the
    # PCIe TPUs' temperature. 0: never, the TPUs found at start are the only ones used.
    probe_interval_s: float = Field(default=2.0, ge=0, le=300)

    @field_validator("probe_interval_s")
    @classmethod
    def _probe_interval(cls, value: float) -> float:
        if 0 < value < MIN_PROBE_INTERVAL_S:
            raise ValueError(f"0 (never) or at least {MIN_PROBE_INTERVAL_S} s")
        return value

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
    tree: DeviceTree = HOST             # where its access problems are looked for
    # asked when an invoke fails: whether that TPU is gone (not listed any more); the inventory's
    gone: Callable[[str], bool] | None = field(default=None, compare=False, repr=False)


class EdgeTpuEngine(CpuEngine):
    key = KEY
    model_file = EDGETPU
    tpu: Device | None = None
    gone: Callable[[str], bool] | None = None
    # where several processes share the TPUs: counts this interpreter closed on its TPU's claim (once)
    release: Callable[[], object] | None = None

    def close(self) -> None:
        super().close()
        if self.release is not None:
            self.release()

    def run(self, inputs):
        """As the CPU engine's; an invoke that fails on a TPU that is no longer listed is DeviceGone (its
        request goes to another TPU, app/pool/lane.py), any other failure is the request's."""
        try:
            return super().run(inputs)
        except RuntimeError as e:
            tpu = self.tpu
            if tpu is not None and self.gone is not None and self.gone(tpu.path):
                log.warning("Edge TPU %s %s: its invoke failed, and libedgetpu does not list it any more: %s",
                            tpu.type, tpu.path, str(e).strip())
                raise DeviceGone(f"edgetpu: the Edge TPU {tpu.type} {tpu.path} is gone: libedgetpu does not list "
                                 "it any more (unplugged?)", device=tpu.path) from None
            raise

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
                "edgetpu: " + delegate_failure_message(options.library, device, where, str(e), options.tree)) from None
        try:
            interpreter = rt.Interpreter(model_path=str(path), experimental_delegates=[delegate],
                                         num_threads=interpreter_threads(path, options.cpu_threads))
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
        engine = cls(interpreter)
        engine.tpu, engine.gone = options.tpu, options.gone
        return engine


def check_tpus(library: str | None, devices: list[str], version_check: VersionCheck,
               tree: DeviceTree = HOST) -> EdgeTpuEnvironment:
    """The start-up check against the TFLite runtime this process uses."""
    rt = runtime()
    return check_environment(library or default_library_name(), devices, rt.name, rt.version, version_check, tree)


def check_compiled_model(model_dir: ModelDir, environment: CheckedLibrary) -> Path:
    """The model's compiled file: present, unaltered, and not newer than the library's runtime.
    A segmented model (app/pool/pipeline.py): every segment's compiled file, checked the same way."""
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


def _check_compiled_file(model_dir: ModelDir, path: Path, environment: CheckedLibrary) -> None:
    compiled = read_compiled_model(path)
    if compiled.edgetpu_ops == 0:
        log.warning("model %s: %s has no edgetpu-custom-op node: edgetpu_compiler mapped nothing, every op "
                    "runs on the CPU", model_dir.name, path.name)
    check_model_runtime(model_dir.name, path, compiled.min_runtime_version, compiled.compiler_version,
                        environment.version)


def tpu_options(library: str, targets: list[Target], cpu_threads: int, performance: str | None,
                tree: DeviceTree = HOST, gone: Callable[[str], bool] | None = None) -> list[EdgeTpuOptions]:
    """One engine's options per TPU in service."""
    return [EdgeTpuOptions(cpu_threads=cpu_threads, library=library, device=target.spec, tpu=target.device,
                           performance=performance, tree=tree, gone=gone)
            for target in targets]


def reopen_options(options: EdgeTpuOptions, library: EdgeTpuLibrary) -> EdgeTpuOptions:
    """The same TPU, found again by its path: after a reset a USB Accelerator may list elsewhere, and others
    plugged in or unplugged since move its index."""
    devices = library.list_devices()
    index = index_of_path(options.tpu.path, devices) if options.tpu else None
    if index is None:
        raise EdgeTpuUnavailable(f"the Edge TPU {options.tpu.type if options.tpu else ''} "
                                 f"{options.tpu.path if options.tpu else options.device} is not listed any more")
    return dataclasses.replace(options, device=f":{index}")


@dataclass(frozen=True)
class LookNow:
    """libedgetpu and the TFLite runtime as they are now, never raising: for GET /v1/devices."""

    runtime: Runtime | None
    probe: Probe
    error: str | None  # why the edgetpu backend cannot be used here


def look_now(library: str | None, tree: DeviceTree = HOST) -> LookNow:
    try:
        rt = runtime()
    except EngineLoadError as e:
        return LookNow(None, probe(library or default_library_name(), "", "", tree), str(e))
    found = probe(library or default_library_name(), rt.name, rt.version, tree)
    return LookNow(rt, found, found.error)


class EdgeTpuBackend(Backend):
    """One interpreter per TPU the start-up check resolved; fail or fall back to `cpu` by setting."""

    key = EdgeTpuEngine.key
    engine = EdgeTpuEngine
    fallback_backend = CpuEngine.key
    host_cpu = False  # the TPU computes; the host's cores only move tensors
    watched = True    # a USB Accelerator can hang until it resets
    execution_provider = "TPU"
    settings_class = EdgeTpuSettings
    lists_devices = True
    model_keys = {"edgetpu_estimate": "Edge TPU latency per invoke ESTIMATED from the model's structure (converter "
                                      "estimate, model.json), per link, with its stated error; not a measurement. "
                                      "Null when not estimated"}
    backend_keys = {"edgetpu_view": "which operators the Edge TPU would run of the graph this backend parsed "
                                    "(offline analysis of what edgetpu_compiler would map: summary, mapped, total, "
                                    "first_unsupported, ops); null when the backend parsed none"}

    config: EdgeTpuSettings

    def __init__(self, settings):
        super().__init__(settings)
        self.checked: CheckedLibrary | None = None  # libedgetpu and the version pair, checked at start
        self.inventory: Inventory | None = None     # the TPUs in service, from start on
        self.claims: Claims | None = None           # where several processes share the TPUs: this one's
        self.prober: Prober | None = None           # lists them again while the service runs (follow())
        self.probe_clock: Callable[[], float] = time.monotonic  # the probe's clock (a test's fake one)
        self._listener: Callable[[bool], bool | None] | None = None
        # engine -> its graph's compiler view: analysed once per interpreter (so per model version),
        # forgotten with the interpreter
        self._views: weakref.WeakKeyDictionary[Engine, dict] = weakref.WeakKeyDictionary()
        self.tree = DeviceTree(usb=self.config.usb_dir, usb_sysfs=self.config.usb_sysfs_dir)
        self.temperatures = TemperatureWatch(self.config.apex_sysfs_dir, self.config.temperature_warn_celsius,
                                             f"{ENV_PREFIX}{KEY.upper()}_TEMPERATURE_WARN_CELSIUS")

    @classmethod
    def named_devices(cls, settings) -> int:
        return len(settings.plugin_settings(cls).devices)

    @classmethod
    def count_devices(cls, settings) -> int:
        """The TPUs named (EDGETPU_DEVICES) or listed, that the start-up check resolves (library, version pair)."""
        config = settings.plugin_settings(cls)
        return len(check_tpus(config.library, config.devices, config.version_check).targets)

    def mine(self, found: list[Target]) -> list[Target]:
        """Which of the TPUs found (listed, named by EDGETPU_DEVICES, usable) this process serves on: every one,
        or, where several processes share the host's TPUs (DEVICE_SHARE), the ones it holds and those it
        claims now (app/edgetpu/claims.py: fair shares, a pipeline's TPUs in one process). The one place
        that chooses, at start and at each probe round alike."""
        return found if self.claims is None else self.claims.choose(found)

    def start(self, models: dict[str, ModelDir]) -> dict[str, Fallback]:
        """Library and version pair, the TPUs there now, then each model's compiled file: fail or fall back.
        With the fallback and no TPU now, every model is served on cpu until the probe finds one."""
        config = self.config
        rt = runtime()
        try:
            self.checked = check_library(config.library or default_library_name(), rt.name, rt.version,
                                         config.version_check)
        except EdgeTpuUnavailable as e:
            every = self._fallback(list(models), e)
            return dict.fromkeys(models, every)
        checked = self.checked
        share = self.settings.device_share
        if share is not None:
            self.claims = Claims(self.settings.device_claims_dir, share, unit=max(
                (m.manifest.segments.count for m in models.values() if m.manifest.segments is not None), default=1))
        inventory = self.inventory = Inventory(checked.library, config.devices, self.mine, self.tree)
        inventory.take()
        targets = inventory.in_service
        log.info("Edge TPU: %s, pinned set %s, %d TPU(s)%s: %s", checked.version.describe(),
                 checked.pinned_set.name if checked.pinned_set else "none (version check: warn)",
                 len(targets), f" (process {share} sharing the host's TPUs)" if share else "",
                 ", ".join(t.label for t in targets) or "none")
        if not targets:
            every = self._fallback(list(models), self._no_tpu())
            return dict.fromkeys(models, every)
        if inventory.waiting_for:
            log.warning("Edge TPU: %s name(s) no TPU now (EDGETPU_SERVE_EDGETPU_DEVICES): serving on %d%s",
                        ", ".join(inventory.waiting_for), len(targets), probe_note(self.config.probe_interval_s))
        if any(t.device.type == "usb" for t in targets) and (warning := usb_bus_warning(self.tree)):
            log.warning("Edge TPU: %s", warning)
        fallbacks = {}
        for name, model_dir in models.items():
            try:
                check_compiled_model(model_dir, checked)
                if (few := too_few(model_dir, len(targets), self.claims)) is not None:
                    raise EdgeTpuUnavailable(few + probe_note(self.config.probe_interval_s))
            except (EdgeTpuUnavailable, ModelDirError) as e:
                fallbacks[name] = self._fallback([name], e)
        return fallbacks

    def _no_tpu(self) -> EdgeTpuUnavailable:
        """Why no TPU is in service now (app/edgetpu/shortage.py), with what the probe will do under fallback."""
        note = probe_note(self.config.probe_interval_s) if self.config.on_failure == "fallback" else ""
        return no_tpu(self.inventory, self.config.devices, self.claims, self.tree, note)

    def recheck(self, model_dir: ModelDir) -> Fallback | None:
        """A model handed to cpu: None when the TPUs in service now can serve it (its compiled file checked
        again), else the fallback that still holds. Never raises: the model is served meanwhile."""
        if self.checked is None or self.inventory is None:
            return Fallback(self.fallback_backend, "libedgetpu was not usable at start")
        targets = self.inventory.in_service
        if not targets:
            return Fallback(self.fallback_backend, str(self._no_tpu()))
        if (few := too_few(model_dir, len(targets), self.claims)) is not None:
            return Fallback(self.fallback_backend, few + probe_note(self.config.probe_interval_s))
        try:
            check_compiled_model(model_dir, self.checked)
        except (EdgeTpuUnavailable, ModelDirError) as e:
            return Fallback(self.fallback_backend, str(e))
        return None

    def fall_back(self, model: str, error: Exception) -> Fallback | None:
        """A delegate that would not open, or every TPU gone while serving: the policy decides (fail: None).
        Any other failure (a compiled file that does not load) leaves the model degraded on the Edge TPU only."""
        if isinstance(error, (EdgeTpuUnavailable, DeviceGone)):
            return self._fallback([model], error) if self.config.on_failure == "fallback" else None
        return super().fall_back(model, error)

    def _fallback(self, names: list[str], error: ServeError) -> Fallback:
        if self.config.on_failure == "fail":
            raise error
        log.warning("edgetpu unavailable for %s, serving on %s (EDGETPU_SERVE_EDGETPU_ON_FAILURE=fallback): %s",
                    ", ".join(names), self.fallback_backend, error)
        return Fallback(self.fallback_backend, str(error))

    def interpreters(self) -> list[EngineOptions]:
        """One interpreter per TPU in service now; EdgeTpuUnavailable when there is none."""
        if self.inventory is None:
            raise EdgeTpuUnavailable("edgetpu: libedgetpu was not usable at start")
        targets = self.inventory.in_service
        if not targets:
            raise self._no_tpu()
        return tpu_options(self.checked.library.path, targets, self.settings.cpu_threads, self.config.performance,
                           self.tree, self.inventory.gone)

    def load(self, path: Path, options: EngineOptions) -> Engine:
        """Its TPU found again by path first: its index may have moved since the last listing. Where several
        processes share the TPUs, only on a TPU this process holds, counted open on its claim until closed."""
        if not isinstance(options, EdgeTpuOptions) or options.tpu is None:
            return self.engine.load(path, options)
        if self.checked is not None:
            options = reopen_options(options, self.checked.library)
        if self.claims is None:
            return self.engine.load(path, options)
        closed = self.claims.open(options.tpu.path)
        try:
            engine = self.engine.load(path, options)
        except BaseException:
            closed()
            raise
        engine.release = weakref.finalize(engine, closed)  # on close(), or when collected unclosed
        return engine

    def device(self, options: EngineOptions) -> str | None:
        tpu = getattr(options, "tpu", None)
        return tpu.path if tpu else None

    def reopen(self, options: EngineOptions) -> EngineOptions:
        return reopen_options(options, self.checked.library)

    # -- TPUs coming and going --------------------------------------------------------------------

    def follow(self, listener: Callable[[bool], bool | None]) -> None:
        """From now on, list the TPUs every PROBE_INTERVAL_S (and at once when an invoke finds its TPU gone),
        read the PCIe TPUs' temperature, and call `listener(changed)` after each round; a listener that
        returns False is gone (its registry), and the probe stops. Nothing without an inventory (libedgetpu
        or its version pair refused at start) or with the probe off."""
        if self.inventory is None or not self.config.probe_interval_s or self.prober is not None:
            return
        self._listener = listener
        self.prober = Prober(self.config.probe_interval_s, self._probe_round, clock=self.probe_clock)
        self.inventory.wake = self.prober.wake
        self.prober.start()

    def _probe_round(self) -> None:
        change = self.inventory.take()
        self.temperatures.read()  # a TPU getting hot is logged within one round, scraped or not
        if self._listener is not None and self._listener(bool(change)) is False:
            self.prober.stop(0)

    def close(self) -> None:
        """Stop the probe (after the round under way, which may be loading interpreters: at most CLOSE_TIMEOUT_S);
        let the claims go as their interpreters close."""
        wait_s = self.settings.close_timeout_s
        if self.prober is not None and not self.prober.stop(wait_s):
            log.warning("Edge TPU probe: a round still under way after %.0f s; leaving it", wait_s)
        if self.claims is not None:
            self.claims.close()

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

    def device_problems(self) -> dict[str, str]:
        """/readyz: the TPUs in use that run hot (PCIe: the driver's sysfs), by device path."""
        if self.inventory is None:
            return {}
        hot = self.temperatures.hot()
        return {t.device.path: hot[apex] for t in self.inventory.in_service
                if t.device.type == "pci" and (apex := Path(t.device.path).name) in hot}

    def report(self, members: list[MemberView]) -> dict:
        """GET /v1/devices: the TPUs libedgetpu lists now, what runs on each, the runtime versions, and
        each PCIe TPU's temperature with its driver's trip points and warning levels; what the probe does
        (assembled by app/edgetpu/report.py)."""
        now = look_now(self.config.library, self.tree)
        rt = now.runtime
        runtime_out = dict(name=rt.name, version=rt.version, module=rt.module.__name__) if rt else None
        serving = [ServingOn(m.device, m.options.tpu.type, dict(
            model=m.model, healthy=m.healthy, problem=m.problem, load_ms=m.load_ms,
            first_inference_ms=m.first_inference_ms)) for m in members]
        running = self.prober is not None and not self.prober.stopped
        return device_report(now.probe, runtime_out, now.error, serving, self.inventory, self.temperatures,
                             probe_report(self.inventory, self.config.probe_interval_s, running))

    def collect(self, members: list[MemberView]) -> Iterable:
        """/metrics: the TPUs in service and listed, the probe's rounds and the TPUs that joined and left, each
        TPU's health, and the PCIe TPUs' temperature with the driver's trip points and warning levels, and
        the service's own warning threshold (app/edgetpu/metrics.py device_families)."""
        healthy: dict[str, bool] = {}
        for member in members:
            healthy[member.device] = healthy.get(member.device, True) and member.healthy
        for family, merge in device_families(f"{METRICS_PREFIX}_{KEY}", self.inventory, healthy, self.temperatures):
            yield merged_by(family, merge)

PLUGIN = EdgeTpuBackend
