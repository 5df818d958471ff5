"""Face models the tests build, and the synthetic people they see: no real face model or photo ships here.

**People** (`draw_face`, `face_photo`): person k is a cartoon face whose attributes follow from k (skin and hair
colour, hairline, face width, eye spacing, size and colour, brows, nose, mouth, glasses, beard), drawn at any
size with its 5 landmarks (eyes, nose tip, mouth corners, in continuous pixels); a variant of the same person
moves, scales, lights and noises it a little. `face_photo` puts faces into a dark 320x240 scene.

**The detector** (`tiny_face_detector`), shaped as Ultra-Light-Fast-Generic-Face-Detector's TFLite export: an
int8 image [1, 240, 320, 3] with ULFD's normalization ((pixel - 127) / 128: scale 1/128, zero point -1), and
two outputs over its 4420 priors (app/tasks/priors.py): boxes [1, 4420, 4] and scores [1, 4420, 2].

    int8 image -> CONV 16x16/16 -> m [1, 15, 20, 1]: each 16-pixel cell's mean + 1, in [0, 2] (the 20x15 map;
                  0 is black, and it is what the SAME convolutions pad with: outside the image is black)
       m -> CONV 3x3 SAME -> locations of its 2 priors a cell   (48-pixel prior: the 3x3 cells around it)
       m -> CONV 5x5 SAME -> logits of its 2 priors a cell
       image -> CONV 8x8/8 (40x30), m -> CONV 1x1/2 (10x8) -> CONV 1x1/2 (5x4): the other maps' heads, whose
                face logit is -7.5 whatever the image
    RESHAPE each head to [1, n, 4] / [1, n, 2], CONCATENATION in ULFD's map order, SOFTMAX (scores="softmax")

It finds bright face-sized blobs: the 48-pixel prior's face logit rises with the brightness of the 48x48
pixels around it (the 3x3 cells) over that of the ring of 16 cells around those, so that it peaks where a face
is and not beside it; its location's centre offsets are the brightness to the right minus the
left (dx) and below minus above (dy) of those cells, scaled so that a face 8 pixels off the cell's centre is
moved onto it. Sizes are never regressed (l_w = l_h = 0: every box is 48 pixels). boxes="decoded" is the
`is_test=True` export: the decode is in the graph (MUL by 0.1 x the prior's size, ADD the prior's corners:
exactly ULFD's decode when sizes are not regressed), its output the corners. scores="logits" leaves the
softmax out, as an export of the training graph does.

**The embedder** (`tiny_face_embedder`), shaped as MobileFaceNet: an image 112 high x 96 wide (uint8 with
zero point 128, or int8), ((pixel - 128) / 128), a 128-value embedding [1, 128], not normalized:

    image -> AVERAGE_POOL 16x16 every 8 pixels [1, 13, 11, 3] -> RESHAPE [1, 429] -> FULLY_CONNECTED [1, 128]

The fully-connected layer is learnt when the model is built, from 64 reference people (1000-1063) seen 6 ways
each through the service's own crop (a box up to 8 pixels off, margin 0.2) and alignment (landmarks a pixel
off): Fisher's linear discriminant of the pooled values, turned by a fixed random rotation. People 0-7
(the tests') are not among them; through the tiny detector and the crop, any two photos of one of them are
more alike than any two of two of them (tests/test_face_models.py measures by how much). mask="first" or
"last" adds a [1, 2] SOFTMAX output beside the embedding, as MobileFaceNet exports with a mask classifier have.

Every builder is cached for the session: the detector takes milliseconds; the embedder 1-3 seconds the first
time (it draws and crops its 768 reference views), nothing after.
"""

from __future__ import annotations

import colorsys
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from PIL import Image, ImageDraw

from app.faces.align import aligned, cropped
from app.tasks.priors import ultra_light_priors
from tests.tflite_builder import GraphBuilder

DETECTOR_SIZE = (320, 240)        # width, height
EMBEDDER_SIZE = (96, 112)         # width, height: MobileFaceNet's 112 high x 96 wide
EMBEDDING = 128
FACE_SIDE = 48                    # the face size the tiny detector finds: its 48-pixel prior
PRIORS = 4420
REFERENCE_PEOPLE = range(1000, 1064)  # the people the embedder is learnt from; the tests use others
SUPERSAMPLE = 4


@dataclass(frozen=True)
class DrawnFace:
    """A face drawn: its image and its 5 landmarks (x, y) in the image's continuous pixels, left eye first."""

    image: Image.Image
    landmarks: np.ndarray  # [5, 2]


@dataclass(frozen=True)
class Person:
    skin: tuple[int, int, int]
    hair: tuple[int, int, int]
    hairline: float       # fraction of the face's height the hair covers from the top
    face_width: float     # fraction of the box's width
    eye_y: float
    eye_spacing: float
    eye_radius: float
    iris: tuple[int, int, int]
    brow: float           # thickness, fraction of the height
    nose: float           # length, fraction of the height
    mouth_y: float
    mouth_width: float
    lips: tuple[int, int, int]
    glasses: bool
    beard: bool


def person(k: int) -> Person:
    """Person k's attributes: the same in every process."""
    rng = np.random.default_rng([44, k])
    red = rng.uniform(175, 245)
    green = red * rng.uniform(0.68, 0.86)
    skin = (int(red), int(green), int(green * rng.uniform(0.72, 0.92)))
    # hair of any colour (a cartoon's), what tells people apart most. People 0-7 (the tests') take the 8 hues
    # 45 degrees apart in the order 0, 3/8, 6/8, 1/8, ..., bright and dark in turn, so that two of them with
    # neighbouring hues differ in brightness; the others a hue spread by the golden ratio
    if 0 <= k < 8:
        hue, value = (3 * k / 8) % 1.0, (0.95, 0.5)[k % 2]
    else:
        hue, value = (k * 0.6180339887) % 1.0, rng.uniform(0.35, 0.95)
    hair = tuple(int(255 * v) for v in colorsys.hsv_to_rgb(hue, rng.uniform(0.55, 0.95), value))
    iris = tuple(int(v) for v in rng.uniform(30, 170, 3))
    lips = tuple(int(v) for v in (rng.uniform(130, 200), rng.uniform(50, 100), rng.uniform(50, 100)))
    return Person(skin, hair, rng.uniform(0.08, 0.22), rng.uniform(0.72, 0.96), rng.uniform(0.40, 0.50),
                  rng.uniform(0.26, 0.42), rng.uniform(0.045, 0.08), iris, rng.uniform(0.015, 0.045),
                  rng.uniform(0.10, 0.20), rng.uniform(0.70, 0.80), rng.uniform(0.22, 0.46), lips,
                  bool(rng.uniform() < 0.3), bool(rng.uniform() < 0.3))


def draw_face(k: int, variant: int = 0, size: tuple[int, int] = EMBEDDER_SIZE,
              background: tuple[int, int, int] | None = None) -> DrawnFace:
    """Person k's face filling an image of `size` (width, height); variant 0 is the face as it is, other
    variants move it by up to 3 % of the size, scale it by up to 4 %, light it 0.92-1.08 times and add noise."""
    width, height = size
    jitter = np.random.default_rng([45, k, variant])
    p = person(k)
    if variant:
        dx, dy = jitter.uniform(-0.03, 0.03, 2) * (width, height)
        zoom, light, noise = jitter.uniform(0.96, 1.04), jitter.uniform(0.92, 1.08), 6.0
    else:
        dx = dy = 0.0
        zoom, light, noise = 1.0, 1.0, 0.0
    if background is None:
        background = tuple(int(v) for v in jitter.uniform(25, 70, 3))
    s = SUPERSAMPLE
    canvas = Image.new("RGB", (width * s, height * s), background)
    draw = ImageDraw.Draw(canvas)
    cx, cy = (width / 2 + dx) * s, (height / 2 + dy) * s
    fw, fh = width * p.face_width * zoom * s, height * 0.92 * zoom * s

    def at(fx: float, fy: float) -> tuple[float, float]:
        """A point of the face, in fractions of its ellipse's box, in canvas pixels."""
        return cx + (fx - 0.5) * fw, cy + (fy - 0.5) * fh

    def box(fx0, fy0, fx1, fy1):
        (x0, y0), (x1, y1) = at(fx0, fy0), at(fx1, fy1)
        return [min(x0, x1), min(y0, y1), max(x0, x1), max(y0, y1)]

    draw.ellipse(box(0, 0, 1, 1), fill=p.skin)
    draw.chord(box(-0.02, -0.02, 1.02, 2 * p.hairline + 0.2), 180, 360, fill=p.hair)
    if p.beard:
        draw.chord(box(0.15, 0.62, 0.85, 1.0), 0, 180, fill=p.hair)
    eye_left, eye_right = 0.5 - p.eye_spacing / 2, 0.5 + p.eye_spacing / 2
    r = p.eye_radius
    for ex in (eye_left, eye_right):
        draw.ellipse(box(ex - r * 1.4, p.eye_y - r, ex + r * 1.4, p.eye_y + r), fill=(240, 240, 235))
        draw.ellipse(box(ex - r * 0.7, p.eye_y - r * 0.7, ex + r * 0.7, p.eye_y + r * 0.7), fill=p.iris)
        draw.rectangle(box(ex - r * 1.6, p.eye_y - r * 2.2 - p.brow, ex + r * 1.6, p.eye_y - r * 2.2), fill=p.hair)
        if p.glasses:
            draw.ellipse(box(ex - r * 2.2, p.eye_y - r * 1.8, ex + r * 2.2, p.eye_y + r * 1.8), outline=(20, 20, 20),
                         width=max(1, int(0.012 * fh)))
    nose_y = p.eye_y + p.nose + 0.08
    shade = tuple(int(c * 0.75) for c in p.skin)
    draw.polygon([at(0.5, p.eye_y + 0.04), at(0.45, nose_y), at(0.55, nose_y)], fill=shade)
    mouth_left, mouth_right = 0.5 - p.mouth_width / 2, 0.5 + p.mouth_width / 2
    draw.chord(box(mouth_left, p.mouth_y - 0.04, mouth_right, p.mouth_y + 0.04), 0, 180, fill=p.lips)
    image = canvas.reduce(s)
    pixels = np.asarray(image, np.float64) * light
    if noise:
        pixels += jitter.normal(0, noise, pixels.shape)
    image = Image.fromarray(np.clip(np.round(pixels), 0, 255).astype(np.uint8))
    points = [at(eye_left, p.eye_y), at(eye_right, p.eye_y), at(0.5, nose_y), at(mouth_left, p.mouth_y),
              at(mouth_right, p.mouth_y)]
    return DrawnFace(image, np.asarray(points) / s)


@dataclass(frozen=True)
class PhotoFace:
    """A face in a photo: whose, and where (its box and landmarks in the photo's continuous pixels)."""

    person: int
    box: tuple[float, float, float, float]
    landmarks: np.ndarray


def face_photo(faces: list[tuple[int, int, tuple[int, int, int]]], size: tuple[int, int] = DETECTOR_SIZE,
               seed: int = 0) -> tuple[Image.Image, list[PhotoFace]]:
    """A dark scene of `size` with faces (person, variant, (left, top, side)): each drawn into its square box."""
    width, height = size
    rng = np.random.default_rng([46, seed])
    low = rng.uniform(10, 35, (height // 8 + 1, width // 8 + 1, 3))
    scene = Image.fromarray(np.clip(low, 0, 255).astype(np.uint8)).resize((width, height), Image.Resampling.BILINEAR)
    placed = []
    for k, variant, (left, top, side) in faces:
        drawn = draw_face(k, variant, (side, side), background=tuple(int(v) for v in rng.uniform(15, 30, 3)))
        scene.paste(drawn.image, (left, top))
        placed.append(PhotoFace(k, (float(left), float(top), float(left + side), float(top + side)),
                                drawn.landmarks + (left, top)))
    return scene, placed


# ---- the detector -------------------------------------------------------------------------------------------

INPUT_Q = (1 / 128, -1)     # ULFD's (pixel - 127) / 128 as int8: q = pixel - 128
MEANS_Q = (1 / 127, -127)   # cell means + 1, in [0, 2]: real 0 (the zero point, what SAME pads with) is black
LOCATIONS_Q = (1 / 32, 0)
LOGITS_Q = (1 / 16, 0)
SOFTMAX_Q = (1 / 256, -128)  # TFLite's int8 SOFTMAX output, always
CORNERS_Q = (1 / 140, -74)   # decoded corners in [-0.39, 1.44]
FACE_GAIN = 3.0              # the 48-pixel prior's face logit per unit of brightness (m) of its 3x3 cells ...
SURROUND = 0.5               # ... less half the brightness of the 16 cells around them
FACE_BIAS = -6.0             # over 150 random photos: every face >= 0.97, everything else <= 0.07
SHIFT_GAIN = 1.1             # its centre offset per unit of brightness difference (see the module docstring)
OFF = -7.5                   # the face logit of every other prior


def _per_channel_conv(g: GraphBuilder, name: str, source: int, source_scale: float, weights: np.ndarray,
                      bias: np.ndarray, out_shape, out_q, stride: int, padding: str) -> int:
    """CONV_2D with int8 per-channel weights [O, KH, KW, I] quantized here, real biases [O]."""
    scales = np.abs(weights).reshape(len(weights), -1).max(1) / 127
    scales[scales == 0] = 1.0
    wq = np.round(weights / scales[:, None, None, None])
    w = g.tensor(f"{name}/weights", weights.shape, "INT8", scale=scales, zero_point=[0] * len(scales), data=wq)
    bias_scales = source_scale * scales
    b = g.tensor(f"{name}/bias", [len(bias)], "INT32", scale=bias_scales, zero_point=[0] * len(bias),
                 data=np.round(bias / bias_scales))
    out = g.tensor(name, out_shape, "INT8", scale=out_q[0], zero_point=out_q[1])
    g.op("CONV_2D", [source, w, b], [out], padding=padding, strideW=stride, strideH=stride, dilationWFactor=1,
         dilationHFactor=1)
    return out


def _flatten(g: GraphBuilder, name: str, tensor: int, rows: int, columns: int, q) -> int:
    shape = g.constant(f"{name}/shape", [1, rows, columns])
    out = g.tensor(name, [1, rows, columns], "INT8", scale=q[0], zero_point=q[1])
    g.op("RESHAPE", [tensor, shape], [out], newShape=[1, rows, columns])
    return out


def _off_heads(g: GraphBuilder, name: str, source: int, source_scale: float, kernel: int, channels: int,
               map_hw: tuple[int, int], priors: int, stride: int, padding: str) -> tuple[int, int]:
    """A map whose priors never see a face: locations 0, logits (0, OFF)."""
    h, w = map_hw
    reg = _per_channel_conv(g, f"{name}/locations", source, source_scale,
                            np.zeros((priors * 4, kernel, kernel, channels)), np.zeros(priors * 4),
                            [1, h, w, priors * 4], LOCATIONS_Q, stride, padding)
    bias = np.tile([0.0, OFF], priors)
    cls = _per_channel_conv(g, f"{name}/logits", source, source_scale, np.zeros((priors * 2, kernel, kernel, channels)),
                            bias, [1, h, w, priors * 2], LOGITS_Q, stride, padding)
    n = h * w * priors
    return _flatten(g, f"{name}/boxes", reg, n, 4, LOCATIONS_Q), _flatten(g, f"{name}/scores", cls, n, 2, LOGITS_Q)


@lru_cache(maxsize=None)
def tiny_face_detector(boxes: str = "priors", scores: str = "softmax", order: str = "boxes-first") -> bytes:
    """The detector (module docstring). boxes: "priors" (raw locations) or "decoded" (is_test corners);
    scores: "softmax" or "logits"; order: "boxes-first" (ULFD's TFLite export) or "scores-first" (its ONNX)."""
    if boxes not in ("priors", "decoded") or scores not in ("softmax", "logits"):
        raise ValueError(f"boxes is 'priors' or 'decoded', scores 'softmax' or 'logits'; got {boxes!r}, {scores!r}")
    width, height = DETECTOR_SIZE
    g = GraphBuilder()
    image = g.tensor("input", [1, height, width, 3], "INT8", scale=INPUT_Q[0], zero_point=INPUT_Q[1])
    # the 20x15 map: cell means, then its two priors' heads on the 3x3 cells around each
    means = _per_channel_conv(g, "means", image, INPUT_Q[0], np.full((1, 16, 16, 3), 1 / 768), np.ones(1),
                              [1, 15, 20, 1], MEANS_Q, 16, "VALID")
    shift = np.zeros((8, 3, 3, 1))
    shift[4, :, 2, 0], shift[4, :, 0, 0] = SHIFT_GAIN, -SHIFT_GAIN  # dx: right cells - left cells
    shift[5, 2, :, 0], shift[5, 0, :, 0] = SHIFT_GAIN, -SHIFT_GAIN  # dy: lower cells - upper cells
    if boxes == "decoded":
        shift[6], shift[7] = shift[4], shift[5]  # the decode below wants (dx, dy, dx, dy)
    reg_b = _per_channel_conv(g, "map20x15/locations", means, MEANS_Q[0], shift, np.zeros(8), [1, 15, 20, 8],
                              LOCATIONS_Q, 1, "SAME")
    face = np.zeros((4, 5, 5, 1))
    face[3] = -FACE_GAIN * SURROUND  # the 16 cells around the 3x3: a face is brighter than what surrounds it
    face[3, 1:4, 1:4] = FACE_GAIN
    cls_b = _per_channel_conv(g, "map20x15/logits", means, MEANS_Q[0], face, np.array([0.0, OFF, 0.0, FACE_BIAS]),
                              [1, 15, 20, 4], LOGITS_Q, 1, "SAME")
    heads = {1: (_flatten(g, "map20x15/boxes", reg_b, 600, 4, LOCATIONS_Q),
                 _flatten(g, "map20x15/scores", cls_b, 600, 2, LOGITS_Q))}
    heads[0] = _off_heads(g, "map40x30", image, INPUT_Q[0], 8, 3, (30, 40), 3, 8, "VALID")
    half = _per_channel_conv(g, "means/2", means, MEANS_Q[0], np.ones((1, 1, 1, 1)), np.zeros(1), [1, 8, 10, 1],
                             MEANS_Q, 2, "SAME")
    quarter = _per_channel_conv(g, "means/4", half, MEANS_Q[0], np.ones((1, 1, 1, 1)), np.zeros(1), [1, 4, 5, 1],
                                MEANS_Q, 2, "SAME")
    heads[2] = _off_heads(g, "map10x8", half, MEANS_Q[0], 1, 1, (8, 10), 2, 1, "SAME")
    heads[3] = _off_heads(g, "map5x4", quarter, MEANS_Q[0], 1, 1, (4, 5), 3, 1, "SAME")
    locations = g.tensor("locations", [1, PRIORS, 4], "INT8", scale=LOCATIONS_Q[0], zero_point=LOCATIONS_Q[1])
    g.op("CONCATENATION", [heads[i][0] for i in range(4)], [locations], axis=1)
    logits = g.tensor("logits", [1, PRIORS, 2], "INT8", scale=LOGITS_Q[0], zero_point=LOGITS_Q[1])
    g.op("CONCATENATION", [heads[i][1] for i in range(4)], [logits], axis=1)
    out_scores = logits
    if scores == "softmax":
        out_scores = g.tensor("scores", [1, PRIORS, 2], "INT8", scale=SOFTMAX_Q[0], zero_point=SOFTMAX_Q[1])
        g.op("SOFTMAX", [logits], [out_scores], beta=1.0)
    out_boxes = locations
    if boxes == "decoded":
        priors = ultra_light_priors().boxes.astype(np.float64)
        factors = np.concatenate([priors[:, 2:], priors[:, 2:]], 1) * 0.1  # 0.1 x (w, h, w, h)
        factor_scale = factors.max() / 127
        f = g.tensor("decode/factors", [1, PRIORS, 4], "INT8", scale=factor_scale, zero_point=0,
                     data=np.round(factors / factor_scale)[None])
        moved = g.tensor("decode/offsets", [1, PRIORS, 4], "INT8", scale=0.4 / 127, zero_point=0)
        g.op("MUL", [locations, f], [moved])
        corners = np.concatenate([priors[:, :2] - priors[:, 2:] / 2, priors[:, :2] + priors[:, 2:] / 2], 1)
        c = g.tensor("decode/priors", [1, PRIORS, 4], "INT8", scale=CORNERS_Q[0], zero_point=CORNERS_Q[1],
                     data=np.round(corners / CORNERS_Q[0] + CORNERS_Q[1])[None])
        out_boxes = g.tensor("boxes", [1, PRIORS, 4], "INT8", scale=CORNERS_Q[0], zero_point=CORNERS_Q[1])
        g.op("ADD", [moved, c], [out_boxes])
    outputs = [out_boxes, out_scores] if order == "boxes-first" else [out_scores, out_boxes]
    return g.build([image], outputs)


def detector_input(photo: Image.Image) -> np.ndarray:
    """A 320x240 RGB photo as the detector's int8 input (ULFD's normalization: q = pixel - 128)."""
    pixels = np.asarray(photo.convert("RGB").resize(DETECTOR_SIZE, Image.Resampling.BILINEAR), np.int16)
    return (pixels - 128).astype(np.int8)[None]


# ---- the embedder -----------------------------------------------------------------------------------------------

POOL, POOL_STRIDE = 16, 8  # overlapping 16x16 windows every 8 pixels: 13 x 11 of them on 112 x 96
CELLS = ((EMBEDDER_SIZE[1] - POOL) // POOL_STRIDE + 1, (EMBEDDER_SIZE[0] - POOL) // POOL_STRIDE + 1)
FEATURES = CELLS[0] * CELLS[1] * 3  # 429
REFERENCE_VARIANTS = range(1, 7)


def descriptor(image: Image.Image) -> np.ndarray:
    """What the embedder pools, in float: the mean of (pixel - 128) / 128 over each 16x16 window every 8 pixels,
    [429] (rows, columns, colours)."""
    pixels = (np.asarray(image.convert("RGB"), np.float64) - 128) / 128
    sums = np.pad(pixels.cumsum(0).cumsum(1), ((1, 0), (1, 0), (0, 0)))  # summed-area table
    top, left = np.arange(CELLS[0]) * POOL_STRIDE, np.arange(CELLS[1]) * POOL_STRIDE
    t, l = top[:, None], left[None, :]
    window = sums[t + POOL, l + POOL] - sums[t, l + POOL] - sums[t + POOL, l] + sums[t, l]
    return (window / (POOL * POOL)).ravel()


def training_views(k: int, variant: int) -> list[Image.Image]:
    """Person k's face (a variant) as the embedder sees it from a photo: cut around a box a few pixels off the
    face's, with margin 0.2, and aligned on landmarks with a pixel of error."""
    rng = np.random.default_rng([48, k, variant])
    side, left, top = (int(v) for v in rng.integers((40, 30, 30), (64, 60, 60)))
    photo, (face,) = face_photo([(k, variant, (left, top, side))], size=(144, 144), seed=k * 7 + variant)
    box = tuple(np.add(face.box, np.tile(rng.uniform(-8, 8, 2), 2)))  # the tiny detector is off by up to 8 pixels
    return [cropped(photo, box, EMBEDDER_SIZE, 0.2),
            aligned(photo, face.landmarks + rng.normal(0, 0.7, (5, 2)), EMBEDDER_SIZE)]


@lru_cache(maxsize=1)
def _embedder_weights() -> tuple[np.ndarray, np.ndarray, float]:
    """The projection [128, 429], the mean descriptor [429] and the largest |value| of the reference people's
    embeddings (for the output's scale), learnt from the reference people: Fisher's linear
    discriminant (the directions that best separate people relative to how each one's views vary: within-person
    scatter whitened, then the between-person scatter's leading eigenvectors, one fewer than the people), turned
    by a fixed random rotation of the 128 outputs so that every output carries some of it (cosines unchanged)."""
    features, owners = [], []
    for k in REFERENCE_PEOPLE:
        for variant in REFERENCE_VARIANTS:
            for view in training_views(k, variant):
                features.append(descriptor(view))
                owners.append(k)
    x, owners = np.asarray(features), np.asarray(owners)
    mean = x.mean(0)
    centred = x - mean
    people = np.unique(owners)
    person_means = np.stack([centred[owners == k].mean(0) for k in people])
    within = centred - person_means[np.searchsorted(people, owners)]
    scatter_within = within.T @ within / len(x)
    scatter_within += np.eye(FEATURES) * 1e-2 * np.trace(scatter_within) / FEATURES  # regularized
    scatter_between = person_means.T @ person_means / len(people)
    values, vectors = np.linalg.eigh(scatter_within)
    whiten = vectors / np.sqrt(values)
    between, directions = np.linalg.eigh(whiten.T @ scatter_between @ whiten)
    leading = (whiten @ directions[:, np.argsort(between)[::-1][:len(people) - 1]]).T
    projection = np.zeros((EMBEDDING, FEATURES))
    projection[:len(leading)] = leading
    rotation, _ = np.linalg.qr(np.random.default_rng(47).standard_normal((EMBEDDING, EMBEDDING)))
    projection = rotation @ projection
    return projection, mean, float(np.abs(centred @ projection.T).max())


@lru_cache(maxsize=None)
def tiny_face_embedder(io: str = "uint8", mask: str | None = None) -> bytes:
    """The embedder (module docstring). io: "uint8" or "int8"; mask: None, "first" or "last" (a [1, 2] output)."""
    if io not in ("uint8", "int8") or mask not in (None, "first", "last"):
        raise ValueError(f"io is 'uint8' or 'int8', mask None, 'first' or 'last'; got {io!r}, {mask!r}")
    width, height = EMBEDDER_SIZE
    projection, mean, reach = _embedder_weights()
    g = GraphBuilder()
    scale = 1 / 128
    if io == "uint8":
        image = g.tensor("input", [1, height, width, 3], "UINT8", scale=scale, zero_point=128)
        x = g.tensor("input/int8", [1, height, width, 3], "INT8", scale=scale, zero_point=0)
        g.op("QUANTIZE", [image], [x])
    else:
        image = x = g.tensor("input", [1, height, width, 3], "INT8", scale=scale, zero_point=0)
    cells = CELLS
    pooled = g.tensor("pool", [1, *cells, 3], "INT8", scale=scale, zero_point=0)
    g.op("AVERAGE_POOL_2D", [x], [pooled], padding="VALID", strideW=POOL_STRIDE, strideH=POOL_STRIDE,
         filterWidth=POOL, filterHeight=POOL)
    shape = g.constant("flatten/shape", [1, FEATURES])
    flat = g.tensor("flatten", [1, FEATURES], "INT8", scale=scale, zero_point=0)
    g.op("RESHAPE", [pooled, shape], [flat], newShape=[1, FEATURES])

    def dense(name: str, weights: np.ndarray, bias: np.ndarray, out_q: tuple[float, int]) -> int:
        w_scale = np.abs(weights).max() / 127
        w = g.tensor(f"{name}/weights", weights.shape, "INT8", scale=w_scale, zero_point=0,
                     data=np.round(weights / w_scale))
        b = g.tensor(f"{name}/bias", [len(bias)], "INT32", scale=scale * w_scale, zero_point=0,
                     data=np.round(bias / (scale * w_scale)))
        out = g.tensor(name, [1, len(bias)], "INT8", scale=out_q[0], zero_point=out_q[1])
        g.op("FULLY_CONNECTED", [flat, w, b], [out])
        return out

    bias = -projection @ mean
    embedding = dense("embedding", projection, bias, (1.25 * reach / 127, 0))  # what the reference people reach
    outputs = [embedding]
    if mask is not None:
        # "mask" when the lower half of the face is darker than the upper: an arbitrary, deterministic rule
        rows = np.repeat(np.arange(cells[0]), cells[1] * 3)
        lower = np.where(rows >= cells[0] // 2, 1.0, -1.0) / (cells[1] * 3)
        logits = dense("mask/logits", np.stack([lower, -lower]) * 4, np.zeros(2), (1 / 16, 0))
        probabilities = g.tensor("mask", [1, 2], "INT8", scale=SOFTMAX_Q[0], zero_point=SOFTMAX_Q[1])
        g.op("SOFTMAX", [logits], [probabilities], beta=1.0)
        outputs = [probabilities, embedding] if mask == "first" else [embedding, probabilities]
    if io == "uint8":
        converted = []
        for tensor in outputs:
            t = g.tensors[tensor]
            name = t.name.decode() if isinstance(t.name, bytes) else t.name
            out = g.tensor(f"{name}/uint8", t.shape, "UINT8", scale=t.quantization.scale[0],
                           zero_point=t.quantization.zeroPoint[0] + 128)
            g.op("QUANTIZE", [tensor], [out])
            converted.append(out)
        outputs = converted
    return g.build([image], outputs)


def embedder_input(image: Image.Image, io: str = "uint8") -> np.ndarray:
    """A 96x112 RGB image as the embedder's input: uint8 as it is, or int8 (pixel - 128)."""
    pixels = np.asarray(image.convert("RGB"), np.uint8)
    if pixels.shape != (EMBEDDER_SIZE[1], EMBEDDER_SIZE[0], 3):
        raise ValueError(f"the embedder takes 112 high x 96 wide; got {pixels.shape}")
    return (pixels[None] if io == "uint8" else (pixels.astype(np.int16) - 128).astype(np.int8)[None])
