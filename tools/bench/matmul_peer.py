"""Peer measurement for `difflet bench kernels`: torch's CPU matmul (its bundled
oneDNN / MKL) on the shapes difflet times, the same thread count.

    python matmul_peer.py M THREADS REPS K:N [K:N ...]
Prints one JSON line: {"torch": version, "gflops": {"f32 K N": best GFLOP/s, "bf16 K N": ...}}.
y = x @ W^T with W [N, K] as nn.Linear holds it (torch may pre-pack nothing: this is
what a diffusers pipeline gets).
"""
import json
import sys
import time

import torch


def main():
    m, threads, reps = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    torch.set_num_threads(threads)
    out = {}
    with torch.inference_mode():
        for dt, name in ((torch.float32, "f32"), (torch.bfloat16, "bf16")):
            for kn in sys.argv[4:]:
                k, n = (int(v) for v in kn.split(":"))
                x = (torch.rand(m, k) * 2 - 1).to(dt)
                w = ((torch.rand(n, k) * 2 - 1) * 0.05).to(dt)
                best = float("inf")
                for i in range(reps + 1):
                    t0 = time.perf_counter()
                    torch.nn.functional.linear(x, w)
                    t = time.perf_counter() - t0
                    if i > 0:
                        best = min(best, t)
                out[f"{name} {k} {n}"] = 2.0 * m * k * n / best * 1e-9
    print(json.dumps({"torch": torch.__version__, "gflops": out}))


if __name__ == "__main__":
    main()
