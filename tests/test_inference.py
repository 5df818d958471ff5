import numpy as np

from hypothesis import given, settings
from hypothesis import strategies as st

from app.core import image_threads
from app.tasks.classify import scores, top_order, top_predictions
from app.model_dir.reading import read_model_dir
from tests.conftest import DEFAULT_MODEL, MODELS

LABELS = ("a", "b", "c", "d")


def test_top_k_orders_by_score_then_class_index():
    values = np.array([0.1, 0.4, 0.4, 0.1])
    got = top_predictions(values, LABELS, 3, 0.0)
    assert [(p.index, p.label) for p in got] == [(1, "b"), (2, "c"), (0, "a")]


def test_threshold_and_k_larger_than_classes():
    values = np.array([0.1, 0.6, 0.3, 0.0])
    got = top_predictions(values, LABELS, 10, 0.25)
    assert [p.index for p in got] == [1, 2]


def test_missing_labels_fall_back_to_the_index():
    got = top_predictions(np.array([0.0, 1.0]), ("only",), 2, 0.0)
    assert [p.label for p in got] == ["1", "only"]


def test_scores_dequantize_then_softmax():
    model_dir = read_model_dir(MODELS / DEFAULT_MODEL)
    out = np.array([[72, 82, 72]], np.uint8)  # zero point 72: logits 0, 10*scale, 0
    s = scores(out, 0.5, 72, model_dir)
    e = np.exp(5.0)
    assert np.allclose(s, [1 / (e + 2), e / (e + 2), 1 / (e + 2)])
    assert abs(s.sum() - 1) < 1e-12


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from([0.0, -0.0, 0.1, 0.25, 0.5, 1e-300, 1.0, np.inf, -np.inf, np.nan]), min_size=1,
                max_size=40),
       st.integers(1, 45))
def test_top_order_is_the_head_of_a_stable_descending_sort(values, k):
    values = np.array(values)
    assert top_order(values, k).tolist() == np.argsort(-values, kind="stable")[:k].tolist()


def test_top_order_on_a_real_output_with_ties():
    model_dir = read_model_dir(MODELS / DEFAULT_MODEL)
    out = np.random.default_rng(7).integers(0, 40, (1, 1000), np.uint8)  # 40 levels: ties everywhere
    values = scores(out, 0.1, 20, model_dir)
    for k in (1, 5, 37, 999, 1000):
        assert top_order(values, k).tolist() == np.argsort(-values, kind="stable")[:k].tolist()


def test_image_threads_take_the_cores_the_interpreters_leave():
    assert image_threads(None, host_cpu=True, cores=4) == 2
    assert image_threads(None, host_cpu=True, cores=1) == 1
    assert image_threads(None, host_cpu=False, cores=4) == 4  # a TPU leaves every core free
    assert image_threads(3, host_cpu=False, cores=4) == 3     # a setting wins


def test_the_registry_says_whether_an_interpreter_computes_on_the_host():
    from app.engines import BACKENDS
    from app.engines.cpu import CpuBackend
    from app.registry import Registry
    from app.settings import Settings

    class DeviceBackendDouble(CpuBackend):
        key = "device-double"
        host_cpu = False

    plugins = {**BACKENDS, DeviceBackendDouble.key: DeviceBackendDouble}
    assert Registry(Settings(model_dir=MODELS, backends=["cpu"]), plugins).host_cpu
    assert not Registry(Settings(model_dir=MODELS, backends=["device-double"]), plugins).host_cpu
    assert Registry(Settings(model_dir=MODELS, backends=["device-double", "emulated"]), plugins).host_cpu
