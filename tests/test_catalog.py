"""app/core/catalog.py: one description of a model, built in one place, shown everywhere. A model's story says each
fact once, whatever wrote its model.json (a recipe, `converter import` told nothing or told more, a Frigate upload);
the convention in force is said, never null; /v1/models and OIP v2's metadata are the core's description."""

from __future__ import annotations

import shutil
from pathlib import Path

from fastapi.testclient import TestClient

from app.core.catalog import CORAL_BY_DEFAULT, effective_input, story
from app.frontdoors.uploads import PROVENANCE, ROUTE
from app.importing import graph_facts, handed_over, read_tflite_source
from app.model_dir.reading import read_model_dir
from app.service import Service
from app.settings import Settings
from converter.importer import ImportOptions, import_model
from tests.classifier_models import tiny_classifier
from tests.conftest import DEFAULT_MODEL, MODELS
from tests.detection_models import tiny_detector

SHOWN = " · "


def imported(tmp_path, **options):
    source = tmp_path / "given.tflite"
    source.write_bytes(tiny_classifier(style="tf1", classes=4))
    done = import_model([source], ImportOptions(name="m", out=tmp_path / "models", **options))
    return read_model_dir(done.path)


def test_a_built_model_says_what_it_is_where_it_came_from_its_source_and_licence():
    manifest = read_model_dir(MODELS / DEFAULT_MODEL).manifest
    assert story(manifest) == SHOWN.join([manifest.description, "built here", f"source: {manifest.source}",
                                          f"licence: {manifest.licence}"])


def test_an_import_told_nothing_names_its_file_once(tmp_path):
    """`converter import` writes "imported from given.tflite" and "imported: given.tflite (sha256 ...)": one fact."""
    manifest = imported(tmp_path).manifest
    assert manifest.description == "imported from given.tflite" and manifest.source.startswith("imported: given")
    line = story(manifest)
    assert line.count("given.tflite") == 1 and line.count(manifest.imported.files[0].sha256[:12]) == 1, line
    assert line == SHOWN.join([manifest.source, f"licence: {manifest.licence}"])


def test_an_import_told_its_description_and_source_says_both_and_its_file_once(tmp_path):
    manifest = imported(tmp_path, description="Birds of Europe", source="https://example.org/birds/given.tflite",
                        licence="MIT").manifest
    sha = manifest.imported.files[0].sha256[:12]
    assert story(manifest) == SHOWN.join(["Birds of Europe", f"imported from given.tflite (sha256 {sha})",
                                          "source: https://example.org/birds/given.tflite", "licence: MIT"])


def test_a_frigate_upload_names_its_file_once():
    data = tiny_detector(16)
    source = read_tflite_source(Path("person.tflite"), data)
    manifest, _ = handed_over("person", source, graph_facts(source), PROVENANCE, ROUTE, notes=[])
    line = story(manifest)
    assert line.count("person.tflite") == 1, line
    assert line.startswith(f"{PROVENANCE}: person.tflite (sha256 {source.sha256[:12]})"), line


def test_the_convention_in_force_is_said_never_null():
    manifest = read_model_dir(MODELS / DEFAULT_MODEL).manifest
    assert manifest.input.convention is None
    assert effective_input(manifest)["convention"] == CORAL_BY_DEFAULT.model_dump() == {
        "name": "coral", "why": CORAL_BY_DEFAULT.why}
    told = manifest.model_copy(update={"input": manifest.input.model_copy(
        update={"convention": CORAL_BY_DEFAULT.model_copy(update={"name": "ultralytics", "why": "--convention"})})})
    assert effective_input(told)["convention"] == {"name": "ultralytics", "why": "--convention"}


def test_v1_models_and_v2_metadata_show_the_cores_one_description(tmp_path):
    shutil.copytree(imported(tmp_path).path, tmp_path / "served" / "m")
    service = Service(Settings(model_dir=tmp_path / "served", backends=["cpu"], workers=1))
    with TestClient(service.http_app()) as client:
        assert service.registry.wait_loaded(60)
        described = service.core.describe("m")
        listed = client.get("/v1/models").json()["models"][0]
        assert listed == client.get("/v1/models/m").json() == described.model_dump(mode="json")
        assert listed["about"] == story(service.registry.get("m").model_dir.manifest)
        assert listed["input"]["convention"]["name"] == "coral" and listed["backend"] == "cpu"
        meta = client.get("/v2/models/m").json()
        backend = described.backends["cpu"]
        assert meta["inputs"] == [{"name": "image", "datatype": backend.input.dtype.upper(),
                                   "shape": [-1, *backend.input.shape[1:]]}]
        assert [out["name"] for out in meta["outputs"]] == [out.name for out in backend.outputs]
