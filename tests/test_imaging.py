import io

import numpy as np
import pytest
from PIL import Image

from app.errors import BadImage, ImageTooLarge
from app.imaging import prepare
from app.imaging.decoding import Source, decode, decode_with_source
from app.imaging.geometry import Geometry, to_pixels
from app.imaging.quantization import InputQuantizer
from app.model_dir.schema import Convention, InputSpec

SPEC = InputSpec(width=32, height=32, channels=3, resize="center_crop", crop_fraction=1.0, mean=[127], std=[128])
BIG = 10**9


def encode(image: Image.Image, fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    image.save(buf, fmt, **kw)
    return buf.getvalue()


def test_real_jpeg_to_model_geometry(china_jpg):
    pixels = prepare(china_jpg.read_bytes(), SPEC, BIG)
    assert pixels.shape == (32, 32, 3) and pixels.dtype == np.uint8
    assert pixels.std() > 10  # a real photo, not a blank


@pytest.mark.parametrize("side, decoded", [(100, (160, 107)), (120, (320, 214)), (300, (640, 427))])
def test_jpeg_draft_decodes_at_reduced_size_but_never_below_the_crop(china_jpg, side, decoded):
    # 640x427: a 1/4 decode (107 rows) covers a 100 px crop, not a 120 px one; 300 needs all
    spec = SPEC.model_copy(update={"width": side, "height": side})
    assert decode(china_jpg.read_bytes(), spec, BIG).size == decoded


def test_exif_orientation_is_applied():
    # left half black, right half white; EXIF 6 says "rotate 90 degrees clockwise to view"
    image = Image.new("RGB", (64, 32), "white")
    image.paste((0, 0, 0), (0, 0, 32, 32))
    exif = Image.Exif()
    exif[0x0112] = 6
    data = encode(image, "JPEG", exif=exif, quality=95)
    upright = decode(data, SPEC, BIG)
    assert upright.size == (32, 64)
    pixels = np.asarray(upright)
    assert pixels[:28].mean() < 30 and pixels[36:].mean() > 225  # black on top after rotation


@pytest.mark.parametrize("mode", ["L", "P", "RGBA", "LA", "CMYK", "1", "I;16", "I", "F", "YCbCr"])
def test_every_mode_becomes_rgb_uint8(mode):
    image = Image.new("RGB", (40, 30), (200, 100, 50)).convert(mode)
    fmt = "TIFF" if mode in ("I;16", "I", "F", "CMYK", "YCbCr", "LA") else "PNG"
    pixels = prepare(encode(image, fmt), SPEC, BIG)
    assert pixels.shape == (32, 32, 3) and pixels.dtype == np.uint8


def test_sixteen_bit_grey_is_scaled_not_clipped():
    image = Image.fromarray(np.full((8, 8), 32896, np.uint16))  # 32896 = 128 * 257
    pixels = prepare(encode(image, "PNG"), SPEC, BIG)
    assert np.all(pixels == 128)


def test_transparency_is_composited_on_white():
    image = Image.new("RGBA", (8, 8), (0, 0, 0, 0))
    pixels = prepare(encode(image, "PNG"), SPEC, BIG)
    assert np.all(pixels == 255)


def test_center_crop_keeps_the_middle():
    # 3 vertical bands: red | green | blue, 30 px each; a square center crop sees green only
    array = np.zeros((30, 90, 3), np.uint8)
    array[:, :30, 0] = array[:, 30:60, 1] = array[:, 60:, 2] = 255
    pixels = to_pixels(Image.fromarray(array), SPEC)
    assert pixels[..., 1].min() > 200 and pixels[..., 0].max() < 50 and pixels[..., 2].max() < 50


def test_stretch_keeps_everything():
    array = np.zeros((30, 90, 3), np.uint8)
    array[:, :30, 0] = array[:, 30:60, 1] = array[:, 60:, 2] = 255
    pixels = to_pixels(Image.fromarray(array), SPEC.model_copy(update={"resize": "stretch"}))
    assert pixels[:, :5, 0].min() > 200 and pixels[:, -5:, 2].min() > 200


def test_one_channel_model_gets_grey(coffee_png):
    spec = SPEC.model_copy(update={"channels": 1, "mean": [0.0], "std": [1.0]})
    assert prepare(coffee_png.read_bytes(), spec, BIG).shape == (32, 32, 1)


@pytest.mark.parametrize("data", [b"", b"hello world", b"\x89PNG\r\n\x1a\n" + b"\0" * 20, b"%!PS-Adobe-3.0 EPSF-3.0\n"])
def test_not_an_image(data):
    with pytest.raises(BadImage):
        decode(data, SPEC, BIG)


def test_truncated_jpeg(china_jpg):
    data = china_jpg.read_bytes()
    with pytest.raises(BadImage, match="truncated|decode"):
        decode(data[: len(data) // 2], SPEC, BIG)


def test_decompression_bomb_refused_before_decoding():
    # 20000 x 20000 one-bit PNG: a few KB on the wire, 400 million pixels decoded
    data = encode(Image.new("1", (20000, 20000)), "PNG")
    assert len(data) < 100_000
    with pytest.raises(ImageTooLarge, match="400000000 pixels"):
        decode(data, SPEC, max_pixels=50_000_000)


def test_quantizer_identity_when_input_is_the_pixels():
    q = InputQuantizer(SPEC, np.uint8, 1 / 128, 127)
    assert q.is_identity
    pixels = np.arange(32 * 32 * 3, dtype=np.uint8).reshape(32, 32, 3)
    assert np.array_equal(q(pixels)[0], pixels)


def test_quantizer_general_case_rounds_half_away_from_zero():
    spec = SPEC.model_copy(update={"mean": [0.0], "std": [1.0]})
    q = InputQuantizer(spec, np.int8, 2.0, -128)
    # real = pixel; q = round(pixel / 2) - 128: 1 -> round(0.5) = 1 (half away from zero), 3 -> 2
    pixels = np.array([[[0, 1, 3], [255, 254, 5]]], np.uint8)
    assert q(pixels)[0].tolist() == [[[-128, -127, -126], [0, -1, -125]]]


def test_quantizer_for_float_models():
    q = InputQuantizer(SPEC, np.float32, 0.0, 0)
    out = q(np.array([[[127, 255, 0]]], np.uint8))
    assert out.dtype == np.float32 and out[0, 0, 0].tolist() == [0.0, 1.0, -127 / 128]


# -- damaged data and pixel budgets (issue 13) ---------------------------------------------------

def _corrupt_entropy_data(jpeg: bytes, seed: int = 0) -> bytes:
    """64 random bytes over the middle of the scan: what a bad sector or radio link does."""
    data = bytearray(jpeg)
    middle = len(data) // 2
    data[middle:middle + 64] = np.random.default_rng(seed).integers(0, 256, 64, dtype=np.uint8).tobytes()
    return bytes(data)


def _png_with_bad_idat_crc(image: Image.Image) -> bytes:
    data = bytearray(encode(image, "PNG"))
    idat = data.index(b"IDAT")
    crc_at = idat + 4 + int.from_bytes(data[idat - 4:idat], "big")
    data[crc_at] ^= 0xFF
    return bytes(data)


def _old_pillow_decode(data: bytes, spec: InputSpec) -> np.ndarray:
    """What decode() did before: Pillow's decoder with draft() (the converter calibrated on it)."""
    from app.imaging.geometry import draft_size
    image = Image.open(io.BytesIO(data))
    image.draft(image.mode, draft_size(*image.size, spec))
    return np.asarray(image.convert("RGB"))


@pytest.mark.parametrize("side", [32, 100, 224, 640])
@pytest.mark.parametrize("quality, subsampling", [(90, 0), (75, 2)])
def test_jpeg_pixels_are_pillows_byte_for_byte(cat_png, side, quality, subsampling):
    data = encode(Image.open(cat_png).convert("RGB"), "JPEG", quality=quality, subsampling=subsampling)
    spec = SPEC.model_copy(update={"width": side, "height": side})
    assert np.array_equal(np.asarray(decode(data, spec, BIG)), _old_pillow_decode(data, spec))


def test_corrupt_jpeg_entropy_data_is_refused_by_default(china_jpg):
    damaged = _corrupt_entropy_data(china_jpg.read_bytes())
    Image.open(io.BytesIO(damaged)).load()  # Pillow alone decodes it without a word
    with pytest.raises(BadImage, match="damaged image: Corrupt JPEG data.*ACCEPT_DAMAGED_IMAGES"):
        decode(damaged, SPEC, BIG)


def test_corrupt_jpeg_is_decoded_when_damage_is_accepted(china_jpg):
    damaged = _corrupt_entropy_data(china_jpg.read_bytes())
    image = decode(damaged, SPEC, BIG, accept_damaged=True)
    assert image.size == decode(china_jpg.read_bytes(), SPEC, BIG).size  # decoded like the intact file


@pytest.mark.parametrize("mode, options", [
    ("RGB", {"quality": 90, "subsampling": 0}), ("RGB", {"quality": 75, "subsampling": 2}),
    ("RGB", {"quality": 85, "progressive": True}), ("L", {"quality": 90}),
    ("RGB", {"quality": 90, "comment": b"a COM segment", "dpi": (300, 300)}),
])
@pytest.mark.parametrize("side", [32, 224])
def test_a_plain_jpeg_header_is_read_without_pillow_and_gives_the_same_pixels(cat_png, monkeypatch, mode, options,
                                                                             side):
    data = encode(Image.open(cat_png).convert(mode), "JPEG", **options)
    spec = SPEC.model_copy(update={"width": side, "height": side})
    through_pillow = _decode_forcing_pillow(data, spec, monkeypatch)

    def no_pillow_open(*args, **kwargs):
        raise AssertionError("Image.open called for a plain JPEG")
    with monkeypatch.context() as patch:
        patch.setattr("app.imaging.decoding.Image.open", no_pillow_open)
        plain = decode(data, spec, BIG)
    assert plain.mode == through_pillow.mode == "RGB" and plain.size == through_pillow.size
    assert np.array_equal(np.asarray(plain), np.asarray(through_pillow))


def _decode_forcing_pillow(data, spec, monkeypatch):
    with monkeypatch.context() as patch:
        patch.setattr("app.imaging.decoding._plain_jpeg_header", lambda data: None)
        return decode(data, spec, BIG)


@pytest.mark.parametrize("kind", ["exif", "icc", "cmyk", "truncated header", "not a jpeg"])
def test_anything_but_a_plain_jpeg_header_goes_through_pillow(cat_png, kind):
    from app.imaging.decoding import _plain_jpeg_header
    image = Image.open(cat_png).convert("RGB")
    exif = Image.Exif()
    exif[0x0112] = 1
    data = {"exif": lambda: encode(image, "JPEG", exif=exif),
            "icc": lambda: encode(image, "JPEG", icc_profile=b"\0" * 128),
            "cmyk": lambda: encode(image.convert("CMYK"), "JPEG"),
            "truncated header": lambda: encode(image, "JPEG")[:300],
            "not a jpeg": lambda: encode(image, "PNG")}[kind]()
    assert _plain_jpeg_header(data) is None


def test_a_plain_jpeg_over_the_pixel_limit_is_refused_before_decoding(cat_png):
    data = encode(Image.open(cat_png).convert("RGB"), "JPEG")
    width, height = Image.open(io.BytesIO(data)).size
    with pytest.raises(ImageTooLarge, match=f"image is {width}x{height} = {width * height} pixels"):
        decode(data, SPEC, width * height - 1)


def _mpo(china_jpg) -> bytes:
    """What a 3D camera or an Ultra HDR phone photo is: a JPEG followed by another image."""
    photo = Image.open(china_jpg)
    return encode(photo, "MPO", save_all=True, append_images=[photo.resize((64, 43))], quality=90)


def test_an_mpo_photo_is_decoded_as_the_jpeg_it_starts_with(china_jpg):
    data = _mpo(china_jpg)
    assert Image.open(io.BytesIO(data)).format == "MPO"
    spec = SPEC.model_copy(update={"width": 100, "height": 100})
    image = decode(data, spec, BIG, max_decoded_pixels=1000)  # at reduced size, not under the whole-image limit
    assert image.size == (160, 107)
    assert np.array_equal(np.asarray(image), _old_pillow_decode(data, spec))


def test_a_damaged_mpo_photo_is_refused(china_jpg):
    damaged = bytearray(_mpo(china_jpg))
    damaged[len(damaged) // 3:len(damaged) // 3 + 64] = np.random.default_rng(1).integers(0, 256, 64, np.uint8).tobytes()
    with pytest.raises(BadImage, match="damaged image"):
        decode(bytes(damaged), SPEC, BIG)


def _cmyk_jpeg(china_jpg) -> bytes:
    return encode(Image.open(china_jpg).convert("CMYK"), "JPEG", quality=90)


def test_a_damaged_cmyk_jpeg_is_refused_too(china_jpg):
    damaged = _corrupt_entropy_data(_cmyk_jpeg(china_jpg))
    assert Image.open(io.BytesIO(damaged)).mode == "CMYK"  # decoded by Pillow, which repairs in silence
    with pytest.raises(BadImage, match="damaged image: Corrupt JPEG data.*ACCEPT_DAMAGED_IMAGES"):
        decode(damaged, SPEC, BIG)
    assert decode(damaged, SPEC, BIG, accept_damaged=True).mode == "RGB"


def test_a_cmyk_jpeg_turbojpeg_cannot_classify_is_left_to_pillow():
    # cyan sampled 2x2, the rest 1x1: valid, decoded by Pillow; TurboJPEG cannot name its subsampling
    data = bytearray(encode(Image.new("CMYK", (56, 32), (127, 127, 127, 127)), "JPEG", quality=90))
    sof = data.index(b"\xff\xc0")
    data[sof + 5:sof + 9] = (64).to_bytes(2, "big") * 2
    data[sof + 11] = 0x22
    assert decode(bytes(data), SPEC, BIG).size == (32, 32)  # 64x64, drafted at 1/2 for the 32x32 model


def test_an_intact_cmyk_jpeg_has_pillows_pixels(china_jpg):
    data = _cmyk_jpeg(china_jpg)
    assert np.array_equal(np.asarray(decode(data, SPEC, BIG)), _old_pillow_decode(data, SPEC))


def test_png_with_a_bad_idat_checksum_is_refused_by_default(coffee_png):
    damaged = _png_with_bad_idat_crc(Image.open(coffee_png))
    with pytest.raises(BadImage, match="PNG chunk 'IDAT' .* fails its CRC"):
        decode(damaged, SPEC, BIG)
    assert decode(damaged, SPEC, BIG, accept_damaged=True).size == Image.open(coffee_png).size


def test_bytearray_bodies_decode_without_a_copy(china_jpg, coffee_png):
    for path in (china_jpg, coffee_png):
        assert np.array_equal(np.asarray(decode(bytearray(path.read_bytes()), SPEC, BIG)),
                              np.asarray(decode(path.read_bytes(), SPEC, BIG)))


def test_pixel_budget_applies_to_formats_decoded_whole():
    big = Image.new("RGB", (1000, 1000), (10, 20, 30))
    with pytest.raises(ImageTooLarge, match="PNG image of 1000x1000 .* the limit for formats other than JPEG"):
        decode(encode(big, "PNG"), SPEC, BIG, max_decoded_pixels=999_999)
    # a JPEG decodes at reduced size: the budget does not apply to it
    assert decode(encode(big, "JPEG"), SPEC, BIG, max_decoded_pixels=999_999).size == (125, 125)


# -- the makers' conventions (issue 45): Coral's letterbox, Ultralytics' ----------------------------------------------

CORAL_BOX = InputSpec(width=64, height=64, channels=3, resize="letterbox", mean=[0.0], std=[1.0])
ULTRALYTICS_BOX = CORAL_BOX.model_copy(update={
    "mean": [0.0], "std": [255.0], "convention": Convention(name="ultralytics", why="a test")})
# (width, height): odd and even paddings, a square, an image smaller than the input (scaled up), a sliver, and sizes
# whose scaled side rounds half to even (128 x 85 at 0.5: 42.5 -> 42) or up (100 x 61 at 0.64: 39.04 -> 39)
SIZES = [(100, 61), (61, 100), (128, 78), (128, 85), (64, 64), (30, 20), (200, 3), (641, 427)]


def noise(width: int, height: int, seed: int = 0) -> Image.Image:
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (height, width, 3), np.uint8))


def ultralytics_letterbox(image: Image.Image, side: int = 64) -> tuple[np.ndarray, float, int, int]:
    """Independent of app/imaging: Ultralytics' LetterBox(center=True) as its code reads, with Pillow's bilinear
    resize: the pixels, the ratio r, and where the image's top-left lands."""
    w, h = image.size
    r = min(side / h, side / w)
    nw, nh = round(w * r), round(h * r)              # Python's round, as int(round(...)) in LetterBox
    left, top = (side - nw) // 2, (side - nh) // 2   # the odd padding pixel goes right, or below
    canvas = np.full((side, side, 3), 114, np.uint8)
    canvas[top:top + nh, left:left + nw] = np.asarray(image.resize((nw, nh), Image.Resampling.BILINEAR))
    return canvas, r, left, top


@pytest.mark.parametrize("size", SIZES)
def test_ultralytics_letterbox_centres_the_image_on_grey_114(size):
    image = noise(*size)
    expected, _, left, top = ultralytics_letterbox(image)
    got = to_pixels(image, ULTRALYTICS_BOX)
    assert got.dtype == np.uint8 and got.shape == (64, 64, 3)
    assert np.array_equal(got, expected)
    assert (left, top) in ((0, 0), (0, (64 - round(size[1] * 64 / size[0])) // 2),
                           ((64 - round(size[0] * 64 / size[1])) // 2, 0))


@pytest.mark.parametrize("size", SIZES)
def test_coral_letterbox_stays_at_the_top_left_on_black(size):
    image = noise(*size)
    w, h = size
    scale = min(64 / w, 64 / h)
    nw, nh = min(64, max(1, round(w * scale))), min(64, max(1, round(h * scale)))
    expected = np.zeros((64, 64, 3), np.uint8)
    expected[:nh, :nw] = np.asarray(image.resize((nw, nh), Image.Resampling.BILINEAR, box=(0, 0, w, h)))
    assert np.array_equal(to_pixels(image, CORAL_BOX), expected)


@pytest.mark.parametrize("size", SIZES)
def test_ultralytics_boxes_come_back_as_scale_boxes_maps_them(size):
    """A point of the input, in its pixels x, goes back to (x - left) / r of the original (scale_boxes), also
    when a JPEG was decoded at reduced scale (the geometry is the original's)."""
    w, h = size
    _, r, left, top = ultralytics_letterbox(noise(w, h))
    x_in = np.array([0.0, left, left + 7.25, 64.0])
    y_in = np.array([0.0, top, top + 3.5, 64.0])
    for source, decoded in ((Source(w, h), (w, h)), (Source(w, h, 4), (-(-w // 4), -(-h // 4)))):
        geometry = Geometry.of(source, decoded, ULTRALYTICS_BOX)
        x, y = geometry.to_original(x_in / 64, y_in / 64)
        np.testing.assert_allclose(x, (x_in - left) / r, rtol=0, atol=1e-9)
        np.testing.assert_allclose(y, (y_in - top) / r, rtol=0, atol=1e-9)


def test_a_sliver_ultralytics_would_resize_to_nothing_keeps_one_row():
    pixels = to_pixels(noise(200, 1), ULTRALYTICS_BOX)   # 0.32 rows: cv2.resize refuses; one row, 31 above it
    assert np.all(pixels[:31] == 114) and np.all(pixels[32:] == 114) and not np.all(pixels[31] == 114)


def test_a_drawn_box_comes_back_where_it_was_drawn():
    """A white rectangle on black, letterboxed; its extent in the input, mapped back, is the rectangle (to within the
    half input pixel the resize blurs)."""
    array = np.zeros((78, 128, 3), np.uint8)
    array[20:50, 40:100] = 255
    pixels = to_pixels(Image.fromarray(array), ULTRALYTICS_BOX)
    rows, cols = np.nonzero(pixels[..., 0] > 128)
    geometry = Geometry.of(Source(128, 78), (128, 78), ULTRALYTICS_BOX)
    (x0, x1), (y0, y1) = geometry.to_original(np.array([cols.min(), cols.max() + 1]) / 64,
                                              np.array([rows.min(), rows.max() + 1]) / 64)
    assert [x0, y0, x1, y1] == pytest.approx([40, 20, 100, 50], abs=1.0)
    assert np.all(pixels[:12] == 114) and np.all(pixels[12 + 39:] == 114)   # 39 rows, 12 above and 13 below


def test_ultralytics_jpegs_are_decoded_whole_as_its_resize_needs(china_jpg):
    """Ultralytics' tools resize a full decode: so does this convention (a DCT reduction is not that resize's
    pixels), up to max_decoded_pixels; beyond it, the least reduction under it, the geometry still the original's."""
    data = china_jpg.read_bytes()                    # 640 x 427: Coral's convention decodes it at 1/8 for 64 x 64
    assert decode(data, CORAL_BOX, BIG).size == (80, 54)
    image, source = decode_with_source(data, ULTRALYTICS_BOX, BIG)
    assert source.scale == 1 and image.size == (640, 427)
    pixels = prepare(data, ULTRALYTICS_BOX, BIG)     # r = 0.1: 64 x 43 (42.7), 10 rows above, 11 below
    expected, _, left, top = ultralytics_letterbox(Image.open(io.BytesIO(data)).convert("RGB"))
    assert (left, top) == (0, 10) and np.array_equal(pixels, expected)
    image, source = decode_with_source(data, ULTRALYTICS_BOX, BIG, max_decoded_pixels=100_000)
    assert source.scale == 2 and image.size == (320, 214) and (source.width, source.height) == (640, 427)
    reduced = to_pixels(image, ULTRALYTICS_BOX, (source.width, source.height))
    assert np.all(reduced[:10] == 114) and np.all(reduced[53:] == 114) and not np.all(reduced[10] == 114)


def test_ultralytics_quantizes_as_its_autobackend_truncating_in_float32():
    """AutoBackend feeds an integer TFLite input (im / scale + zero_point).astype(dtype), im = pixels / 255 in
    float32: truncated toward zero, where TFLite's QUANTIZE (Coral's convention) rounds half away from zero."""
    pixels = np.arange(256, dtype=np.uint8).reshape(16, 16, 1).repeat(3, axis=2)
    im = pixels.astype(np.float32) / np.float32(255)
    for dtype, scale, zero_point in ((np.int8, 0.018658, -14), (np.int8, 1 / 255, -128), (np.uint8, 1 / 255, 0)):
        scale = float(np.float32(scale))               # as the interpreter reports it
        expected = (im / np.float32(scale) + np.float32(zero_point)).astype(dtype)
        got = InputQuantizer(ULTRALYTICS_BOX, dtype, scale, zero_point)(pixels)[0]
        assert got.dtype == dtype and np.array_equal(got, expected), (dtype, scale, zero_point)
    truncated = InputQuantizer(ULTRALYTICS_BOX, np.int8, 0.018658, -14)(pixels)[0]
    rounded = InputQuantizer(CORAL_BOX.model_copy(update={"std": [255.0]}), np.int8, 0.018658, -14)(pixels)[0]
    assert truncated[3, 14, 0] == 0 and rounded[3, 14, 0] == -1       # pixel 62: 62 / 255 / 0.018658 - 14 = -0.97
    assert truncated[6, 4, 0] == 7 and rounded[6, 4, 0] == 7           # pixel 100: 7.02


def test_the_letterbox_bench_runs_and_prints_its_table():
    """bench/letterbox_cost.py on one small photo, in its own process (it pins BLAS to one thread): its row has both
    conventions' figures and their ratio (no timing is asserted)."""
    import subprocess
    import sys
    from pathlib import Path

    bench = Path(__file__).resolve().parents[1] / "bench" / "letterbox_cost.py"
    done = subprocess.run([sys.executable, str(bench), "-n", "2", "--rounds", "1", "--sizes", "320x200"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "640x640 int8 input" in lines[0] and lines[1].split() == ["photo", "coral", "ultralytics", "ratio"]
    row = lines[2].split()
    assert row[0] == "320x200" and all(float(value) > 0 for value in row[1:])
