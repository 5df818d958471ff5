"""The model of /v1/classify when EDGETPU_SERVE_DEFAULT_MODEL is unset: the committed default when it is served,
else the only classification model served; several others, or a default that is not served, stop the start with what to set.
Detection has its own (EDGETPU_SERVE_DEFAULT_DETECTION_MODEL, for /v1/detect and /v1/vision/detection), settled the
same way among the detection models."""

import httpx
import pytest

from app.errors import ServeError
from app.registry import Registry
from app.settings import DETECTION_DEFAULT, Settings, default_model_for
from tests.conftest import MODELS, Service


def test_unset_the_committed_default_then_the_only_model_served():
    both = ["efficientnet_lite0", "fashion_mnist"]
    assert default_model_for(None, both, both) == "efficientnet_lite0"
    assert default_model_for(None, ["flowers"], ["flowers"]) == "flowers"
    assert default_model_for("fashion_mnist", both, both) == "fashion_mnist"


def test_only_classifiers_are_defaults_when_unset():
    assert default_model_for(None, ["people", "flowers"], ["flowers"]) == "flowers"
    assert default_model_for(None, ["people"], []) is None  # nothing for /v1/classify to default to


def test_several_models_without_the_committed_default_need_the_setting():
    with pytest.raises(ValueError, match="EDGETPU_SERVE_DEFAULT_MODEL is unset and several classification models are served "
                                         r"\(birds, flowers\).*Fix: set EDGETPU_SERVE_DEFAULT_MODEL"):
        default_model_for(None, ["birds", "flowers"], ["birds", "flowers"])


def test_a_default_that_is_not_served_is_refused():
    with pytest.raises(ValueError, match="EDGETPU_SERVE_DEFAULT_MODEL=efficientnet_lite0 is not served "
                                         r"\(serving flowers\)"):
        default_model_for("efficientnet_lite0", ["flowers"], ["flowers"])


def test_the_registry_settles_it_at_configure():
    registry = Registry(Settings(model_dir=MODELS, models=["fashion_mnist"], workers=1))
    registry.configure()
    assert registry.default_for("classification") == "fashion_mnist"
    two = Registry(Settings(model_dir=MODELS, models=["fashion_mnist", "mobilenet_v2"], workers=1))
    with pytest.raises(ServeError, match="several classification models are served"):
        two.configure()


def test_the_docs_run_line_serves_its_one_model_on_v1_classify(cat_png):
    """`-e EDGETPU_SERVE_MODELS=flowers` alone, as the docs' docker run lines have it: /v1/classify uses it."""
    service = Service({"EDGETPU_SERVE_MODELS": "fashion_mnist", "EDGETPU_SERVE_WORKERS": "1"})
    try:
        service.wait_ready()
        with httpx.Client(base_url=service.url, timeout=30) as client:
            answer = client.post("/v1/classify", files={"image": cat_png.read_bytes()})
            listing = client.get("/v1/models").json()
    finally:
        service.stop()
    assert answer.status_code == 200 and answer.json()["model"] == "fashion_mnist"
    assert listing["default_model"] == "fashion_mnist"


def test_an_ambiguous_default_stops_the_start_with_the_fix():
    service = Service({"EDGETPU_SERVE_MODELS": "fashion_mnist,mobilenet_v2"})
    assert service.process.wait(60) == 2
    assert "cannot start: EDGETPU_SERVE_DEFAULT_MODEL is unset" in service.output()


def test_detection_has_its_own_default_settled_the_same_way():
    served = ["efficientnet_lite0", "ssdlite_mobilenet_v2_person", "coco"]
    detectors = ["ssdlite_mobilenet_v2_person", "coco"]
    assert default_model_for(None, served, detectors, DETECTION_DEFAULT) == "ssdlite_mobilenet_v2_person"
    assert default_model_for(None, ["flowers", "coco"], ["coco"], DETECTION_DEFAULT) == "coco"
    assert default_model_for(None, ["flowers"], [], DETECTION_DEFAULT) is None
    assert default_model_for("coco", served, detectors, DETECTION_DEFAULT) == "coco"
    with pytest.raises(ValueError, match=r"EDGETPU_SERVE_DEFAULT_DETECTION_MODEL is unset and several detection models "
                                         r"are served \(coco, birds\): which one answers /v1/detect and "
                                         r"/v1/vision/detection\?"):
        default_model_for(None, ["coco", "birds"], ["coco", "birds"], DETECTION_DEFAULT)


def test_a_default_of_another_task_is_refused_saying_which_setting_is_its():
    with pytest.raises(ValueError, match=r"EDGETPU_SERVE_DEFAULT_DETECTION_MODEL=flowers is not a detection model.*"
                                         r"set EDGETPU_SERVE_DEFAULT_DETECTION_MODEL to one of \['coco'\].*"
                                         r"\(EDGETPU_SERVE_DEFAULT_MODEL\)"):
        default_model_for("flowers", ["flowers", "coco"], ["coco"], DETECTION_DEFAULT, others=["flowers"])
    with pytest.raises(ValueError, match=r"EDGETPU_SERVE_DEFAULT_MODEL=coco is not a classification model"):
        default_model_for("coco", ["flowers", "coco"], ["flowers"], others=["coco"])


def test_the_committed_models_serve_a_classifier_and_the_person_detector_by_default():
    registry = Registry(Settings(model_dir=MODELS, workers=1))
    registry.configure()
    assert registry.default_for("classification") == "efficientnet_lite0"
    assert registry.default_for("detection") == "ssdlite_mobilenet_v2_person"
    only = Registry(Settings(model_dir=MODELS, models=["fashion_mnist"], workers=1))
    only.configure()
    assert only.default_for("detection") is None  # /v1/detect then says no detection model is served


def test_a_default_model_with_no_classifier_served_says_that_none_is():
    """Only detectors served and DEFAULT_MODEL set: the start stops saying no classification model is served,
    so the setting cannot apply, and what is served (not "set it to one of none served")."""
    detector = "ssdlite_mobilenet_v2_person"
    for chosen, why in ((detector, f"EDGETPU_SERVE_DEFAULT_MODEL={detector} is not a classification model, and no "
                                   f"classification model is served (serving {detector}), so "
                                   "EDGETPU_SERVE_DEFAULT_MODEL, the model of /v1/classify, cannot apply. Fix: unset "
                                   "EDGETPU_SERVE_DEFAULT_MODEL, or serve a classification model too"),
                        ("efficientnet_lite0", f"EDGETPU_SERVE_DEFAULT_MODEL=efficientnet_lite0 is not served (serving "
                                               f"{detector}). Fix: unset EDGETPU_SERVE_DEFAULT_MODEL (no classification "
                                               "model is served)")):
        registry = Registry(Settings(model_dir=MODELS, models=[detector], default_model=chosen, workers=1))
        with pytest.raises(ServeError) as refused:
            registry.configure()
        assert str(refused.value).startswith(why) and "none served" not in str(refused.value)


def test_settings_are_frozen_and_the_registry_keeps_the_defaults_it_chose():
    settings = Settings(model_dir=MODELS, workers=1)
    with pytest.raises(ValueError, match="frozen"):
        settings.default_model = "fashion_mnist"
    registry = Registry(settings)
    registry.configure()
    assert settings.default_model is None and settings.default_detection_model is None  # as given: unset
    assert registry.defaults.of("classification") == registry.default_for("classification") == "efficientnet_lite0"
