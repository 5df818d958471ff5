"""Image bytes -> the pixels a model expects. The converter calibrates through these same functions.

decode():   bytes -> upright RGB (or L) Pillow image, refusing bombs and non-images;
            JPEGs are scaled down in the DCT domain when the model needs far fewer pixels.
to_pixels(): geometry from model.json (center crop or stretch) -> uint8 HxWxC array.
InputQuantizer: uint8 pixels -> the input tensor, through the normalisation in model.json
            and the input tensor's own scale and zero point.
"""

from __future__ import annotations

import io
import math
import warnings

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from app.errors import BadImage, ImageTooLarge
from app.model_dir import InputSpec

# Formats decoded by Pillow's own code. Others (EPS runs Ghostscript, ...) are refused.
DECODABLE_FORMATS = ("JPEG", "PNG", "WEBP", "GIF", "BMP", "TIFF")
RESAMPLE = Image.Resampling.BILINEAR
# Pillow frees every image's pixel memory by default, so each request pays fresh pages for
# its decoded and resized images (about 1 ms of a 640x427 JPEG's 5 ms here). Keeping a few
# freed blocks for reuse removes that; bounded: at most this many blocks of this size.
REUSED_BLOCKS = 16
BLOCK_BYTES = 4 * 1024 * 1024


def reuse_image_buffers(blocks: int = REUSED_BLOCKS, block_bytes: int = BLOCK_BYTES) -> None:
    """Let Pillow keep up to `blocks` freed pixel blocks for the next images (process-wide)."""
    Image.core.set_block_size(block_bytes)
    Image.core.set_blocks_max(blocks)


def decode(data: bytes, spec: InputSpec, max_pixels: int) -> Image.Image:
    """Decode, check size, orient by EXIF, and convert to RGB (or L for 1-channel models)."""
    if not data:
        raise BadImage("empty image")
    try:
        with warnings.catch_warnings():
            # Pillow's own bomb check warns or raises by its global limit; ours is per call.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data), formats=DECODABLE_FORMATS)
    except UnidentifiedImageError:
        raise BadImage(
            f"not an image in a supported format ({', '.join(DECODABLE_FORMATS)})"
        ) from None
    except Image.DecompressionBombError as e:
        raise ImageTooLarge(str(e)) from None
    except (OSError, ValueError, SyntaxError) as e:
        raise BadImage(f"cannot read image header: {e}") from None
    width, height = image.size
    if width * height > max_pixels:
        raise ImageTooLarge(
            f"image is {width}x{height} = {width * height} pixels; the limit is {max_pixels}"
        )
    if width == 0 or height == 0:
        raise BadImage(f"image has no pixels ({width}x{height})")
    if image.format == "JPEG":
        # DCT-domain downscaling: decodes at 1/2, 1/4 or 1/8 size while staying >= what
        # the crop needs, so the later resize still has at least the model's resolution.
        image.draft(image.mode, _draft_size(width, height, spec))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            image.load()
            # in place: without an orientation tag the copying form copies every pixel for nothing
            ImageOps.exif_transpose(image, in_place=True)
    except Image.DecompressionBombError as e:
        raise ImageTooLarge(str(e)) from None
    except (OSError, ValueError, SyntaxError, EOFError) as e:
        raise BadImage(f"cannot decode image: {e}") from None
    return _to_mode(image, "L" if spec.channels == 1 else "RGB")


def _draft_size(width: int, height: int, spec: InputSpec) -> tuple[int, int]:
    """The smallest full-image size whose crop still covers the model's input."""
    if spec.resize == "stretch":
        scale = max(spec.width / width, spec.height / height)
    else:
        crop_w, crop_h = _crop_size(width, height, spec)
        scale = max(spec.width / crop_w, spec.height / crop_h)
    return math.ceil(width * scale), math.ceil(height * scale)


def _to_mode(image: Image.Image, mode: str) -> Image.Image:
    """Any Pillow mode to RGB or L: alpha composited on white, 16/32-bit scaled, CMYK converted."""
    if image.mode == mode:
        return image
    if image.mode in ("I;16", "I;16L", "I;16B", "I;16N", "I", "F"):
        image = _high_bit_depth_to_l(image)
    if image.mode == "P":
        image = image.convert("RGBA" if "transparency" in image.info else "RGB")
    if image.mode in ("RGBA", "LA", "PA", "RGBa", "La"):
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        image = Image.alpha_composite(background, rgba)
    return image.convert(mode)


def _high_bit_depth_to_l(image: Image.Image) -> Image.Image:
    """16-bit (and 32-bit int) grey scales to 8 bits by value / 257; float is clipped to 0..255."""
    values = np.asarray(image)
    if image.mode == "F":
        eight = np.clip(np.rint(values), 0, 255)
    else:
        eight = np.clip(np.rint(values.astype(np.float64) / 257.0), 0, 255)
    return Image.fromarray(eight.astype(np.uint8), mode="L")


def _crop_size(width: int, height: int, spec: InputSpec) -> tuple[float, float]:
    """Largest region with the model's aspect ratio, scaled by crop_fraction."""
    aspect = spec.width / spec.height
    if width / height > aspect:
        crop_h = height * spec.crop_fraction
        crop_w = crop_h * aspect
    else:
        crop_w = width * spec.crop_fraction
        crop_h = crop_w / aspect
    return crop_w, crop_h


def to_pixels(image: Image.Image, spec: InputSpec) -> np.ndarray:
    """Crop/resize to the model's geometry in one resampling pass; uint8 HxWxC."""
    width, height = image.size
    if spec.resize == "stretch":
        box = (0.0, 0.0, float(width), float(height))
    else:
        crop_w, crop_h = _crop_size(width, height, spec)
        left, top = (width - crop_w) / 2, (height - crop_h) / 2
        box = (left, top, left + crop_w, top + crop_h)
    if image.size == (spec.width, spec.height) and box == (0.0, 0.0, float(width), float(height)):
        resized = image
    else:
        resized = image.resize((spec.width, spec.height), RESAMPLE, box=box)
    pixels = np.asarray(resized, dtype=np.uint8)
    if pixels.ndim == 2:
        pixels = pixels[:, :, None]
    return pixels


def prepare(data: bytes, spec: InputSpec, max_pixels: int) -> np.ndarray:
    """decode + to_pixels: the whole image preprocessing, as the converter calibrates with it."""
    return to_pixels(decode(data, spec, max_pixels), spec)


class InputQuantizer:
    """uint8 pixels -> input tensor (1, H, W, C) of the engine's dtype.

    real = (pixel - mean) / std is what the network expects; a quantized input holds
    q = round(real / scale) + zero_point, clamped to its dtype. Pixels are 8-bit, so the
    whole map is a 256-entry table per channel, computed once. When that table is the
    identity (uint8 input with scale = 1/std and zero_point = mean), pixels go in as they are.
    """

    def __init__(self, spec: InputSpec, dtype: np.dtype, scale: float, zero_point: int):
        self.dtype = np.dtype(dtype)
        channels = spec.channels
        mean = np.broadcast_to(np.asarray(spec.mean, np.float64), (channels,))
        std = np.broadcast_to(np.asarray(spec.std, np.float64), (channels,))
        pixel = np.arange(256, dtype=np.float64)[:, None]
        real = (pixel - mean) / std  # (256, C)
        if self.dtype == np.float32:
            self.table = real.astype(np.float32)
        else:
            if scale <= 0:
                raise ValueError(f"quantized input needs a positive scale, got {scale}")
            info = np.iinfo(self.dtype)
            # round half away from zero, as TFLite's Quantize kernel does.
            scaled = real / scale
            q = np.sign(scaled) * np.floor(np.abs(scaled) + 0.5) + zero_point
            self.table = np.clip(q, info.min, info.max).astype(self.dtype)
        identity = np.arange(256)[:, None]
        self.is_identity = self.dtype == np.uint8 and bool(np.all(self.table == identity))
        self.channels = channels

    def __call__(self, pixels: np.ndarray) -> np.ndarray:
        if self.is_identity:
            out = pixels
        elif self.channels == 1:
            out = self.table[:, 0][pixels]
        else:
            out = np.empty(pixels.shape, self.table.dtype)
            for c in range(self.channels):
                np.take(self.table[:, c], pixels[:, :, c], out=out[:, :, c])
        return out[None, ...]
