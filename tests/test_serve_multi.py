#!/usr/bin/env python3
"""One `difflet serve` serving two models at once: the image model difflet-tiny (a
FluxPipeline) and the video model difflet-tiny-video (a WanPipeline), against a real
server on a free loopback port (standard library, ffprobe, and chromium when there is
one). Covers the deployment's `models` list and repeated `--model`, /v1/models listing
both, `model` picking the model (and its absence picking the first model of the
route's kind), a wrong-kind request refused with a 400 naming the right route, an
unknown model a 404, jobs recording their model, one model process per model loading
only its own programs, per-model queues (one model's full queue is a 429 for it alone;
the other keeps serving), per-model deadlines, per-model readiness and metrics, a
killed model process of either model replaced with byte-identical results afterwards,
an API crash with both models' jobs queued (each finishes once, on its model), a job
store from before jobs recorded their model, and bad deployments.

    tests/test_serve_multi.py path/to/difflet models/difflet-tiny models/difflet-tiny-video
"""
import base64
import json
import os
import shutil
import signal
import sqlite3
import struct
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

BIN, IMAGE_SRC, VIDEO_SRC = sys.argv[1], sys.argv[2], sys.argv[3]
IMG, VID = "difflet-tiny", "difflet-tiny-video"
T0 = time.time()



sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import Server as _Server, check, counts, kill_one  # noqa: E402


tmp = tempfile.mkdtemp(prefix="difflet-serve-multi-")
os.environ["DIFFLET_CACHE"] = os.path.join(tmp, "cache")
# The video model as a copy: a replacement model process must load the very weights
# its predecessor had for byte-identical results, and the folder may be rewritten
# while this runs (its training writes checkpoints by replacing it).
VIDEO = os.path.join(tmp, "models", VID)
for _ in range(100):
    try:
        shutil.copytree(VIDEO_SRC, VIDEO)
        break
    except (OSError, shutil.Error):
        shutil.rmtree(VIDEO, ignore_errors=True)
        time.sleep(0.1)
if not os.path.exists(os.path.join(VIDEO, "model_index.json")):
    print(f"test_serve_multi: no video model at {VIDEO_SRC}")
    sys.exit(1)
IMAGE = os.path.abspath(IMAGE_SRC)


class Server(_Server):
    def __init__(self, results, argv=None, video_timeout=6, **deployment):
        """the image model with the server's settings; the video model with its own
        queue capacity (2) and deadline (video_timeout)"""
        dep = {"models": [{"model": IMAGE, "sizes": ["64x64"]},
                          {"model": VIDEO, "frames": [9], "queue_capacity": 2, "request_timeout_s": video_timeout}],
               "results_dir": results, "port": 0, "request_timeout_s": 120, "cancel_grace_s": 2.0,
               "queue_capacity": 8, "max_steps": 3000}
        dep.update(deployment)
        super().__init__(BIN, results, dep, argv=argv, suffix="deployment", stop_wait=15)

    def req(self, method, path, body=None, timeout=120, **kw):
        return super().req(method, path, body, timeout=timeout, **kw)

    def wait_ready(self, timeout=120):
        return super().wait_ready(timeout)

    def wait(self, path, timeout=120):
        """a job's or video's state once it is no longer queued or running"""
        return self.wait_done(path, timeout)

    def wait_status(self, path, status, timeout=60):
        t0 = time.time()
        while time.time() - t0 < timeout:
            j = self.json("GET", path)[1]
            if j and j["status"] == status:
                return j
            time.sleep(0.02)
        return None

    def image(self, body):
        st, j = self.json("POST", "/v1/images/generations", body)
        return st, base64.b64decode(j["data"][0]["b64_json"]) if st == 200 else j

    def video(self, body):
        """the finished video object and its MP4 (None when it did not complete)"""
        st, v = self.json("POST", "/v1/videos", body)
        if st != 200:
            return v, None
        v = self.wait(f"/v1/videos/{v['id']}")
        if not v or v["status"] != "completed":
            return v, None
        return v, self.req("GET", f"/v1/videos/{v['id']}/content")[1]

    def metric(self, name):
        text = self.req("GET", "/metrics")[1].decode()
        for line in text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[-1])
        return None


def png_size(data):
    return struct.unpack(">II", data[16:24]) if data[:8] == b"\x89PNG\r\n\x1a\n" else None


def probe(data):
    """codec, width, height, r_frame_rate, frames counted by decoding"""
    f = os.path.join(tmp, "probe.mp4")
    with open(f, "wb") as fh:
        fh.write(data)
    pr = subprocess.run(["ffprobe", "-v", "error", "-count_frames", "-select_streams", "v:0", "-show_entries",
                         "stream=codec_name,width,height,r_frame_rate,nb_read_frames", "-of", "csv=p=0", f],
                        capture_output=True, text=True)
    return pr.stdout.strip()


def pids(srv, model):
    r = srv.json("GET", "/ready")[1] or {}
    return next((m["model_pids"] for m in r.get("models", []) if m["id"] == model), [])


def mapped_programs(pid):
    """the program weight files a process has mapped (from the test's program cache)"""
    with open(f"/proc/{pid}/maps") as f:
        return {l.split()[-1] for l in f if os.environ["DIFFLET_CACHE"] in l and l.rstrip().endswith(".bin")}


A_PROMPT = "a large red circle in the centre on a blue background"
V_PROMPT = "a red circle moving from left to right on a blue background"

# ---- both models behind one server --------------------------------------------------------
res = os.path.join(tmp, "r1")
s = Server(res)
r = s.wait_ready()
check(r and r["ready"] and [m["id"] for m in r["models"]] == [IMG, VID] and all(m["ready"] for m in r["models"])
      and len(r["model_pids"]) == 2, f"/ready: both models ready, each with its model process: {r}")
st, m = s.json("GET", "/v1/models")
data = m["data"] if st == 200 else []
check([d["id"] for d in data] == [IMG, VID] and [d["output"] for d in data] == ["image", "video"],
      f"/v1/models lists both, the default first: {m}")
check(len(data) == 2 and data[0]["sizes"] == ["64x64"] and "frames" not in data[0] and data[1]["sizes"] == ["64x64"]
      and data[1]["frames"] == [9] and data[1]["fps"] == 8 and data[1]["seconds"] == ["1"],
      f"each model's own sizes, frames and fps (the video model's difflet.json: 8 fps): {data}")
st, one = s.json("GET", f"/v1/models/{VID}")
check(st == 200 and one["id"] == VID and one["output"] == "video", f"GET /v1/models/{VID}: {st} {one}")
st, e = s.json("GET", "/v1/models/nope")
check(st == 404 and e["error"]["code"] == "model_not_found", f"GET /v1/models/nope: {st} {e}")

# ---- `model` picks the model --------------------------------------------------------------
st, png = s.image({"prompt": A_PROMPT, "steps": 4, "seed": 5})
check(st == 200 and png_size(png) == (64, 64), f"an image without `model`: the first model's PNG, 64x64: {st}")
st, png2 = s.image({"prompt": A_PROMPT, "steps": 4, "seed": 5, "model": IMG})
check(st == 200 and png2 == png, "`model` naming the image model: the same image")
v, mp4 = s.video({"prompt": V_PROMPT, "model": VID, "steps": 4, "seed": 3})
check(mp4 and mp4[4:8] == b"ftyp" and v["model"] == VID and v["frames"] == 9 and v["fps"] == 8,
      f"a video naming the video model: {v}")
check(mp4 and probe(mp4) == "h264,64,64,8/1,9", f"ffprobe: H.264, 64x64, 8 fps, 9 frames: {mp4 and probe(mp4)}")
v2, mp4b = s.video({"prompt": V_PROMPT, "steps": 4, "seed": 3})
check(mp4b == mp4 and v2["model"] == VID, f"a video without `model` goes to the video model: {v2}")
st, j = s.json("POST", "/v1/jobs", {"prompt": A_PROMPT, "steps": 4, "seed": 5, "model": IMG})
j = s.wait(f"/v1/jobs/{j['id']}") if st == 202 else j
check(j and j["status"] == "completed" and j["model"] == IMG and j["kind"] == "image",
      f"a job records its model: {j}")
st, j = s.json("GET", f"/v1/jobs/{v['id'][6:]}") if v else (0, None)
check(st == 200 and j["model"] == VID and j["kind"] == "video", f"a video's job records its model: {j}")
st, c, h = s.req("GET", f"/v1/jobs/{v['id'][6:]}/content") if v else (0, b"", {})
check(st == 200 and c == mp4 and h.get("Content-Type") == "video/mp4", "the job route serves the video model's MP4")

# ---- the wrong kind of model, and unknown ones --------------------------------------------------
for route in ("/v1/images/generations", "/v1/jobs"):
    st, e = s.json("POST", route, {"prompt": "x", "model": VID})
    e = (e or {}).get("error", {})
    check(st == 400 and e.get("param") == "model" and f"`{VID}` makes videos" in e.get("message", "")
          and "POST /v1/videos" in e.get("message", ""), f"{route} naming the video model: a clear 400: {st} {e}")
st, e = s.json("POST", "/v1/videos", {"prompt": "x", "model": IMG})
e = (e or {}).get("error", {})
check(st == 400 and e.get("param") == "model" and f"`{IMG}` makes images" in e.get("message", "")
      and "/v1/images/generations" in e.get("message", ""), f"/v1/videos naming the image model: a clear 400: {st} {e}")
for route in ("/v1/images/generations", "/v1/jobs", "/v1/videos"):
    st, e = s.json("POST", route, {"prompt": "x", "model": "dall-e-3"})
    e = (e or {}).get("error", {})
    check(st == 404 and e.get("code") == "model_not_found" and f"`{IMG}`, `{VID}`" in e.get("message", ""),
          f"{route} naming an unknown model: 404 listing the served ones: {st} {e}")
st, e = s.json("POST", "/v1/images/generations", {"prompt": "x", "model": IMG, "size": "48x32"})
check(st == 400 and e["error"]["param"] == "size" and "64x64" in e["error"]["message"], f"the model's own sizes: {st} {e}")
st, e = s.json("POST", "/v1/videos", {"prompt": "x", "model": VID, "frames": 17})
check(st == 400 and e["error"]["param"] == "frames", f"the video model's own frame counts: {st} {e}")

# ---- per-model queues, deadlines and metrics ---------------------------------------------------
st, slow = s.json("POST", "/v1/videos", {"prompt": "slow", "model": VID, "steps": 2000, "seed": 1})
running = s.wait_status(f"/v1/videos/{slow['id']}", "in_progress") if st == 200 else None
queued = [s.json("POST", "/v1/videos", {"prompt": f"queued {i}", "steps": 4, "seed": i})[1] for i in range(2)]
st, full = s.json("POST", "/v1/videos", {"prompt": "one too many", "steps": 4})
check(running and all(q.get("status") == "queued" for q in queued) and st == 429 and VID in full["error"]["message"],
      f"the video model's queue (2) is full: 429 naming it: {st} {full}")
text = s.req("GET", "/metrics")[1].decode()
want = [f'difflet_model_queue_depth{{model="{VID}"}} 2', f'difflet_model_queue_depth{{model="{IMG}"}} 0',
        f'difflet_model_inflight{{model="{VID}"}} 1', f'difflet_model_inflight{{model="{IMG}"}} 0',
        f'difflet_model_ready{{model="{IMG}"}} 1', f'difflet_model_ready{{model="{VID}"}} 1',
        "difflet_queue_depth 2", "difflet_inflight 1", "difflet_ready 1"]
check(all(w in text for w in want), f"metrics per model: {[w for w in want if w not in text]}")
st, png3 = s.image({"prompt": A_PROMPT, "steps": 4, "seed": 5})
check(st == 200 and png3 == png, "the image model serves while the video model is busy and its queue full")
for q in queued:
    check(s.json("DELETE", f"/v1/videos/{q['id']}")[0] == 200, "a queued video is deleted")
end = s.wait(f"/v1/videos/{slow['id']}", timeout=60)
check(end and end["status"] == "failed" and end["error"]["code"] == "timeout" and "after 6 s" in end["error"]["message"],
      f"the video model's own deadline (6 s) ends the slow video: {end}")

# ---- a killed model process: only its model recovers, and gives the same bytes -------------------
for victim, other in ((VID, IMG), (IMG, VID)):
    before = {k: pids(s, k)[0] for k in (IMG, VID)}
    body = {"prompt": f"dies {victim}", "steps": 2000, "seed": 1}
    st, x = s.json("POST", "/v1/videos" if victim == VID else "/v1/jobs", dict(body, model=victim))
    path = f"/v1/videos/{x['id']}" if victim == VID else f"/v1/jobs/{x['id']}"
    s.wait_status(path, "in_progress")
    t0 = time.time()  # the victim may still be coming back from the deadline's kill above
    while time.time() - t0 < 120 and not (pids(s, victim) and pids(s, victim)[0] > 1):
        time.sleep(0.05)
    kill_one((pids(s, victim) or [-1])[0], signal.SIGKILL)
    seen = None
    t0 = time.time()
    while time.time() - t0 < 5 and not seen:
        st, rd = s.json("GET", "/ready")
        if st == 503:
            seen = rd
    states = {m["id"]: m["ready"] for m in seen["models"]} if seen else {}
    check(seen and states == {victim: False, other: True} and f"`{victim}`" in seen["reason"]
          and f"`{other}`" not in seen["reason"], f"/ready while {victim} recovers: 503 naming it alone: {seen}")
    x = s.wait(path, timeout=30)
    err = x and (x.get("error") or {})
    err = err.get("message") if isinstance(err, dict) else err
    check(x and x["status"] == "failed" and "exited unexpectedly" in (err or ""), f"its running job fails at once: {x}")
    check(s.wait_ready(60) is not None and pids(s, victim)[0] != before[victim] and pids(s, other)[0] == before[other],
          f"{victim}'s model process is replaced, {other}'s untouched")
    if victim == VID:
        v3, again = s.video({"prompt": V_PROMPT, "model": VID, "steps": 4, "seed": 3})
        check(again == mp4, "after the video model process is replaced: a byte-identical MP4")
    else:
        st, again = s.image({"prompt": A_PROMPT, "model": IMG, "steps": 4, "seed": 5})
        check(st == 200 and again == png, "after the image model process is replaced: a byte-identical PNG")
# every model process loads only its own model: the program files each maps (the replacements
# load them from the cache, a file per program) are its own
maps = {k: mapped_programs(pids(s, k)[0]) for k in (IMG, VID)}
check(len(maps[IMG]) >= 3 and len(maps[VID]) >= 3 and not maps[IMG] & maps[VID],
      f"two model processes, disjoint programs: {sorted(maps[IMG])} / {sorted(maps[VID])}")
text = s.req("GET", "/metrics")[1].decode()
check(f'difflet_model_process_restarts_total{{model="{VID}"}} 1' in text
      and f'difflet_model_process_restarts_total{{model="{IMG}"}} 1' in text and "difflet_model_restarts_total 2" in text,
      "restarts are counted per model")

# the web page: a model picker; the video model chosen makes a video and plays it
chrome = next((c for c in ("chromium", "chromium-browser", "google-chrome") if shutil.which(c)), None)
st, page, _ = s.req("GET", "/")
check(st == 200 and b"q_model" in page, "the page has a model picker")
if chrome:
    dom = subprocess.run([chrome, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom", "--virtual-time-budget=30000",
                          f"http://127.0.0.1:{s.port}/?autorun=1&model={VID}"], capture_output=True, text=True,
                         timeout=120).stdout
    check('src="/v1/videos/video_' in dom and "completed" in dom, f"the page made a video with the picked model: {dom[-400:]}")
else:
    print("note: no chromium; the page is checked by its HTML only")

# ---- an API crash with both models' jobs queued: each finishes once, on its model ------------------
# (a video deadline that outlasts the restart: a job keeps the deadline it was accepted with)
s.stop()
s = Server(res, video_timeout=120)
s.wait_ready()
# a cancel reaches the running job of its model only
st, slow_img = s.json("POST", "/v1/jobs", {"prompt": "cancel me", "model": IMG, "steps": 3000, "seed": 2})
st, short = s.json("POST", "/v1/videos", {"prompt": V_PROMPT, "model": VID, "steps": 20, "seed": 2, "guidance_scale": 1})
s.wait_status(f"/v1/jobs/{slow_img['id']}", "in_progress")
s.json("POST", f"/v1/jobs/{slow_img['id']}/cancel")
ends = s.wait(f"/v1/jobs/{slow_img['id']}", timeout=30), s.wait(f"/v1/videos/{short['id']}", timeout=60)
check(ends[0] and ends[0]["status"] == "cancelled" and ends[1] and ends[1]["status"] == "completed",
      f"cancelling the image job leaves the running video be: {ends}")
holds = [s.json("POST", "/v1/videos", {"prompt": "interrupted", "model": VID, "steps": 60, "seed": 4, "guidance_scale": 1})[1],
         s.json("POST", "/v1/jobs", {"prompt": "interrupted", "model": IMG, "steps": 300, "seed": 4})[1]]
s.wait_status(f"/v1/videos/{holds[0]['id']}", "in_progress")
s.wait_status(f"/v1/jobs/{holds[1]['id']}", "in_progress")
vids = [holds[0]["id"], s.json("POST", "/v1/videos", {"prompt": "after", "steps": 5, "seed": 6, "guidance_scale": 1})[1]["id"]]
jobs = [holds[1]["id"]] + [s.json("POST", "/v1/jobs", {"prompt": f"crash {i}", "steps": 30 + i, "seed": i})[1]["id"]
                           for i in range(3)]
s.stop(signal.SIGKILL)  # both models' model processes are running a job, more are queued behind them
s = Server(res, video_timeout=120)
s.wait_ready()
ends = [s.wait(f"/v1/videos/{i}") for i in vids] + [s.wait(f"/v1/jobs/{i}") for i in jobs]
check(all(e and e["status"] == "completed" for e in ends), f"every accepted job completes after the restart: {ends}")
models = [s.json("GET", f"/v1/jobs/{i[6:]}")[1]["model"] for i in vids] + [s.json("GET", f"/v1/jobs/{i}")[1]["model"] for i in jobs]
check(models == [VID] * 2 + [IMG] * 4, f"each job ran on its model: {models}")
files = {os.path.splitext(f)[0]: os.path.splitext(f)[1] for f in os.listdir(res)}
check([files.get(i[6:]) for i in vids] == [".mp4"] * 2 and [files.get(i) for i in jobs] == [".png"] * 4,
      f"an MP4 per video, a PNG per image: {files}")
# nothing ran twice: since the restart the denoiser ran each requeued job's steps once (guidance 1
# for the videos and the tiny FLUX's distilled guidance: one call per step)
want = 60 + 5 + 300 + 30 + 31 + 32
calls = s.metric('difflet_denoise_steps_total{cached="false"}')
check(calls == want, f"each requeued job ran once: {calls} denoiser calls, want {want}")
s.stop()

# ---- a store from before jobs recorded their model -------------------------------------------------
old = os.path.join(tmp, "old")
os.makedirs(old)
db = sqlite3.connect(os.path.join(old, "jobs.sqlite"))
db.executescript("CREATE TABLE jobs (id TEXT PRIMARY KEY, status TEXT NOT NULL, request TEXT NOT NULL, created REAL,"
                 " started REAL, finished REAL, deadline REAL, error TEXT, result TEXT, step INTEGER DEFAULT 0,"
                 " steps INTEGER DEFAULT 0, cached INTEGER DEFAULT 0, model_s REAL DEFAULT 0,"
                 " cancel_requested INTEGER DEFAULT 0, kind TEXT DEFAULT 'image');"
                 "CREATE INDEX jobs_status ON jobs(status, created);")
now = time.time()
img_req = {"prompt": A_PROMPT, "width": 64, "height": 64, "steps": 4, "guidance_scale": 3.5, "true_cfg_scale": 1,
           "output_format": "png", "output_compression": 100, "seed": 5}
with open(os.path.join(VIDEO_SRC, "difflet.json")) as f:  # the stored request holds the model's default, as the server writes it
    vid_guidance = json.load(f)["defaults"]["guidance_scale"]
vid_req = {"prompt": V_PROMPT, "width": 64, "height": 64, "frames": 9, "fps": 8, "steps": 4, "guidance_scale": vid_guidance,
           "true_cfg_scale": 1, "output_format": "mp4", "output_compression": 100, "seed": 3}
rows = [("00000000000000a1", "queued", img_req, "image"), ("00000000000000a2", "queued", vid_req, "video"),
        ("00000000000000a3", "completed", img_req, "image")]
for jid, status, rq, kind in rows:
    db.execute("INSERT INTO jobs (id, status, request, created, deadline, kind, finished) VALUES (?, ?, ?, ?, ?, ?, ?)",
               (jid, status, json.dumps(rq), now, now + 600, kind, now if status == "completed" else None))
db.commit()
db.close()
s = Server(old)
s.wait_ready()
a1, a2 = s.wait("/v1/jobs/00000000000000a1"), s.wait("/v1/videos/video_00000000000000a2")
st, c, _ = s.req("GET", "/v1/jobs/00000000000000a1/content")
check(a1 and a1["status"] == "completed" and a1["model"] == IMG and c == png, f"an old queued image job runs on the image model: {a1}")
st, c, _ = s.req("GET", "/v1/videos/video_00000000000000a2/content")
check(a2 and a2["status"] == "completed" and a2["model"] == VID and c == mp4, f"an old queued video runs on the video model: {a2}")
st, a3 = s.json("GET", "/v1/jobs/00000000000000a3")
check(st == 200 and a3["status"] == "completed" and "model" not in a3, f"an old finished job is still readable: {st} {a3}")
s.stop()
db = sqlite3.connect(os.path.join(old, "jobs.sqlite"))
db.execute("INSERT INTO jobs (id, status, request, created, deadline, kind, model) VALUES (?, 'queued', ?, ?, ?, 'image', 'gone')",
           ("00000000000000b1", json.dumps(img_req), now, time.time() + 600))
db.commit()
db.close()
s = Server(old)
s.wait_ready()
st, b1 = s.json("GET", "/v1/jobs/00000000000000b1")
check(st == 200 and b1["status"] == "failed" and "not served" in b1.get("error", "") and "`gone`" in b1.get("error", ""),
      f"a queued job for a model no longer served fails, saying so: {b1}")
s.stop()

# ---- the command line: --model repeated, each model's flags after it; the video model first ------------
s = Server(None, argv=[BIN, "serve", "--model", VIDEO, "--frames", "5,9", "--fps", "4", "--model", IMAGE, "--sizes", "64x64",
                       "--port", "0", "--results", os.path.join(tmp, "cli")])
st, m = s.json("GET", "/v1/models")
d = {x["id"]: x for x in m["data"]} if st == 200 else {}
check(list(d) == [VID, IMG] and d[IMG]["sizes"] == ["64x64"] and d[VID]["frames"] == [5, 9] and d[VID]["fps"] == 4,
      f"serve --model A --frames .. --fps .. --model B --sizes ..: {m}")
s.wait_ready()
st, png4 = s.image({"prompt": A_PROMPT, "steps": 4, "seed": 5})
check(st == 200 and png4 == png, "an image request without `model` goes to the first image model, not the first model")
s.stop()

# ---- int8 programs: the image model in int8 (W8A8), the video model weight-only ------------------------
s = Server(os.path.join(tmp, "int8"), models=[{"model": IMAGE, "sizes": ["64x64"], "dtype": "int8"},
                                              {"model": VIDEO, "frames": [9], "dtype": "int8-wo"}])
s.wait_ready()
st, png8 = s.image({"prompt": A_PROMPT, "steps": 4, "seed": 5})
check(st == 200 and png8[:8] == b"\x89PNG\r\n\x1a\n" and png8 != png,
      f"an int8 deployment draws (a picture of its own, not the f32 one): {st}")
st, png8b = s.image({"prompt": A_PROMPT, "steps": 4, "seed": 5})
check(st == 200 and png8b == png8, "int8: the same request, the same bytes")
v8, mp48 = s.video({"prompt": V_PROMPT, "model": VID, "steps": 4, "seed": 3})
check(v8 and v8.get("status") == "completed" and mp48 and mp48 != mp4, f"an int8-wo video model serves: {v8}")
s.stop()

# ---- bad deployments are refused before anything starts ---------------------------------------------
bad = [({"model": IMAGE, "models": [IMAGE]}, "goes in each model's entry"),
       ({"models": [IMAGE, IMAGE]}, "two served models are called `difflet-tiny`"),
       ({"models": [{"model": IMAGE, "port": 9}]}, "the server's"),
       ({"models": [{"sizes": ["64x64"]}]}, "needs `model`"),
       ({"models": []}, "a list of 1 to 8 models"),
       ({"models": [IMAGE, {"model": VIDEO, "frames": [9], "bogus": 1}]}, "`bogus` is not a field"),
       ({"models": [{"model": IMAGE, "frames": [9]}]}, "makes images"),
       ({"models": [{"model": IMAGE, "dtype": "int4"}]}, "int8 or int8-wo")]
for k, (dep, msg) in enumerate(bad):
    path = os.path.join(tmp, f"bad{k}.json")
    with open(path, "w") as f:
        json.dump(dict(dep, port=0, results_dir=os.path.join(tmp, f"bad{k}")), f)
    p = subprocess.run([BIN, "serve", "--deployment", path], capture_output=True, text=True, timeout=60)
    check(p.returncode == 2 and msg in p.stderr, f"refused: {dep}: {p.returncode} {p.stderr.strip()}")
p = subprocess.run([BIN, "serve", "--model", IMAGE, "--model", IMAGE, "--port", "0", "--results", os.path.join(tmp, "dup")],
                   capture_output=True, text=True, timeout=60)
check(p.returncode == 2 and "two served models" in p.stderr, f"the same model twice on the command line: {p.stderr.strip()}")

shutil.rmtree(tmp, ignore_errors=True)
passed, failed = counts()
print(f"test_serve_multi: {passed} passed, {failed} failed ({time.time() - T0:.0f} s)")
sys.exit(1 if failed else 0)
