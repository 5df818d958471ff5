"""bytes -> an upright RGB (or L) Pillow image: the formats Pillow decodes in its own code, bombs and damaged
files refused, EXIF orientation applied, JPEGs through libjpeg-turbo (scaled down in the DCT domain when the
model needs far fewer pixels) with its corrupt-data warnings reported; and Pillow's pixel blocks kept for reuse.
"""

from __future__ import annotations

import io
import warnings
import zlib
from dataclasses import dataclass

import numpy as np
import simplejpeg
from PIL import ExifTags, Image, ImageOps, UnidentifiedImageError

from app.errors import BadImage, DamagedImage, ImageTooLarge
from app.imaging.geometry import draft_size
from app.model_dir.schema import InputSpec
from app.settings import default

# Formats decoded by Pillow's own code. Others (EPS runs Ghostscript, ...) are refused.
DECODABLE_FORMATS = ("JPEG", "PNG", "WEBP", "GIF", "BMP", "TIFF")
# What Pillow's JPEG plugin opens: JPEG, and MPO (a JPEG followed by more images: 3D cameras, and the
# gain map of Ultra HDR phone photos), whose first image, the photo, is decoded as any JPEG.
JPEG_FORMATS = ("JPEG", "MPO")


# Pillow frees every image's pixel memory by default, so each request pays fresh pages for its decoded and
# resized images (about 1 ms of a 640x427 JPEG's 5 ms here). Keeping a few freed blocks for reuse removes that;
# bounded: at most IMAGE_BUFFER_BLOCKS blocks of IMAGE_BUFFER_BLOCK_BYTES (settings).
def reuse_image_buffers(blocks: int = default("image_buffer_blocks"),
                        block_bytes: int = default("image_buffer_block_bytes")) -> None:
    """Let Pillow keep up to `blocks` freed pixel blocks for the next images (process-wide)."""
    Image.core.set_block_size(block_bytes)
    Image.core.set_blocks_max(blocks)


@dataclass(frozen=True)
class Source:
    """The original image behind a decoded one: its size as a viewer shows it (EXIF orientation applied), and
    how many of its pixels one decoded pixel spans (a JPEG decoded at 1/2, 1/4 or 1/8 scale: 2, 4, 8; else 1)."""

    width: int
    height: int
    scale: int = 1


def decode(data: bytes | bytearray, spec: InputSpec, max_pixels: int, *, max_decoded_pixels: int | None = None,
           accept_damaged: bool = False) -> Image.Image:
    """decode_with_source() without the Source: the image the model's input is made from."""
    return decode_with_source(data, spec, max_pixels, max_decoded_pixels=max_decoded_pixels,
                              accept_damaged=accept_damaged)[0]


def decode_with_source(data: bytes | bytearray, spec: InputSpec, max_pixels: int, *,
                       max_decoded_pixels: int | None = None,
                       accept_damaged: bool = False) -> tuple[Image.Image, Source]:
    """Decode, check size, orient by EXIF, and convert to RGB (or L for 1-channel models); with the Source.

    max_pixels: the largest image accepted (from its header, before decoding).
    max_decoded_pixels: the most pixels decoded for formats without reduced-size decoding
        (all but JPEG, which decodes at 1/2..1/8 scale when the model needs fewer pixels; by Ultralytics'
        convention a JPEG is decoded whole up to this many pixels, reduced beyond).
    accept_damaged: False refuses what the decoder reports as damaged (corrupt JPEG entropy
        data, a truncated JPEG, a PNG chunk whose CRC is wrong) with BadImage; True decodes it.
    """
    if not data:
        raise BadImage("empty image")
    model_mode = "L" if spec.channels == 1 else "RGB"
    plain = _plain_jpeg_header(data)
    if plain is not None:  # no orientation to apply: straight to libjpeg-turbo
        width, height, mode = plain
        _check_pixels(width, height, max_pixels)
        size = draft_size(width, height, spec, max_decoded_pixels)
        image = _to_mode(_libjpeg_image(data, width, height, mode, size, accept_damaged), model_mode)
        return image, Source(width, height, _jpeg_scale(width, height, size))
    try:
        with warnings.catch_warnings():
            # Pillow's own bomb check warns or raises by its global limit; ours is per call.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            image = Image.open(BufferFile(data), formats=DECODABLE_FORMATS)
    except UnidentifiedImageError:
        raise BadImage(
            f"not an image in a supported format ({', '.join(DECODABLE_FORMATS)})"
        ) from None
    except Image.DecompressionBombError as e:
        raise ImageTooLarge(str(e)) from None
    except (OSError, ValueError, SyntaxError) as e:
        raise BadImage(f"cannot read image header: {e}") from None
    width, height = image.size
    _check_pixels(width, height, max_pixels)
    if width == 0 or height == 0:
        raise BadImage(f"image has no pixels ({width}x{height})")
    is_jpeg = image.format in JPEG_FORMATS
    if not is_jpeg and max_decoded_pixels is not None and width * height > max_decoded_pixels:
        raise ImageTooLarge(
            f"a {image.format} image of {width}x{height} = {width * height} pixels is decoded whole; the limit "
            f"for formats other than JPEG is {max_decoded_pixels} pixels (JPEGs decode at reduced size)"
        )
    if image.format == "PNG" and not accept_damaged:
        check_png_checksums(data)
    size = draft_size(width, height, spec, max_decoded_pixels)
    if is_jpeg and image.mode in JPEG_MODES:
        image = _decode_jpeg(data, image, size, accept_damaged)
    else:
        if is_jpeg and not accept_damaged:
            # CMYK and YCCK: the pixels are Pillow's (its CMYK -> RGB), the check for damage libjpeg-turbo's;
            # what TurboJPEG cannot read otherwise (sampling it does not classify, say) Pillow decides
            try:
                _libjpeg_decode(data, "CMYK", width, height, size, strict=True)
            except DamagedImage:
                raise
            except BadImage:
                pass
        if is_jpeg:
            # DCT-domain downscaling: decodes at 1/2, 1/4 or 1/8 size while staying >= what
            # the crop needs, so the later resize still has at least the model's resolution.
            image.draft(image.mode, size)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", Image.DecompressionBombWarning)
                image.load()
        except Image.DecompressionBombError as e:
            raise ImageTooLarge(str(e)) from None
        except (OSError, ValueError, SyntaxError, EOFError) as e:
            raise BadImage(f"cannot decode image: {e}") from None
    scale = _jpeg_scale(width, height, size) if is_jpeg else 1
    if image.getexif().get(ExifTags.Base.Orientation) in TRANSPOSING:
        width, height = height, width
    # in place: without an orientation tag the copying form copies every pixel for nothing
    ImageOps.exif_transpose(image, in_place=True)
    return _to_mode(image, model_mode), Source(width, height, scale)


# EXIF orientations that turn the stored image a quarter (5-8): a viewer shows its width as its height
TRANSPOSING = frozenset((5, 6, 7, 8))


# JPEG colour spaces decoded by libjpeg-turbo through simplejpeg (which reports corrupt data);
# others (CMYK, YCCK) are decoded by Pillow, which silently repairs what it can, after a check
# through libjpeg-turbo (a second decode, at reduced size, for these rare files).
JPEG_MODES = {"RGB": "RGB", "L": "GRAY"}


def _decode_jpeg(data, header: Image.Image, size: tuple[int, int], accept_damaged: bool) -> Image.Image:
    """Pixels through libjpeg-turbo with its warnings surfaced (Pillow's decoder discards them:
    its libjpeg message hook does nothing), at the scale Pillow's draft() would pick for `size` and with the
    same IDCT (islow) and upsampling (fancy), so the pixels are Pillow's, byte for byte."""
    image = _libjpeg_image(data, *header.size, header.mode, size, accept_damaged)
    image.info.update(header.info)
    orientation = header.getexif().get(ExifTags.Base.Orientation)
    if orientation is not None:
        image.getexif()[ExifTags.Base.Orientation] = orientation
    return image


# Segments of a JPEG that change nothing about its pixels or orientation: APP0 (JFIF), APP3-APP15
# (APP14: Adobe, which libjpeg reads itself), DQT, DHT, DRI, COM. APP1 (Exif, XMP) and APP2 (ICC,
# MPF) go the whole way through Pillow.
_PLAIN_SEGMENTS = frozenset([0xE0, *range(0xE3, 0xF0), 0xDB, 0xC4, 0xDD, 0xFE])
_PLAIN_FRAMES = {0xC0, 0xC1, 0xC2}  # baseline, extended, progressive Huffman
_PLAIN_MODES = {1: "L", 3: "RGB"}    # components -> the mode Pillow gives them


def _plain_jpeg_header(data) -> tuple[int, int, str] | None:
    """(width, height, mode) of a JPEG whose header holds nothing but what libjpeg-turbo needs (no
    Exif, so no orientation), read in a few microseconds; None for anything else, which Pillow
    opens (its header parser reads marker by marker through Python: ~0.2 ms of a 224x224 JPEG's ~1 ms).
    The segments are not parsed: a short JFIF or Adobe segment, say, which Pillow's parser refused,
    is ignored here as libjpeg ignores it, and the image decodes."""
    view = memoryview(data)
    if view[:3] != b"\xff\xd8\xff":
        return None
    pos, end, size = 2, len(view), None
    while pos + 4 <= end and view[pos] == 0xFF:
        marker, length = view[pos + 1], int.from_bytes(view[pos + 2:pos + 4], "big")
        if marker == 0xDA:  # start of scan: the header is complete
            return size
        if marker in _PLAIN_FRAMES:
            if size is not None or pos + 10 > end:
                return None
            height, width = int.from_bytes(view[pos + 5:pos + 7], "big"), int.from_bytes(view[pos + 7:pos + 9], "big")
            mode = _PLAIN_MODES.get(view[pos + 9])
            if mode is None or width == 0 or height == 0:
                return None
            size = (width, height, mode)
        elif marker not in _PLAIN_SEGMENTS or length < 2:
            return None
        pos += 2 + length
    return None


def _check_pixels(width: int, height: int, max_pixels: int) -> None:
    if width * height > max_pixels:
        raise ImageTooLarge(f"image is {width}x{height} = {width * height} pixels; the limit is {max_pixels}")


def _libjpeg_image(data, width: int, height: int, mode: str, size: tuple[int, int],
                   accept_damaged: bool) -> Image.Image:
    """An RGB or L JPEG's pixels through libjpeg-turbo, at the scale draft() would pick for `size`, as a Pillow
    image."""
    pixels = _libjpeg_decode(data, JPEG_MODES[mode], width, height, size, strict=not accept_damaged)
    return Image.fromarray(pixels[:, :, 0] if mode == "L" else pixels, mode)


def _libjpeg_decode(data, colorspace: str, width: int, height: int, size: tuple[int, int], strict: bool) -> np.ndarray:
    """simplejpeg at the DCT scale draft() picks for `size`; strict: libjpeg's warnings are BadImage."""
    scale = _jpeg_scale(width, height, size)
    try:
        return simplejpeg.decode_jpeg(
            bytes(data) if isinstance(data, memoryview) else data, colorspace=colorspace,
            min_width=-(-width // scale), min_height=-(-height // scale), strict=strict)
    except ValueError as e:
        # libjpeg's warnings: "Corrupt JPEG data: ...", "Premature end of JPEG file" (truncated)
        reason = str(e)
        if "Premature end of JPEG file" in reason:
            reason = f"the file is truncated ({reason})"
        if "Corrupt" in reason or "truncated" in reason:
            raise DamagedImage(f"damaged image: {reason}; EDGETPU_SERVE_ACCEPT_DAMAGED_IMAGES=true decodes it "
                               "anyway") from None
        raise BadImage(f"cannot decode image: {reason}") from None


def _jpeg_scale(width: int, height: int, size: tuple[int, int]) -> int:
    """The DCT scale denominator Pillow's JpegImageFile.draft() picks: the largest of 8, 4, 2, 1
    that keeps both sides at least `size`."""
    ratio = min(width // size[0], height // size[1])
    return next((s for s in (8, 4, 2) if ratio >= s), 1)


def check_png_checksums(data) -> None:
    """Every chunk's CRC-32 (Pillow skips the image data's): a mismatch is BadImage."""
    view = memoryview(data)
    pos, end = 8, len(view)
    while pos + 12 <= end:
        length = int.from_bytes(view[pos:pos + 4], "big")
        chunk_end = pos + 8 + length
        if chunk_end + 4 > end:
            return  # truncated: Pillow's decoder reports that
        kind = bytes(view[pos + 4:pos + 8])
        stored = int.from_bytes(view[chunk_end:chunk_end + 4], "big")
        if zlib.crc32(view[pos + 4:chunk_end]) != stored:
            raise DamagedImage(f"damaged image: PNG chunk {kind.decode('latin-1')!r} at byte {pos} fails its CRC "
                               "check (EDGETPU_SERVE_ACCEPT_DAMAGED_IMAGES=true decodes it anyway)")
        if kind == b"IEND":
            return
        pos = chunk_end + 4


class BufferFile:
    """A read-only file over bytes or a bytearray without copying it (io.BytesIO copies a bytearray)."""

    def __init__(self, data):
        self._view = memoryview(data)
        self._pos = 0

    def read(self, size: int = -1) -> bytes:
        end = len(self._view) if size is None or size < 0 else min(self._pos + size, len(self._view))
        chunk = self._view[self._pos:end].tobytes()
        self._pos = max(self._pos, end)
        return chunk

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: len(self._view)}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def tell(self) -> int:
        return self._pos

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True


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
