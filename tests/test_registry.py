import pytest

from app.errors import BackendNotAvailable, ModelDirError, ModelNotFound, NotReady, ServeError
from app.registry import Registry
from app.settings import Settings
from tests.conftest import DEFAULT_MODEL, MODELS


def registry_for(model_dir, **kw) -> Registry:
    registry = Registry(Settings(model_dir=model_dir, workers=2, **kw))
    registry.configure()
    return registry


def test_load_warms_every_interpreter(models_copy):
    registry = registry_for(models_copy)
    with pytest.raises(NotReady, match="loading"):
        registry.get(DEFAULT_MODEL)
    assert not registry.ready()
    registry.load_all()
    assert registry.ready()
    pool = registry.get(DEFAULT_MODEL).pool("cpu")
    assert len(pool.members) == 2 and pool.members.warm and pool.members.first_inference_ms > 0
    with pytest.raises(BackendNotAvailable, match="emulated"):
        registry.get(DEFAULT_MODEL).pool("emulated")


def test_reload_is_cold_and_swaps_whole_models(models_copy):
    registry = registry_for(models_copy)
    registry.load_all()
    before = registry.get(DEFAULT_MODEL)
    after = registry.reload(DEFAULT_MODEL)
    assert after is registry.get(DEFAULT_MODEL) and after is not before
    assert not after.pool("cpu").members.warm and after.pool("cpu").members.first_inference_ms is None


def test_corrupted_file_fails_the_load_and_a_reload_keeps_the_old_model(models_copy):
    registry = registry_for(models_copy)
    registry.load_all()
    serving = registry.get(DEFAULT_MODEL)
    tflite = models_copy / DEFAULT_MODEL / f"{DEFAULT_MODEL}_int8.tflite"
    tflite.write_bytes(tflite.read_bytes()[:1000])
    with pytest.raises(ModelDirError, match="sha256"):
        registry.reload(DEFAULT_MODEL)
    assert registry.get(DEFAULT_MODEL) is serving

    fresh = registry_for(models_copy)
    fresh.load_all()
    assert not fresh.ready()
    assert fresh.status(DEFAULT_MODEL).state == "failed" and "sha256" in fresh.status(DEFAULT_MODEL).error


def test_configuration_errors_are_found_before_loading(tmp_path, models_copy):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ModelDirError, match="no model directories"):
        registry_for(empty)
    with pytest.raises(ModelDirError, match="not found"):
        registry_for(models_copy, models=["resnet"])
    with pytest.raises(ServeError, match="unknown backend 'gpu'"):
        Registry(Settings(model_dir=models_copy, backends=["gpu"]))
    with pytest.raises(ModelNotFound):
        registry_for(models_copy).get("resnet")


def test_settings_lists_from_environment(monkeypatch):
    monkeypatch.setenv("EDGETPU_SERVE_BACKENDS", "cpu, emulated")
    monkeypatch.setenv("EDGETPU_SERVE_MODELS", "a,b")
    settings = Settings()
    assert settings.backends == ["cpu", "emulated"] and settings.models == ["a", "b"]


def test_the_limits_of_the_settings_reach_the_pools_and_the_close():
    registry = registry_for(MODELS, models=[DEFAULT_MODEL], warmup_at_start=False, overload_hold_s=7.5,
                            close_timeout_s=0.5)
    registry.load_all()
    try:
        assert registry.get(DEFAULT_MODEL).pool("cpu").line.hold_s == 7.5
    finally:
        registry.close()
