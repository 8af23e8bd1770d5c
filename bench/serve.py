#!/usr/bin/env python3
"""Resident vs standalone (Difflet §6): the same request through `difflet serve` and
through a fresh `difflet generate` process (warm program cache), in one run; and the
server's own overhead (HTTP + queue + IPC) from the timestamps it reports.

    bench/serve.py build/difflet [MODEL] [--size 64x64] [--steps 20] [--n 10]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

ap = argparse.ArgumentParser()
ap.add_argument("bin")
ap.add_argument("model", nargs="?", default=os.path.join(os.path.dirname(__file__), "..", "models", "difflet-tiny"))
ap.add_argument("--size", default="64x64")
ap.add_argument("--steps", type=int, default=20)
ap.add_argument("--n", type=int, default=10)
a = ap.parse_args()
tmp = tempfile.mkdtemp(prefix="difflet-bench-serve-")
w, h = a.size.split("x")
prof = os.path.join(tmp, "profile.json")
json.dump({"model": os.path.abspath(a.model), "sizes": [a.size], "results_dir": os.path.join(tmp, "r"), "port": 0}, open(prof, "w"))
srv = subprocess.Popen([a.bin, "serve", "--deployment", prof], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
port = int(srv.stdout.readline().split("127.0.0.1:")[1].split()[0])
base = f"http://127.0.0.1:{port}"
while True:
    try:
        if urllib.request.urlopen(base + "/ready", timeout=5).status == 200:
            break
    except Exception:
        time.sleep(0.1)
body = json.dumps({"prompt": "a large red circle in the centre on a blue background", "steps": a.steps, "seed": 1}).encode()
lat, over = [], []
for i in range(a.n + 1):
    t0 = time.perf_counter()
    r = json.loads(urllib.request.urlopen(urllib.request.Request(base + "/v1/images/generations", data=body, method="POST"),
                                          timeout=300).read())
    dt = time.perf_counter() - t0
    if i:  # the first request warms up
        lat.append(dt)
        over.append(dt - r["difflet"]["model_seconds"])
srv.terminate()
srv.wait()
gen = []
cmd = [a.bin, "generate", "--model", a.model, "--prompt", "a large red circle in the centre on a blue background",
       "--width", w, "--height", h, "--steps", str(a.steps), "--seed", "1", "--dtype", "f32", "-o", os.path.join(tmp, "g.png")]
subprocess.run(cmd, capture_output=True)  # warm the program cache
for i in range(a.n):
    t0 = time.perf_counter()
    subprocess.run(cmd, capture_output=True, check=True)
    gen.append(time.perf_counter() - t0)
subprocess.run(["rm", "-rf", tmp])
m_srv, m_gen = statistics.median(lat), statistics.median(gen)
print(f"{a.n} requests, {a.size}, {a.steps} steps: resident server {m_srv:.3f} s, standalone generate {m_gen:.3f} s "
      f"(median) -> resident {m_gen / m_srv:.2f}x faster; server overhead (HTTP + queue + IPC) "
      f"median {1000 * statistics.median(over):.1f} ms")
