"""The embedding task (app/tasks/embed.py) and its door (/v1/embed): the vector dequantized as TFLite's DEQUANTIZE,
L2-normalized, the zero vector kept zero; what an embedding output must be; and over a real socket, a 112 high by
96 wide input made from a photo of another shape exactly as model.json's resize says (stretch, center crop,
letterbox), the embedding then the model's own for that input to the last bit."""

from __future__ import annotations

import io
import re

import httpx
import numpy as np
import pytest
from ai_edge_litert.interpreter import Interpreter
from PIL import Image

from app.engines import TensorSpec
from app.errors import ModelDirError, ServeError
from app.model_dir.reading import ModelDir
from app.model_dir.schema import Manifest
from app.settings import Settings
from app.tasks import TASKS
from app.tasks.base import OutputRoles
from app.tasks.embed import TASK, embedding_of
from converter.importer import ImportOptions, import_model
from tests.face_models import tiny_face_embedder
from tests.test_tasks import served

def spec(dtype, scale=0.0, zero_point=0, shape=(1, 64)) -> TensorSpec:
    return TensorSpec("embedding", tuple(shape), np.dtype(dtype), scale, zero_point)


def test_the_vector_is_dequantized_as_tflite_does_and_normalized():
    q = np.arange(-64, 64, dtype=np.int8).reshape(1, 128)
    result = embedding_of(q, spec(np.int8, 0.0371, -3, (1, 128)))
    real = (np.float32(0.0371) * (q.astype(np.int32) + 3).astype(np.float32)).astype(np.float64).ravel()
    assert result.embedding.dtype == np.float32 and result.dimension == 128
    assert result.embedding.tobytes() == (real / np.sqrt(real @ real)).astype(np.float32).tobytes()
    assert result.norm == pytest.approx(float(np.sqrt(real @ real)), rel=1e-15)
    floats = embedding_of(np.full((1, 1, 1, 64), 3.0, np.float32), spec(np.float32, shape=(1, 1, 1, 64)))
    np.testing.assert_array_equal(floats.embedding, np.full(64, 0.125, np.float32))
    assert floats.norm == 24.0


def test_a_zero_vector_stays_zero_with_norm_zero_and_nan_is_the_models_fault():
    zero = embedding_of(np.full((1, 64), 128, np.uint8), spec(np.uint8, 0.02, 128))
    assert zero.norm == 0.0 and not zero.embedding.any() and zero.embedding.dtype == np.float32
    with pytest.raises(ServeError, match="holds NaN or infinite values") as caught:
        embedding_of(np.full((1, 64), np.nan, np.float32), spec(np.float32))
    assert caught.value.status == 500


def _model_dir() -> ModelDir:
    manifest = Manifest.model_validate({"name": "e", "task": "embedding", "source": "test", "licence": "MIT",
                                        "input": {"width": 96, "height": 112, "mean": [128], "std": [128]}})
    return ModelDir(manifest=manifest, path=None, labels=())


@pytest.mark.parametrize(("bad", "why"), [
    (spec(np.int8, 0.1, 0, (1, 31)), "int8 [1, 31]"),
    (spec(np.int8, 0.1, 0, (1, 2, 64)), "int8 [1, 2, 64]"),
    (spec(np.int32, 0.1, 0, (1, 64)), "int32 [1, 64]"),
    (spec(np.int8, 0.0, 0, (1, 64)), "int8 [1, 64]"),
])
def test_an_output_that_is_no_embedding_is_refused_at_load(bad, why):
    with pytest.raises(ModelDirError, match=re.escape(f"its embedding output 'embedding' is {why};")):
        TASK.bind(_model_dir(), [bad])


def test_its_named_outputs_are_the_unit_vector_and_the_raw_tensor():
    roles = TASK.bind(_model_dir(), [spec(np.uint8, 0.02, 128, (1, 128))])
    assert [(n.name, n.dtype, n.shape) for n in roles.named] == [("embedding", np.dtype(np.float32), (128,)),
                                                                 ("raw", np.dtype(np.uint8), (128,))]
    assert isinstance(roles, OutputRoles) and TASKS["embedding"] is TASK


# ---- over a real socket ---------------------------------------------------------------------------------------

def photo(width: int, height: int) -> Image.Image:
    """A smooth picture with detail everywhere (a crop or a pad shows)."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float64)
    pixels = np.stack([127 + 120 * np.sin(x / 7 + y / 23), 127 + 120 * np.cos(y / 5), (x * 3 + y * 2) % 256], -1)
    return Image.fromarray(pixels.round().astype(np.uint8))


def by_definition(image: Image.Image, resize: str) -> np.ndarray:
    """The 96x112 input as docs/models.md defines each resize, computed here: stretch the whole image; center crop
    the largest 96:112 region, 0.875 of it, around the centre; letterbox the whole image scaled to fit, at the
    top-left on black."""
    w, h = image.size
    if resize == "stretch":
        out = image.resize((96, 112), Image.Resampling.BILINEAR, box=(0, 0, w, h))
    elif resize == "center_crop":
        crop_h = min(h, w * 112 / 96) * 0.875
        crop_w = crop_h * 96 / 112
        left, top = (w - crop_w) / 2, (h - crop_h) / 2
        out = image.resize((96, 112), Image.Resampling.BILINEAR, box=(left, top, left + crop_w, top + crop_h))
    else:
        scale = min(96 / w, 112 / h)
        size = (min(96, round(w * scale)), min(112, round(h * scale)))
        canvas = Image.new("RGB", (96, 112))
        canvas.paste(image.resize(size, Image.Resampling.BILINEAR), (0, 0))
        out = canvas
    return np.asarray(out, np.uint8)[None]


def test_a_non_square_input_is_made_exactly_as_model_json_says(tmp_path):
    models = tmp_path / "models"
    source = tmp_path / "mobilefacenet.tflite"
    source.write_bytes(tiny_face_embedder())
    for resize in ("stretch", "center_crop", "letterbox"):
        import_model([source], ImportOptions(name=resize, out=models, task="embedding", resize=resize))
    interpreter = Interpreter(model_content=tiny_face_embedder())  # XNNPACK, as the cpu backend runs it
    interpreter.allocate_tensors()
    (inp,), (out,) = interpreter.get_input_details(), interpreter.get_output_details()
    settings = Settings(model_dir=models, backends=["cpu"], workers=1)
    with served(settings) as (_, url), httpx.Client(base_url=url, timeout=60) as client:
        for width, height in ((200, 150), (90, 300), (96, 112)):
            image = photo(width, height)
            data = io.BytesIO()
            image.save(data, "PNG")
            for resize in ("stretch", "center_crop", "letterbox"):
                interpreter.set_tensor(inp["index"], by_definition(image, resize))
                interpreter.invoke()
                expected = embedding_of(interpreter.get_tensor(out["index"]), TensorSpec.from_detail(out))
                r = client.post(f"/v1/models/{resize}/embed", files={"image": data.getvalue()})
                assert r.status_code == 200, r.text
                got = np.asarray(r.json()["embedding"], np.float32)
                assert got.tobytes() == expected.embedding.tobytes(), (resize, width, height)


def test_v1_embed_goes_to_the_only_embedder_and_refuses_what_is_not_an_image(tmp_path):
    models = tmp_path / "models"
    source = tmp_path / "mobilefacenet.tflite"
    source.write_bytes(tiny_face_embedder("int8", "last"))
    import_model([source], ImportOptions(name="mfn", out=models, task="embedding"))
    with served(Settings(model_dir=models, backends=["cpu"], workers=1)) as (_, url), \
            httpx.Client(base_url=url, timeout=60) as client:
        image = io.BytesIO()
        photo(96, 112).save(image, "PNG")
        r = client.post("/v1/embed", files={"image": image.getvalue()})
        assert r.status_code == 200, r.text
        body = r.json()
        assert list(body) == ["model", "backend", "embedding", "dimension", "norm", "timing_ms", "warmup", "cold"]
        assert body["model"] == "mfn" and body["dimension"] == len(body["embedding"]) == 128
        r = client.post("/v1/embed", content=b"not an image", headers={"content-type": "image/png"})
        assert r.status_code == 400 and "error" in r.json()
        r = client.post("/v1/models/nobody/embed", files={"image": image.getvalue()})
        assert r.status_code == 404 and "error" in r.json()
        assert "/v1/embed" in client.get("/openapi.json").json()["paths"]
