"""The evaluation's pixel reader in numpy, for training diagnostics: the same rules as
`difflet eval-tiny-video` (src/cli/eval_tiny.c): background = nearest named colour of
the 2-pixel border over every frame; shape colour = nearest other named colour of the
shape's core (pixels at least sqrt(1/2) as far from the background as the farthest);
motion = the track of the centroid of the pixels clearly off the background (least
squares displacement under 6 px: still; else the sign of the larger axis, right only
when the track never steps back by more than 2 px)."""
import numpy as np

STILL_PX, BACK_PX = 6.0, 2.0
MOTIONS = ["left to right", "right to left", "top to bottom", "bottom to top", "still"]


def _nearest(colours, rgb, exclude=None):
    best, bd = None, np.inf
    for name, c in colours.items():
        if name == exclude:
            continue
        d = float(((rgb - np.asarray(c, np.float64)) ** 2).sum())
        if d < bd:
            best, bd = name, d
    return best


def shape_track(clip):
    """clip: [F, H, W, 3] -> (border colour, squared distance from it [F, H, W], pixels
    clearly off the background per frame [F], centroid x and y of those [F] (0 where
    fewer than 4), found [F])"""
    x = clip.astype(np.float64)
    _, h, w, _ = x.shape
    border = np.zeros((h, w), bool)
    border[:2], border[-2:], border[:, :2], border[:, -2:] = True, True, True, True
    bgc = x[:, border].reshape(-1, 3).mean(0)
    d = ((x - bgc) ** 2).sum(-1)
    off = d > 60.0 ** 2
    m = off.sum((1, 2))
    found = m >= 4
    ys, xs = np.mgrid[0:h, 0:w]
    cx = np.where(found, (off * xs).sum((1, 2)) / np.maximum(m, 1), 0)
    cy = np.where(found, (off * ys).sum((1, 2)) / np.maximum(m, 1), 0)
    return bgc, d, m, cx, cy, found


def read(clip, colours):
    """clip: uint8 [F, H, W, 3] -> (background, shape colour or None, motion or None or 'back and forth')"""
    x = clip.astype(np.float64)
    f = x.shape[0]
    bgc, d, m, cx, cy, found = shape_track(x)
    bg = _nearest(colours, bgc)
    if m.sum() < 4:
        return bg, None, None
    core = d >= 0.5 * d.max()
    fg = _nearest(colours, x[core].mean(0), exclude=bg)
    if found.sum() < 2 or found.sum() * 2 < f:
        return bg, fg, None
    t = np.arange(f)[found]

    def disp(v):
        return np.polyfit(t, v[found], 1)[0] * (f - 1)
    dx, dy = disp(cx), disp(cy)
    if max(abs(dx), abs(dy)) < STILL_PX:
        return bg, fg, "still"
    horiz = abs(dx) >= abs(dy)
    sign = np.sign(dx if horiz else dy)
    v = (cx if horiz else cy)[found]
    if np.any(np.diff(v) * sign < -BACK_PX):
        return bg, fg, "back and forth"
    return bg, fg, MOTIONS[(0 if sign > 0 else 1) if horiz else (2 if sign > 0 else 3)]


def score(clips, scenes_):
    """fractions right (background, shape colour, motion) of uint8 clips against their scenes"""
    import scenes as sc  # tools/tiny_video/scenes.py
    right = np.zeros(3)
    for clip, (shape, colour, bg, motion, size) in zip(clips, scenes_):
        got = read(clip, sc.COLOURS)
        right += [got[0] == bg, got[1] == colour, got[2] == motion]
    return right / max(1, len(clips))
