"""One description of a model, built here once for every door: `describe(registry, name)`.

GET /v1/models shows it whole; the try-it page its one line (`about`); OIP v2's metadata and configuration its
backends' input and named outputs; DOODS' detectors, CodeProject.AI's list and Frigate's ZMQ door the parts they
show (its input, its files, its decoder). No door reads the registry for these: each asks the core
(app/core/core.py `Core.describe`, `Core.models`).

A model's story is told once (`story`): what it is, where it came from, its source, its licence, each fact once. An
import that was told nothing else writes the same fact three times (model.json's `description` "imported from
a.tflite", its `source` "imported: a.tflite (sha256 ...)", and `imported`'s record of the files); the story says it
once, from the record, as the source says it where the source names the files it was imported from.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from app.engines import BACKENDS, TensorSpec
from app.model_dir.reading import ModelDir
from app.model_dir.schema import CORAL, Convention, Manifest
from app.registry import Registry, iso_time
from app.tasks import NamedOutput

# A model.json without `input.convention` is fed by Coral's (app/model_dir/schema.py CONVENTIONS): said so, not null.
CORAL_BY_DEFAULT = Convention(name=CORAL, why="model.json names none: Coral's, as every model built here")


def _plugin_keys(declared: str):
    """json_schema_extra: the keys the registered plug-ins declare (Backend.model_keys or backend_keys),
    listed with what they mean, when GET /openapi.json is built."""

    def add(schema: dict) -> None:
        for key, plugin in BACKENDS.items():
            for name, meaning in getattr(plugin, declared).items():
                schema["properties"].setdefault(name, {"title": name, "description": f"{meaning} (plug-in {key!r})"})

    return add


class TensorDescription(BaseModel):
    name: str
    shape: list[int]
    dtype: str
    scale: float
    zero_point: int


class NamedOutputDescription(BaseModel):
    """One tensor of the task's answer as tensor protocols name it (OIP v2's outputs); its shape per input."""

    name: str
    dtype: str
    shape: list[int]
    scale: float | None = Field(default=None, description="a tensor as the model gave it: its quantization")
    zero_point: int | None = None


class BackendDescription(BaseModel):
    """One backend's interpreters of a model. Backend plug-ins add their own keys (Backend.describe_backend):
    an accelerator's plug-in, say, what its compiler would make of the graph this backend runs."""

    model_config = ConfigDict(extra="allow", json_schema_extra=_plugin_keys("backend_keys"))

    interpreters: int
    warm: bool
    load_ms: float
    first_inference_ms: float | None
    input: TensorDescription
    output: TensorDescription
    outputs: list[NamedOutputDescription] = Field(
        default_factory=list, description="the task's named outputs on this backend (OIP v2's outputs)")


class FileDescription(BaseModel):
    path: str
    sha256: str
    bytes: int


class ImportedFileDescription(BaseModel):
    name: str = Field(description="the file's name as it was given to `converter import`")
    sha256: str
    bytes: int
    kind: str = Field(description="the file kind it became in the model directory (int8, or an accelerator's compiled file)")


class Provenance(BaseModel):
    """Where the model came from: built here from a recipe or by quantize, or imported as a file."""

    origin: str = Field(description="built (a recipe or quantize made it here) or imported (converter import)")
    command: str | None = Field(default=None, description="the command that made the directory (model.json build)")
    files: list[ImportedFileDescription] = Field(default_factory=list, description="imported: the files as given")
    labels: str | None = Field(default=None, description="imported: where the labels came from")
    input: str | None = Field(default=None, description="imported: where the input spec came from")
    metadata: dict | None = Field(default=None, description="imported: the file's own TFLite metadata (name, "
                                                              "author, license, ...)")


class ModelDescription(BaseModel):
    """A model, its state and its backends. Backend plug-ins add their own keys (Backend.describe_model):
    an accelerator's plug-in, say, the latency model.json estimates on its device (an estimate, not a
    measurement)."""

    model_config = ConfigDict(extra="allow", json_schema_extra=_plugin_keys("model_keys"))

    name: str
    task: str = Field(default="classification", description="what the model answers (model.json `task`): "
                      "classification (/v1/models/NAME/classify), detection (/v1/models/NAME/detect), ...")
    state: str = Field(description="loading, ready, degraded (serving, with a problem in `error`), unhealthy, failed")
    error: str | None = None
    since: str | None = Field(default=None, description="when this state began (UTC, ISO 8601)")
    version: int | None = Field(default=None, description="the version serving: 1 at start, +1 per reload")
    loaded_at: str | None = Field(default=None, description="when the serving version loaded (UTC, ISO 8601)")
    default: bool = Field(description="the model of /v1/classify, or for a detector of /v1/detect and "
                                      "/v1/vision/detection")
    about: str = Field(description="the model in one line, each fact once: what it is, where it came from, its "
                                   "source, its licence (the try-it page shows it)")
    description: str
    source: str
    licence: str
    labels: int
    input: dict = Field(description="model.json `input`, its `convention` the one in force (Coral's where "
                                    "model.json names none)")
    output: dict
    detection: dict | None = Field(default=None, description="a detector's decoding (model.json `detection`; the "
                                                              "post-process op's rows where it names none)")
    backends: dict[str, BackendDescription] = Field(description="backend key -> its interpreters of this model")
    backend: str | None = Field(default=None, description="the backend a request that names none is served on "
                                                          "(null while no version serves)")
    files: dict[str, FileDescription]
    quality: dict | None = None
    provenance: Provenance
    segments: dict | None = Field(default=None, description="a segmented model, served as a pipeline: its "
                                  "segments in order (model.json `segments`, docs/pipelines.md)")


def describe(registry: Registry, name: str, serving: bool = False) -> ModelDescription:
    """`name` as clients see it (ModelNotFound for a name not served; `serving`: NotReady too while no version of
    it serves); `default`: it is the model of its task's routes when they name none, as settled at start."""
    status = registry.status(name)
    model_dir = registry.models.model_dir(name)
    version = registry.serving(name)
    if serving and version is None:
        raise registry.models.not_serving(name)
    manifest = model_dir.manifest
    plugins = registry.plugins.values()
    backends = {}
    for key, pool in (version.pools.items() if version else ()):
        members = pool.members
        backends[key] = BackendDescription(
            interpreters=members.interpreters, warm=members.warm, load_ms=members.load_ms,
            first_inference_ms=members.first_inference_ms, input=_tensor(members.inputs[0]),
            output=_tensor(members.outputs[0]), outputs=[_named(out) for out in version.roles[key].named],
            **_added(BackendDescription, (plugin.describe_backend(key, members.engine, model_dir)
                                          for plugin in plugins)))
    return ModelDescription(
        name=name, task=manifest.task, state=status.state, error=status.error, since=iso_time(status.since),
        version=version.number if version else None, loaded_at=iso_time(version.loaded_at) if version else None,
        default=name in registry.defaults.by_task.values(), about=story(manifest),
        description=manifest.description, source=manifest.source, licence=manifest.licence,
        labels=len(model_dir.labels), input=effective_input(manifest),
        output=manifest.output.model_dump(), detection=_detection(manifest),
        backends=backends,
        # where no backend serves it, BackendNotAvailable says why when a serving version was asked for
        backend=registry.backend_for(version, None) if version and (version.pools or serving) else None,
        files={k: FileDescription(**v.model_dump()) for k, v in manifest.files.items()},
        quality=manifest.quality_dict(), provenance=provenance(model_dir),
        segments=manifest.segments.model_dump(mode="json") if manifest.segments else None,
        **_added(ModelDescription, (plugin.describe_model(model_dir) for plugin in plugins)),
    )


def story(manifest: Manifest) -> str:
    """The model in one line: what it is, where it came from, its source, its licence; each fact once."""
    origin, told = _origin(manifest)
    parts = [] if not manifest.description or _only_names_the_file(manifest.description, manifest, origin) else [
        manifest.description]
    parts.append(origin)
    if not told and manifest.source:
        parts.append(f"source: {manifest.source}")
    parts.append(f"licence: {manifest.licence}")
    return " · ".join(parts)


def _origin(manifest: Manifest) -> tuple[str, bool]:
    """Where the model came from, and whether that is its `source` already: an import's source that names every file
    it was imported from with its sha256 (as `converter import` and Frigate's uploads write it, "imported: a.tflite
    (sha256 0123456789ab)") is the origin itself."""
    imported = manifest.imported
    if imported is None:
        return "built here", False
    named = [f"{f.name} (sha256 {f.sha256[:12]})" for f in imported.files]
    if all(name in manifest.source for name in named):
        return manifest.source, True
    return f"imported from {' + '.join(named)}", False


def _only_names_the_file(description: str, manifest: Manifest, origin: str) -> bool:
    """Whether the description is what an import writes for want of one, the file's name again: `converter
    import`'s "imported from a.tflite", a Frigate upload's "a.tflite, uploaded by a Frigate ZMQ client" (its origin
    "uploaded by a Frigate ZMQ client: a.tflite (sha256 ...)")."""
    for f in manifest.imported.files if manifest.imported is not None else ():
        if description == f"imported from {f.name}":
            return True
        if description.startswith(f"{f.name}, ") and origin.startswith(f"{description[len(f.name) + 2:]}: "):
            return True
    return False


def effective_input(manifest: Manifest) -> dict:
    """model.json's `input` with the convention in force: its own, else Coral's (never null)."""
    spec = manifest.input.model_dump()
    spec["convention"] = (manifest.input.convention or CORAL_BY_DEFAULT).model_dump()
    return spec


def _detection(manifest: Manifest) -> dict | None:
    return manifest.detection_spec().model_dump(mode="json") if manifest.task == "detection" else None


def provenance(model_dir: ModelDir) -> Provenance:
    manifest = model_dir.manifest
    command = manifest.build.command if manifest.build else None
    imported = manifest.imported
    if imported is None:
        return Provenance(origin="built", command=command)
    return Provenance(origin="imported", command=command, files=[f.model_dump() for f in imported.files],
                      labels=imported.labels, input=imported.input, metadata=imported.metadata or None)


def _tensor(spec: TensorSpec) -> TensorDescription:
    return TensorDescription(name=spec.name, shape=list(spec.shape), dtype=spec.dtype.name,
                             scale=spec.scale, zero_point=spec.zero_point)


def _named(out: NamedOutput) -> NamedOutputDescription:
    return NamedOutputDescription(name=out.name, dtype=out.dtype.name, shape=list(out.shape), scale=out.scale,
                                  zero_point=out.zero_point)


def _added(out: type[BaseModel], contributions) -> dict:
    """The plug-ins' keys for a description, merged in registry order; the core's own fields win."""
    merged = {}
    for keys in contributions:
        merged.update((key, value) for key, value in keys.items() if key not in out.model_fields)
    return merged
