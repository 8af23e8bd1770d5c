#!/usr/bin/env python3
"""difflet serve with the DDiT scheduler ("scheduler": "ddit"): the tiny OpenSora
model (tests/data/opensora/a) on a world of a scheduler rank and 2 units, behind the
videos API on a real server on a free loopback port. Several requests at two sizes
at once; every video's frames against the same request made by `difflet generate`
on one rank (decoded, PSNR >= 40 dB: both went through H.264; the frames themselves
are held to 50 dB in tests/test_cli.sh); a request promoted from 1 to 2 units at a step
boundary, against one rank's; the pool in /metrics; a cancel of a running request; a unit rank
killed mid-request: its world restarts, the requests in flight go back to the queue
and complete with the same videos, none lost. Refusals of a bad deployment.

    tests/test_serve_ddit.py path/to/difflet tests/data
"""
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

BIN, DATA = sys.argv[1], sys.argv[2]
OS = os.path.join(DATA, "opensora", "a")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import Server, check, counts, kill_one  # noqa: E402

if not shutil.which("mpirun") or not shutil.which("ffmpeg"):
    print("test_serve_ddit: skipped (needs mpirun and ffmpeg)")
    sys.exit(0)

tmp = tempfile.mkdtemp(prefix="difflet-ddit-")
os.environ["DIFFLET_PROFILES"] = os.path.join(tmp, "profiles.db")
with open(os.path.join(tmp, "dd.csv"), "w") as f:  # B = 2 at both sizes
    f.write("resolution,phase,dop,seconds\n40p,dit,1,0.13\n40p,dit,2,0.08\n40p,vae,1,0.2\n"
            "80p,dit,1,0.39\n80p,dit,2,0.23\n80p,vae,1,1.0\n")
subprocess.run([BIN, "profile", "import", os.path.join(tmp, "dd.csv"), "--name", "dd"], check=True, capture_output=True)
SIZES = ["56x40", "112x80"]
DEP = {"model": OS, "sizes": SIZES, "frames": [34], "scheduler": "ddit", "units": 2, "ddit_profile": "dd",
       "request_timeout_s": 120, "cancel_grace_s": 5.0, "queue_capacity": 32}


def frames_of(mp4):
    """the decoded RGB bytes of an MP4"""
    p = os.path.join(tmp, "decode.mp4")
    with open(p, "wb") as f:
        f.write(mp4)
    return subprocess.run(["ffmpeg", "-v", "error", "-i", p, "-f", "rawvideo", "-pix_fmt", "rgb24", "-"],
                          capture_output=True, check=True).stdout


def psnr(a, b):
    if len(a) != len(b) or not a:
        return -1.0
    if a == b:
        return math.inf
    mse = sum((x - y) ** 2 for x, y in zip(a, b)) / len(a)
    return 10 * math.log10(255 ** 2 / mse)


_refs = {}


def reference(size, seed, steps):
    """the same request by `difflet generate` on one rank, decoded"""
    key = (size, seed, steps)
    if key not in _refs:
        w, h = size.split("x")
        out = os.path.join(tmp, f"ref-{size}-{seed}-{steps}.mp4")
        subprocess.run([BIN, "generate", "--model", OS, "--prompt", "a red fox runs through the snow", "--width", w,
                        "--height", h, "--frames", "34", "--steps", str(steps), "--seed", str(seed), "-o", out],
                       check=True, capture_output=True)
        with open(out, "rb") as f:
            _refs[key] = frames_of(f.read())
    return _refs[key]


def submit(s, i, steps, size=None):
    st, v = s.json("POST", "/v1/videos", {"prompt": "a red fox runs through the snow", "size": size or SIZES[i % 2],
                                          "frames": 34, "steps": steps, "seed": i})
    check(st == 200 and v and v.get("id"), f"submit {i}: {st} {v}")
    return v["id"] if st == 200 else None


def promotions(s):
    st, body, _ = s.req("GET", "/metrics")
    for line in (body.decode() if st == 200 else "").splitlines():
        if line.startswith('difflet_ddit_promotions_total{model="a"}'):
            return int(line.split()[-1])
    return -1


def compare(s, vid, i, steps, what, size=None):
    done = s.wait_done(f"/v1/videos/{vid}", 120)
    check(done and done["status"] == "completed", f"{what} {i}: {done}")
    if not done or done["status"] != "completed":
        return
    st, mp4, _ = s.req("GET", f"/v1/videos/{vid}/content")
    p = psnr(frames_of(mp4), reference(size or SIZES[i % 2], i, steps)) if st == 200 else -1
    check(p >= 40, f"{what} {i}: PSNR {p:.1f} dB against one rank's (want >= 40)")


# ---- several requests at once -------------------------------------------------------------
s = Server(BIN, os.path.join(tmp, "a"), dict(DEP, results_dir=os.path.join(tmp, "a")), suffix="deployment")
r = s.wait_ready(120)
check(r and r["ready"], f"the DDiT world gets ready: {r}")
ids = [submit(s, i, 12) for i in range(6)]
for i, vid in enumerate(ids):
    if vid:
        compare(s, vid, i, 12, "concurrent request")

# the pool in /metrics and /v1/models: the units, every finished request counted by its DoP
st, body, _ = s.req("GET", "/metrics")
text = body.decode() if st == 200 else ""
by_dop = sum(int(line.split()[-1]) for line in text.splitlines() if line.startswith('difflet_ddit_requests_total{model="a"'))
check('difflet_ddit_units{model="a"} 2' in text and by_dop == 6 and "difflet_ddit_promotions_total" in text
      and "difflet_ddit_utilization" in text, f"/metrics: the DDiT pool ({by_dop} requests by DoP): {text[-900:]}")
st, m = s.json("GET", "/v1/models")
d = (m or {}).get("data", [{}])[0].get("ddit")
check(d and d["units"] == 2 and d["busy"] == 0 and d["waiting"] == 0, f"/v1/models: the pool: {d}")

# ---- a promotion: two 112x80 requests (B = 2). The first takes both units; the second
# starts on the unit the first's DiT frees (DoP 1) and, its 150 steps outlasting the
# first's decode, is promoted to both units at a step boundary; its video is one rank's
p0 = promotions(s)
a = submit(s, 10, 12, "112x80")
b = submit(s, 11, 150, "112x80")
if a and b:
    compare(s, a, 10, 12, "before the promotion, request", "112x80")
    compare(s, b, 11, 150, "promoted request", "112x80")
check(promotions(s) > p0, f"a promotion happened ({p0} -> {promotions(s)} promotions)")

# ---- a cancel while it runs -------------------------------------------------------------
vid = submit(s, 7, 200)
t0 = time.time()
while vid and time.time() - t0 < 30:
    v = s.json("GET", f"/v1/videos/{vid}")[1]
    if v and v["status"] == "in_progress" and v.get("progress", 0) > 0:
        break
    time.sleep(0.02)
st, _ = s.json("DELETE", f"/v1/videos/{vid}") if vid else (0, None)
done = s.wait_done(f"/v1/videos/{vid}", 60) if vid else None
check(st == 200 and (done is None or done.get("status") != "completed"), f"cancel by delete: {st} {done}")

# ---- a unit killed mid-request ------------------------------------------------------------
ids = [submit(s, i, 30) for i in range(4)]
t0 = time.time()
while time.time() - t0 < 30:  # something is running
    if any((s.json("GET", f"/v1/videos/{v}")[1] or {}).get("status") == "in_progress" for v in ids if v):
        break
    time.sleep(0.02)
pid = s.wait_ready(10)["model_pid"]
ranks = subprocess.run(["ps", "--ppid", str(pid), "-o", "pid="], capture_output=True, text=True).stdout.split()
check(len(ranks) == 3, f"the world has 3 ranks: {ranks}")
if ranks:
    kill_one(int(ranks[-1]), signal.SIGKILL)
t0 = time.time()
new = None
while time.time() - t0 < 60:
    r = s.json("GET", "/ready")[1]
    if r and r.get("ready") and r.get("model_pid") != pid:
        new = r["model_pid"]
        break
    time.sleep(0.05)
check(new, "a new DDiT world after the kill")
# the killed mpirun could not remove its Open MPI session directory: the supervisor does
sess = os.path.join(os.environ.get("TMPDIR") or "/tmp", "ompi.%s.%d" % (socket.gethostname().split(".")[0], os.getuid()),
                    "pid.%d" % pid)
check(not os.path.exists(sess), f"the killed world's Open MPI session directory is swept: {sess}")
for i, vid in enumerate(ids):
    if vid:
        compare(s, vid, i, 30, "after the kill, request")
s.stop()

# ---- refusals -----------------------------------------------------------------------------
for bad, why in [({"units": 3}, "units 3"), ({"ddit_profile": None}, "no profile"), ({"scheduler": "fifo"}, "scheduler fifo"),
                 ({"model": os.path.join(DATA, "wan", "a"), "sizes": ["48x32"], "frames": [9]}, "a model that is not resumable"),
                 ({"replicas": 2}, "replicas")]:
    dep = dict(DEP, results_dir=os.path.join(tmp, "bad"))
    dep.update(bad)
    dep = {k: v for k, v in dep.items() if v is not None}
    path = os.path.join(tmp, "bad.json")
    with open(path, "w") as f:
        json.dump(dep, f)
    p = subprocess.run([BIN, "serve", "--deployment", path], capture_output=True, text=True, timeout=60)
    check(p.returncode != 0 and ("ddit" in p.stderr.lower() or "scheduler" in p.stderr.lower()),
          f"refused: {why}: {p.returncode} {p.stderr}")

shutil.rmtree(tmp, ignore_errors=True)
passed, failed = counts()
print(f"test_serve_ddit: {passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
