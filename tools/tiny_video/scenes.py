"""difflet-tiny-video's data: deterministic 64x64 clips of one shape on a plain
background, moving left to right, right to left, top to bottom, bottom to top, or
standing still, with captions in several phrasings. Nothing is downloaded.

A scene is (shape, colour, background, motion, size); the palette is difflet-tiny's.
The held-out split is a fixed set of combinations that never appears in training (the
evaluation's prompts).
"""
import importlib.util
import os
import random

import numpy as np

_spec = importlib.util.spec_from_file_location(  # difflet-tiny's scenes (same palette and shapes)
    "tiny_image_scenes", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tiny", "scenes.py"))
image_scenes = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(image_scenes)

SIZE = 64
FRAMES = 9  # 4k + 1: the VAE's first frame, then two chunks of four
FPS = 8
COLOURS = image_scenes.COLOURS
SHAPES = image_scenes.SHAPES
SIZES = {"small": 7, "large": 11}  # half-extent in pixels
MOTIONS = ["left to right", "right to left", "top to bottom", "bottom to top", "still"]
# start and end of the track along the motion axis (pixels); the other axis sits near 32
TRACK = (14, 50)
# CENTRE_START (train.py --centre-start): every moving shape starts near the middle
# (32 +- CENTRE_JITTER) and moves CENTRE_TRACK pixels, so where a clip starts says
# nothing of its direction (with TRACK it says everything: left to right always starts
# on the left)
CENTRE_START = False
CENTRE_TRACK = 14
CENTRE_JITTER = 5

PHRASES = {  # motion -> ways to say it after the object
    "left to right": ["moving from left to right", "moving to the right", "sliding right"],
    "right to left": ["moving from right to left", "moving to the left", "sliding left"],
    "top to bottom": ["moving from top to bottom", "moving down", "falling down"],
    "bottom to top": ["moving from bottom to top", "moving up", "rising up"],
    "still": ["standing still", "not moving", "resting in the middle"],
}
VERBS = {"left to right": "slides right", "right to left": "slides left", "top to bottom": "slides down",
         "bottom to top": "slides up", "still": "stays still"}
TEMPLATES = [
    "a {size} {colour} {shape} {phrase} on a {bg} background",
    "{bg} background, a {size} {colour} {shape} {verb}",
    "a {colour} {shape}, {size}, {phrase}, on {bg}",
    "{bg} background with a {size} {colour} {shape} {phrase}",
    "a {size} {shape} in {colour} {phrase} over a {bg} background",
]


def all_scenes():
    out = []
    for shape in SHAPES:
        for colour in COLOURS:
            for bg in COLOURS:
                if bg == colour:
                    continue
                for motion in MOTIONS:
                    for size in SIZES:
                        out.append((shape, colour, bg, motion, size))
    return out


def split(seed=4321, n_heldout=96):
    """(train, heldout): held-out combinations never appear in training."""
    scenes = all_scenes()
    rng = random.Random(seed)
    rng.shuffle(scenes)
    return scenes[n_heldout:], scenes[:n_heldout]


def caption(scene, rng, template=None):
    shape, colour, bg, motion, size = scene
    t = TEMPLATES[template] if template is not None else rng.choice(TEMPLATES)
    return t.format(size=size, colour=colour, shape=shape, phrase=rng.choice(PHRASES[motion]), verb=VERBS[motion],
                    bg=bg)


def track(scene, jitter=None):
    """[(cx, cy)] * FRAMES, the shape's centre in each frame, and its half-extent."""
    _, _, _, motion, size = scene
    a, b = TRACK
    cross = 32
    r = SIZES[size]
    if CENTRE_START:
        a = 32 + (jitter.randint(-CENTRE_JITTER, CENTRE_JITTER) if jitter is not None else 0)
        if motion in ("right to left", "bottom to top"):  # mirrored below (SIZE - 1 - u): starts at a too
            a = SIZE - 1 - a
        b = a + CENTRE_TRACK
    if jitter is not None:
        if not CENTRE_START:
            a += jitter.randint(-3, 3)
            b += jitter.randint(-3, 3)
        cross += jitter.randint(-6, 6)
        r += jitter.randint(-1, 1)
    out = []
    for f in range(FRAMES):
        u = a + (b - a) * f / (FRAMES - 1)
        if motion == "left to right":
            out.append((u, cross))
        elif motion == "right to left":
            out.append((SIZE - 1 - u, cross))
        elif motion == "top to bottom":
            out.append((cross, u))
        elif motion == "bottom to top":
            out.append((cross, SIZE - 1 - u))
        elif CENTRE_START:  # still, where a moving one would start
            out.append((a, cross))
        else:  # still: one place near the middle
            out.append((cross if jitter is None else 32 + (a - 14) * 2, cross))
    return out, r


def render(scene, jitter=None):
    """uint8 [FRAMES, 64, 64, 3]. jitter: optional rng for track / size noise."""
    shape, colour, bg, _, _ = scene
    pts, r = track(scene, jitter)
    clip = np.empty((FRAMES, SIZE, SIZE, 3), np.uint8)
    clip[:] = COLOURS[bg]
    for f, (cx, cy) in enumerate(pts):
        clip[f][image_scenes.shape_mask(shape, cx, cy, r)] = COLOURS[colour]
    return clip
