"""A file a client handed the service over the wire (Frigate's model transfer) as a model directory's contents:
model.json, with its provenance, and the file under the name of its kind (plain, or compiled for the Edge TPU).
`converter import` makes the same from a user's files, with labels and more it can ask for; a client sends the file
alone, so its classes are named by their ids."""

from __future__ import annotations

from app.edgetpu.compat import analyze
from app.importing.graph import GraphFacts, TfliteSource
from app.importing.preprocessing import convention, identity_normalization, pixel_range_caution
from app.model_dir.schema import (
    EDGETPU,
    INT8,
    Build,
    ImportedFile,
    InputSpec,
    Manifest,
    OutputSpec,
    edgetpu_filename,
    int8_filename,
)
from app.model_dir.schema import Imported as ImportedRecord


def handed_over(model: str, source: TfliteSource, facts: GraphFacts, provenance: str, route: str,
                notes: list[str]) -> tuple[Manifest, dict[str, tuple[str, bytes]]]:
    """model.json and the files (kind -> (file name, bytes)) of a detector handed over as `source`, for the image
    doors (the client itself sends tensors): a model its maker's metadata or layout names (Ultralytics') is fed as
    its maker feeds it (pixels / 255, its centred letterbox); any other takes its pixels as they are (the input's own
    quantization), stretched to its size. `provenance` says who handed it over, `route` marks the directories
    written this way."""
    name = source.path.name
    tensor = facts.input
    maker = facts.detector.maker
    height, width = tensor.shape[1:3]
    if maker is not None and maker.normalization is not None:
        (mean, std), resize = maker.normalization, facts.detector.resize
        fed = (f"its maker's: {maker.why}: pixels / 255 and a centred letterbox for the image doors; the tensor the "
               "client sends goes in as it is")
    else:
        identity_mean, identity_std = identity_normalization(tensor)
        mean, std, resize = [identity_mean], [identity_std], "stretch"
        fed = "the input's quantization: the uint8 tensor the client sends goes in as it is"
        caution = pixel_range_caution(tensor)
        notes = notes + ([caution] if caution else [])
    kind, filename = (EDGETPU, edgetpu_filename(model)) if source.compiled else (INT8, int8_filename(model))
    record = ImportedRecord(
        files=[ImportedFile(name=name, sha256=source.sha256, bytes=len(source.data), kind=kind)],
        labels="none: the client keeps its own labelmap; classes are named by number",
        input=fed, scores=f"a detector, {facts.detector.name}: {facts.detector.origin}", notes=notes)
    manifest = Manifest(
        name=model, task="detection", description=f"{name}, {provenance}",
        source=f"{provenance}: {name} (sha256 {source.sha256[:12]})", licence=f"unknown: {provenance}",
        input=InputSpec(width=width, height=height, channels=3, resize=resize, mean=mean, std=std,
                        convention=convention(maker)),
        output=OutputSpec(scores="probabilities"), outputs=facts.detector.outputs, detection=facts.detector.spec,
        edgetpu_analysis=analyze(source.model).summary(),
        build=Build(command=f"{provenance} (model_data {name!r})", route=route), imported=record)
    return manifest, {kind: (filename, source.data)}
