"""Which way generated clips move, against where their shape starts: reads an
evaluation grid (`difflet eval-tiny-video --save-grid GRID.png`: a row per prompt, its
9 frames side by side) with the prompts file it was made from, and counts, over the
moving prompts whose shape is found in every frame: the axis right (more displacement
along the caption's axis than across it), the direction right (more than 6 px the
caption's way), and the direction right when the shape starts on the half of the frame
the caption says it moves *towards* (a training clip never does) or on the other half.

    build/difflet eval-tiny-video --prompts-file models/difflet-tiny-video/validation_prompts.json \\
        --prompts 96 --steps 20 --save-grid /tmp/grid.png
    tools/venv/bin/python tools/tiny_video/track_sides.py /tmp/grid.png \\
        models/difflet-tiny-video/validation_prompts.json
"""
import json
import os
import sys

import numpy as np
from PIL import Image

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reader  # noqa: E402  (tools/tiny_video/reader.py)

AXIS = {"left to right": (0, 1), "right to left": (0, -1), "top to bottom": (1, 1), "bottom to top": (1, -1)}


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: track_sides.py GRID.png PROMPTS.json")
    grid = np.asarray(Image.open(sys.argv[1]).convert("RGB")).astype(np.float64)
    with open(sys.argv[2]) as f:
        meta = json.load(f)
    size, frames = meta.get("size", 64), meta.get("frames", 9)
    n = axis_ok = sign_ok = 0
    sides = {True: [0, 0], False: [0, 0]}  # starts on the far half: [clips, direction right]
    for i, p in enumerate(meta["prompts"]):
        if p["motion"] not in AXIS:
            continue
        ax, sign = AXIS[p["motion"]]
        clip = grid[i * size:(i + 1) * size].reshape(size, frames, size, 3).transpose(1, 0, 2, 3)
        _, _, _, cx, cy, found = reader.shape_track(clip)  # the evaluation's reading of the shape
        if not found.all():
            continue
        along, across = (cx, cy) if ax == 0 else (cy, cx)
        disp = (along[-1] - along[0]) * sign
        n += 1
        axis_ok += abs(along[-1] - along[0]) > abs(across[-1] - across[0])
        sign_ok += disp > 6
        far = (along[0] - (size - 1) / 2) * sign > 0
        sides[far][0] += 1
        sides[far][1] += disp > 6
    print(f"{n} moving clips with a shape in every frame: axis right {axis_ok}, direction right {sign_ok}")
    print(f"  starting on the half it should move towards: {sides[True][0]}, direction right {sides[True][1]}")
    print(f"  starting on the other half:                  {sides[False][0]}, direction right {sides[False][1]}")


if __name__ == "__main__":
    main()
