#!/usr/bin/env python3
"""The worst PSNR between requests' raw RGB outputs (`difflet ddit --out DIR`: <i>.rgb)
in two folders: `identical`, the worst in dB, or -1 when a file is missing or the sizes
differ. Standard library only.

    tests/rgb_psnr.py DIR_A DIR_B COUNT
"""
import math
import os
import sys

a_dir, b_dir, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
worst = math.inf
for i in range(count):
    try:
        with open(os.path.join(a_dir, "%d.rgb" % i), "rb") as f:
            a = f.read()
        with open(os.path.join(b_dir, "%d.rgb" % i), "rb") as f:
            b = f.read()
    except OSError:
        worst = -1
        break
    if len(a) != len(b) or not a:
        worst = -1
        break
    if a != b:
        mse = sum((x - y) ** 2 for x, y in zip(a, b)) / len(a)
        worst = min(worst, 10 * math.log10(255 ** 2 / mse))
print("identical" if worst == math.inf else "%.1f" % worst)
