"""difflet-tiny's data: deterministic 64x64 scenes of one shape on a plain background,
with captions in several phrasings. Nothing is downloaded.

A scene is (shape, colour, background, position, size). The held-out split is a fixed
set of combinations that never appears in training (used by the evaluation).
"""
import random

import numpy as np

SIZE = 64
COLOURS = {  # name -> RGB
    "red": (220, 40, 40), "green": (40, 170, 60), "blue": (40, 80, 220), "yellow": (235, 215, 40),
    "white": (245, 245, 245), "black": (20, 20, 20), "orange": (245, 140, 30), "purple": (140, 50, 170),
}
SHAPES = ["circle", "square", "triangle"]
POSITIONS = {  # name -> centre (x, y)
    "centre": (32, 32), "top left": (17, 17), "top right": (47, 17), "bottom left": (17, 47), "bottom right": (47, 47),
}
SIZES = {"small": 7, "large": 12}  # half-extent in pixels

TEMPLATES = [
    "a {size} {colour} {shape} {where} on a {bg} background",
    "{size} {colour} {shape} {where}, {bg} background",
    "a {colour} {shape}, {size}, {where}, on {bg}",
    "{bg} background with a {size} {colour} {shape} {where}",
    "a {size} {shape} in {colour} {where} over a {bg} background",
]
WHERE = {"centre": ["in the centre", "in the middle"], "top left": ["in the top left"],
         "top right": ["in the top right"], "bottom left": ["in the bottom left"],
         "bottom right": ["in the bottom right"]}


def all_scenes():
    out = []
    for shape in SHAPES:
        for colour in COLOURS:
            for bg in COLOURS:
                if bg == colour:
                    continue
                for pos in POSITIONS:
                    for size in SIZES:
                        out.append((shape, colour, bg, pos, size))
    return out


def split(seed=1234, n_heldout=96):
    """(train, heldout): held-out combinations never appear in training."""
    scenes = all_scenes()
    rng = random.Random(seed)
    rng.shuffle(scenes)
    return scenes[n_heldout:], scenes[:n_heldout]


def caption(scene, rng, template=None):
    shape, colour, bg, pos, size = scene
    t = TEMPLATES[template] if template is not None else rng.choice(TEMPLATES)
    return t.format(size=size, colour=colour, shape=shape, where=rng.choice(WHERE[pos]), bg=bg)


def render(scene, jitter=None):
    """uint8 [64, 64, 3]. jitter: optional rng for +-2 px position / +-1 px size noise."""
    shape, colour, bg, pos, size = scene
    img = np.empty((SIZE, SIZE, 3), np.uint8)
    img[:] = COLOURS[bg]
    cx, cy = POSITIONS[pos]
    r = SIZES[size]
    if jitter is not None:
        cx += jitter.randint(-2, 2)
        cy += jitter.randint(-2, 2)
        r += jitter.randint(-1, 1)
    img[shape_mask(shape, cx, cy, r)] = COLOURS[colour]
    return img


def shape_mask(shape, cx, cy, r):
    """bool [64, 64]: the pixels of a shape centred at (cx, cy) with half-extent r"""
    yy, xx = np.mgrid[0:SIZE, 0:SIZE]
    if shape == "circle":
        return (xx - cx) ** 2 + (yy - cy) ** 2 <= r * r
    if shape == "square":
        return (abs(xx - cx) <= r) & (abs(yy - cy) <= r)
    t = (yy - (cy - r)) / (2.0 * r)  # triangle pointing up: apex (cx, cy - r), base y = cy + r
    return (t >= 0) & (t <= 1) & (abs(xx - cx) <= t * r)
