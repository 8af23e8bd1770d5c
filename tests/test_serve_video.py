#!/usr/bin/env python3
"""difflet serve with a video model (the tiny Wan 2.1 test model) behind OpenAI's
videos API, against a real server on a free loopback port (standard library only;
the part that drives OpenAI's own SDK runs when `openai` is importable, e.g. under
tools/venv/bin/python, and is skipped with a note otherwise). Covers POST/GET/list/
DELETE /v1/videos, the MP4 content read back by ffprobe (codec, size, frames, fps),
seconds -> frames, progress events, cancel by delete, forms as the SDK sends them,
an API restart keeping finished videos and finishing queued ones, bad input (400
with `param`), image/video requests to the wrong kind of model, and Qwen-Image (the
other image family) through the images API.

    tests/test_serve_video.py path/to/difflet tests/data
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

BIN, DATA = sys.argv[1], sys.argv[2]
WAN = os.path.join(DATA, "wan", "a")
FLUX = os.path.join(DATA, "flux", "dev")
T0 = time.time()
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import Server as _Server, check, counts  # noqa: E402


class Server(_Server):
    def __init__(self, results, argv=None, **deployment):
        dep = {"model": WAN, "sizes": ["48x32"], "frames": [5, 8], "max_sequence_length": 16, "results_dir": results,
               "port": 0, "request_timeout_s": 60, "cancel_grace_s": 1.0, "queue_capacity": 8, "max_steps": 400}
        dep.update(deployment)
        dep = {k: v for k, v in dep.items() if v is not None}  # None: leave the key out
        super().__init__(BIN, results, dep, argv=argv, suffix="deployment")

    def wait_video(self, vid, timeout=60):
        return self.wait_done(f"/v1/videos/{vid}", timeout)

    def wait_running(self, vid, timeout=30):
        t0 = time.time()
        while time.time() - t0 < timeout:
            v = self.json("GET", f"/v1/videos/{vid}")[1]
            if v and v["status"] != "queued":
                return v
            time.sleep(0.02)
        return None


def probe(data):
    """codec, width, height, r_frame_rate, frames counted by decoding"""
    f = os.path.join(tmp, "probe.mp4")
    with open(f, "wb") as fh:
        fh.write(data)
    pr = subprocess.run(["ffprobe", "-v", "error", "-count_frames", "-select_streams", "v:0", "-show_entries",
                         "stream=codec_name,width,height,r_frame_rate,nb_read_frames", "-of", "csv=p=0", f],
                        capture_output=True, text=True)
    return pr.stdout.strip()


def multipart(fields, files=()):
    b = "difflet-test-boundary"
    out = b""
    for k, v in fields.items():
        out += f"--{b}\r\nContent-Disposition: form-data; name=\"{k}\"\r\n\r\n{v}\r\n".encode()
    for k, name, data in files:
        out += (f"--{b}\r\nContent-Disposition: form-data; name=\"{k}\"; filename=\"{name}\"\r\n"
                f"Content-Type: application/octet-stream\r\n\r\n").encode() + data + b"\r\n"
    return out + f"--{b}--\r\n".encode(), {"Content-Type": f"multipart/form-data; boundary={b}"}


tmp = tempfile.mkdtemp(prefix="difflet-serve-video-")
os.environ["DIFFLET_CACHE"] = os.path.join(tmp, "cache")
res = os.path.join(tmp, "v1")

# ---- the model and the page ---------------------------------------------------------
s = Server(res)
check(s.wait_ready(), "the Wan model process gets ready")
st, m = s.json("GET", "/v1/models")
d = m["data"][0] if st == 200 else {}
check(d.get("output") == "video" and d.get("frames") == [5, 9] and d.get("seconds") == ["0.25", "0.5"] and d.get("fps") == 16,
      f"the model object says video, frames (8 rounded to 9 as WanPipeline rounds), seconds at 16 fps: {m}")
st, page, _ = s.req("GET", "/")
check(st == 200 and b"/v1/videos" in page and b"<video" in page, "the page knows videos")

# ---- create, poll, content ------------------------------------------------------------
st, v = s.json("POST", "/v1/videos", {"prompt": "a red ball rolling", "seconds": "0.5", "size": "48x32", "steps": 2,
                                      "seed": 7, "model": "a"})
want_keys = {"id", "object", "created_at", "status", "model", "progress", "seconds", "size", "completed_at", "error"}
check(st == 200 and want_keys <= set(v) and v["id"].startswith("video_") and v["object"] == "video"
      and v["status"] in ("queued", "in_progress") and v["progress"] == 0 and v["seconds"] == "0.5" and v["size"] == "48x32"
      and v["model"] == "a" and isinstance(v["created_at"], int) and v["completed_at"] is None and v["error"] is None
      and v["frames"] == 9 and v["fps"] == 16, f"POST /v1/videos gives OpenAI's video object: {st} {v}")
first = v["id"] if st == 200 else "video_0000000000000000"
done = s.wait_video(first)
check(done and done["status"] == "completed" and done["progress"] == 100 and isinstance(done["completed_at"], int)
      and done["completed_at"] >= done["created_at"] and done["error"] is None and done["expires_at"] > done["completed_at"],
      f"GET /v1/videos/ID: completed with completed_at: {done}")
st, mp4, h = s.req("GET", f"/v1/videos/{first}/content")
check(st == 200 and h.get("Content-Type") == "video/mp4" and mp4[4:8] == b"ftyp", f"content is an MP4: {st} {h.get('Content-Type')}")
check(probe(mp4) == "h264,48,32,16/1,9", f"ffprobe: H.264, 48x32, 16 fps, 9 frames: {probe(mp4)}")
st, again, _ = s.req("GET", f"/v1/videos/{first}/content?variant=video")
check(st == 200 and again == mp4, "?variant=video gives the same MP4")
st, e = s.json("GET", f"/v1/videos/{first}/content?variant=thumbnail")
check(st == 400 and e["error"]["param"] == "variant", f"no thumbnails: {st} {e}")
hexid = first[6:]
st, j = s.json("GET", f"/v1/jobs/{hexid}")
check(st == 200 and j.get("kind") == "video" and j["status"] == "completed", f"the video is a job too: {j}")
st, b, h = s.req("GET", f"/v1/jobs/{hexid}/content")
check(st == 200 and b == mp4 and h.get("Content-Type") == "video/mp4", "the job's content route serves the MP4")

# seconds as a number, frames and fps directly, a count rounded as the pipeline rounds it
for body, frames, fps, secs in (({"seconds": 0.25}, 5, 16, "0.25"), ({"frames": 5, "fps": 8}, 5, 8, "0.5"),
                                ({"frames": 6}, 5, 16, "0.25"), ({}, 5, 16, "0.25")):
    st, v = s.json("POST", "/v1/videos", dict(body, prompt="x", steps=2, seed=1))
    v = s.wait_video(v["id"]) if st == 200 else v
    st2, data, _ = s.req("GET", f"/v1/videos/{v['id']}/content") if v and "id" in v else (0, b"", {})
    check(v and v["status"] == "completed" and v["frames"] == frames and v["fps"] == fps and v["seconds"] == secs
          and probe(data) == f"h264,48,32,{fps}/1,{frames}", f"{body}: {frames} frames at {fps} fps: {v} {probe(data)}")

# ---- progress events ------------------------------------------------------------------
st, v = s.json("POST", "/v1/videos", {"prompt": "events", "seconds": "0.5", "steps": 40, "seed": 2})
lines = urllib.request.urlopen(f"http://127.0.0.1:{s.port}/v1/videos/{v['id']}/events", timeout=60).read().decode()
evs = [json.loads(l[6:]) for l in lines.splitlines() if l.startswith("data: ")]
prog = [e["progress"] for e in evs if e.get("status") == "in_progress"]
check(evs and evs[-1]["status"] == "completed" and evs[-1]["progress"] == 100 and evs[-1]["id"] == v["id"]
      and "event: completed" in lines, f"events end with the completed video: {lines[-300:]}")
check(len(prog) >= 20 and prog == sorted(prog) and all(isinstance(p, int) and 0 <= p <= 99 for p in prog),
      f"integer progress events while it runs ({len(prog)}): {prog[:5]}...{prog[-3:]}")
lines = urllib.request.urlopen(f"http://127.0.0.1:{s.port}/v1/jobs/{v['id'][6:]}/events", timeout=30).read().decode()
check("event: completed" in lines, "the job's event stream serves a video job too")

# ---- not ready yet, delete while queued and while running --------------------------------
st, slow = s.json("POST", "/v1/videos", {"prompt": "slow", "seconds": "0.5", "steps": 400, "seed": 3})
running = s.wait_running(slow["id"])
st, q = s.json("POST", "/v1/videos", {"prompt": "queued", "seconds": "0.25", "steps": 2, "seed": 4})
check(running and running["status"] == "in_progress" and q["status"] == "queued", f"one running, one queued: {running} {q}")
for vid, what in ((slow["id"], "in_progress"), (q["id"], "queued")):
    st, e = s.json("GET", f"/v1/videos/{vid}/content")
    check(st == 404 and f"status {what}" in e["error"]["message"], f"no content while {what}: {st} {e}")
t0 = time.time()
while time.time() - t0 < 10 and s.json("GET", f"/v1/videos/{slow['id']}")[1]["progress"] == 0:
    time.sleep(0.02)
st, v = s.json("GET", f"/v1/videos/{slow['id']}")
check(st == 200 and v["status"] == "in_progress" and 0 < v["progress"] < 99, f"live progress while running: {v}")
for vid in (q["id"], slow["id"]):
    st, dl = s.json("DELETE", f"/v1/videos/{vid}")
    check(st == 200 and dl == {"id": vid, "object": "video.deleted", "deleted": True}, f"DELETE: {st} {dl}")
    check(s.json("GET", f"/v1/videos/{vid}")[0] == 404, "a deleted video is gone")
t0 = time.time()
st, v = s.json("POST", "/v1/videos", {"prompt": "after", "seconds": "0.25", "steps": 2, "seed": 5})
v = s.wait_video(v["id"], timeout=20)
check(v and v["status"] == "completed" and time.time() - t0 < 10, f"the running video was cancelled: the next one runs ({v})")
left = [f for f in os.listdir(res) if f.startswith((slow["id"][6:], q["id"][6:]))]
check(not left, f"nothing is left of the deleted videos: {left}")

# ---- list and delete --------------------------------------------------------------------
st, lst = s.json("GET", "/v1/videos")
ids = [x["id"] for x in lst["data"]] if st == 200 else []
created = [x["created_at"] for x in lst["data"]] if st == 200 else []
check(st == 200 and lst["object"] == "list" and lst["has_more"] is False and len(ids) == 7 and ids[-1] == first
      and created == sorted(created, reverse=True) and all(x["object"] == "video" for x in lst["data"]),
      f"GET /v1/videos: newest first: {ids}")
st, p1 = s.json("GET", "/v1/videos?limit=2")
st2, p2 = s.json("GET", f"/v1/videos?limit=2&after={p1['data'][1]['id']}")
check([x["id"] for x in p1["data"] + p2["data"]] == ids[:4] and p1["has_more"] and p2["has_more"], "limit/after pages")
st, asc = s.json("GET", "/v1/videos?order=asc&limit=100")
check([x["id"] for x in asc["data"]] == ids[::-1], "order=asc")
for q_, param in (("limit=0", "limit"), ("limit=x", "limit"), ("after=nope", "after"), ("order=up", "order"),
                  ("after=video_0123456789abcdef", "after")):
    st, e = s.json("GET", f"/v1/videos?{q_}")
    check(st == 400 and e["error"]["param"] == param, f"GET /v1/videos?{q_}: 400 naming {param}: {st} {e}")
victim = ids[1]
mp4_file = os.path.join(res, victim[6:] + ".mp4")
check(os.path.exists(mp4_file), "the MP4 is a file in the results folder")
st, dl = s.json("DELETE", f"/v1/videos/{victim}")
check(st == 200 and dl == {"id": victim, "object": "video.deleted", "deleted": True}, f"DELETE a completed video: {dl}")
check(s.json("GET", f"/v1/videos/{victim}")[0] == 404 and s.req("GET", f"/v1/videos/{victim}/content")[0] == 404
      and s.json("DELETE", f"/v1/videos/{victim}")[0] == 404 and not os.path.exists(mp4_file),
      "after DELETE: 404 everywhere, the MP4 removed")
check(s.json("GET", "/v1/videos/video_0123456789abcdef")[0] == 404 and s.json("GET", "/v1/videos/nope")[0] == 404, "unknown ids")

# ---- bad input --------------------------------------------------------------------------
bad = [
    ({"prompt": "x", "size": "64x64"}, "size", "supported: 48x32"),
    ({"prompt": "x", "size": "48x"}, "size", "WxH"),
    ({"prompt": "x", "seconds": "abc"}, "seconds", "positive number"),
    ({"prompt": "x", "seconds": "-1"}, "seconds", "positive number"),
    ({"prompt": "x", "seconds": 0}, "seconds", "positive number"),
    ({"prompt": "x", "seconds": "4"}, "seconds", "\"0.25\" (5 frames), \"0.5\" (9 frames)"),
    ({"seconds": "0.5"}, "prompt", "required"),
    ({"prompt": 3}, "prompt", "must be a string"),
    ({"prompt": "x", "seconds": "0.5", "frames": 9}, "frames", "not both"),
    ({"prompt": "x", "frames": 13}, "frames", "not served"),
    ({"prompt": "x", "fps": 0}, "fps", "(0, 1000]"),
    ({"prompt": "x", "steps": 0}, "steps", "from 1 to 400"),
    ({"prompt": "x", "seed": -2}, "seed", "non-negative"),
    ({"prompt": "x", "bogus": 1}, "bogus", "unknown field"),
    ({"prompt": "x", "input_reference": "a.png"}, "input_reference", "not supported"),
]
for body, param, msg in bad:
    st, e = s.json("POST", "/v1/videos", body)
    e = (e or {}).get("error", {})
    check(st == 400 and e.get("param") == param and msg in e.get("message", "") and e.get("type") == "invalid_request_error",
          f"400 naming `{param}` for {body}: {st} {e}")
st, e = s.json("POST", "/v1/videos", raw=b"{nope", headers={"Content-Type": "application/json"})
check(st == 400, f"not JSON: {st}")
st, e = s.json("POST", "/v1/videos", {"prompt": "x", "model": "sora-2"})
check(st == 404 and e["error"]["code"] == "model_not_found", f"another model: {st} {e}")
for route in ("/v1/images/generations", "/v1/jobs"):
    st, e = s.json("POST", route, {"prompt": "x"})
    check(st == 400 and e["error"]["param"] == "model" and "POST /v1/videos" in e["error"]["message"],
          f"{route} on the video model: 400 naming model: {st} {e}")

# ---- forms (OpenAI's SDK posts multipart/form-data) ------------------------------------------
body, hdr = multipart({"prompt": "a form", "seconds": "0.25", "size": "48x32", "steps": "2", "seed": "11"})
st, v = s.json("POST", "/v1/videos", raw=body, headers=hdr)
v = s.wait_video(v["id"]) if st == 200 else v
check(v and v.get("status") == "completed" and v["frames"] == 5 and v["prompt"] == "a form", f"a multipart form: {st} {v}")
body, hdr = multipart({"prompt": "x"}, files=[("input_reference", "ref.png", b"\x89PNG\r\n\x1a\n")])
st, e = s.json("POST", "/v1/videos", raw=body, headers=hdr)
check(st == 400 and e["error"]["param"] == "input_reference", f"a reference image upload is refused: {st} {e}")
st, e = s.json("POST", "/v1/videos", raw=b"prompt=a+form&seconds=0.5&steps=2",
               headers={"Content-Type": "application/x-www-form-urlencoded"})
check(st == 200 and e["frames"] == 9 and e["prompt"] == "a form", f"a urlencoded form: {st} {e}")
s.wait_video(e["id"]) if st == 200 else None

# the page in a real browser: it submits a video request and plays the result
chrome = next((c for c in ("chromium", "chromium-browser", "google-chrome") if shutil.which(c)), None)
if chrome:
    dom = subprocess.run([chrome, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom", "--virtual-time-budget=15000",
                          f"http://127.0.0.1:{s.port}/?autorun=1"], capture_output=True, text=True, timeout=120).stdout
    check('src="/v1/videos/video_' in dom and "completed" in dom, f"the page made a video and plays it: {dom[-400:]}")
else:
    print("note: no chromium; the page is checked by its HTML only")

# ---- an API restart: finished videos and their MP4s stay, accepted ones finish -----------------
st, a = s.json("POST", "/v1/videos", {"prompt": "restart a", "seconds": "0.5", "steps": 60, "seed": 21})
st, b2 = s.json("POST", "/v1/videos", {"prompt": "restart b", "seconds": "0.25", "steps": 2, "seed": 22})
s.stop(signal.SIGKILL)
s = Server(res)
s.wait_ready()
st, v = s.json("GET", f"/v1/videos/{first}")
st2, again, _ = s.req("GET", f"/v1/videos/{first}/content")
check(st == 200 and v["status"] == "completed" and st2 == 200 and again == mp4, "after a restart: the video and its MP4 are kept")
ends = [s.wait_video(x["id"], timeout=60) for x in (a, b2)]
check(all(e and e["status"] == "completed" for e in ends), f"accepted videos finish after the restart: {ends}")
st, lst = s.json("GET", "/v1/videos?limit=100")
check(st == 200 and {a["id"], b2["id"], first} <= {x["id"] for x in lst["data"]}, "the list survives the restart")
s.stop()

# ---- flags, and the wrong kind of model ------------------------------------------------------------
s2 = Server(None, argv=[BIN, "serve", "--model", WAN, "--sizes", "48x32,64x32", "--frames", "9", "--fps", "8", "--port", "0",
                        "--results", os.path.join(tmp, "flags")])
st, m = s2.json("GET", "/v1/models")
d = m["data"][0] if st == 200 else {}
check(d.get("sizes") == ["48x32", "64x32"] and d.get("frames") == [9] and d.get("seconds") == ["1"] and d.get("fps") == 8,
      f"serve --model --sizes --frames --fps: {m}")
s2.stop()
p = subprocess.run([BIN, "serve", "--model", FLUX, "--frames", "5", "--port", "0", "--results", os.path.join(tmp, "bad")],
                   capture_output=True, text=True, timeout=60)
check(p.returncode != 0 and "makes images" in p.stderr, f"frames for an image model are refused: {p.returncode} {p.stderr}")
img = Server(os.path.join(tmp, "img"), model=FLUX, sizes=["32x48"], frames=[1])
st, e = img.json("POST", "/v1/videos", {"prompt": "x", "seconds": "4"})
check(st == 400 and e["error"]["param"] == "model" and "makes images" in e["error"]["message"]
      and "/v1/images/generations" in e["error"]["message"], f"/v1/videos on an image model: {st} {e}")
st, m = img.json("GET", "/v1/models")
check(st == 200 and m["data"][0]["output"] == "image" and "frames" not in m["data"][0], f"an image model's object: {m}")
img.stop()

# the other image model family behind the same images API: Qwen-Image (true CFG with a
# negative prompt, the prompt's own length as the valid text count)
QWEN = os.path.join(DATA, "qwenimage", "a")
q = Server(os.path.join(tmp, "qwen"), model=QWEN, sizes=["48x32"], frames=[1], max_sequence_length=64)
q.wait_ready()
st, r = q.json("POST", "/v1/images/generations", {"prompt": "a red circle", "size": "48x32", "steps": 3, "seed": 2,
                                                  "negative_prompt": "blurry", "true_cfg_scale": 4})
png = __import__("base64").b64decode(r["data"][0]["b64_json"]) if st == 200 else b""
check(st == 200 and png[:8] == b"\x89PNG\r\n\x1a\n", f"Qwen-Image through /v1/images/generations: {st} {str(r)[:200]}")
st, m = q.json("GET", "/v1/models")
check(st == 200 and m["data"][0]["output"] == "image", f"Qwen-Image's model object: {m}")
st, e = q.json("POST", "/v1/videos", {"prompt": "x"})
check(st == 400 and e["error"]["param"] == "model", f"/v1/videos on Qwen-Image: {st} {e}")
q.stop()

# HunyuanVideo beside Wan in one server: the request's `model` picks it (its own
# max_sequence_length and prompt template from its folder's difflet.json), an MP4 of
# 4k + 1 frames at HunyuanVideo's 15 fps, true CFG with a negative prompt
HY = os.path.join(DATA, "hunyuan", "c")
hy = Server(os.path.join(tmp, "hunyuan"), model=None, sizes=None, frames=None, max_sequence_length=None,
            models=[{"model": WAN, "sizes": ["48x32"], "frames": [5], "max_sequence_length": 16},
                    {"model": HY, "sizes": ["32x32"], "frames": [9]}])
check(hy.wait_ready(), "Wan and HunyuanVideo model processes get ready")
st, m = hy.json("GET", "/v1/models")
ids = {d["id"]: d for d in m.get("data", [])} if st == 200 else {}
check(ids.get("c", {}).get("output") == "video" and ids["c"].get("frames") == [9] and ids["c"].get("fps") == 15,
      f"the HunyuanVideo model object: {m}")
st, v = hy.json("POST", "/v1/videos", {"prompt": "a cat walks", "model": "c", "size": "32x32", "seconds": "0.6",
                                       "steps": 2, "seed": 3, "negative_prompt": "blurry", "true_cfg_scale": 2})
done = hy.wait_video(v["id"]) if st == 200 else None
check(done and done["status"] == "completed" and done["model"] == "c", f"HunyuanVideo video: {st} {v} {done}")
if done and done["status"] == "completed":
    st, mp4, _ = hy.req("GET", f"/v1/videos/{v['id']}/content")
    check(st == 200 and probe(mp4) == "h264,32,32,15/1,9", f"ffprobe: H.264, 32x32, 15 fps, 9 frames: {probe(mp4)}")
st, v = hy.json("POST", "/v1/videos", {"prompt": "a red ball", "model": "a", "size": "48x32", "seconds": "0.3125",
                                       "steps": 2, "seed": 3})
done = hy.wait_video(v["id"]) if st == 200 else None
check(done and done["status"] == "completed" and done["model"] == "a", f"Wan in the same server: {st} {v} {done}")
st, e = hy.json("POST", "/v1/videos", {"prompt": "x", "model": "c", "size": "48x32"})
check(st == 400 and e["error"]["param"] == "size", f"a size HunyuanVideo is not served at: {st} {e}")
hy.stop()

# LTX-2: video with sound behind the same videos API: the MP4 carries an AAC track
LTX = os.path.join(DATA, "ltx2", "pipe")
lx = Server(os.path.join(tmp, "ltx2"), model=LTX, sizes=["96x96"], frames=[9], max_sequence_length=None)
check(lx.wait_ready(), "the LTX-2 model process gets ready")
st, v = lx.json("POST", "/v1/videos", {"prompt": "a red ball bounces", "model": "pipe", "size": "96x96", "frames": 9,
                                       "steps": 2, "seed": 1})
done = lx.wait_video(v["id"]) if st == 200 else None
check(done and done["status"] == "completed", f"LTX-2 video: {st} {v} {done}")
if done and done["status"] == "completed":
    st, mp4, _ = lx.req("GET", f"/v1/videos/{v['id']}/content")
    f = os.path.join(tmp, "ltx2.mp4")
    with open(f, "wb") as fh:
        fh.write(mp4)
    pr = subprocess.run(["ffprobe", "-v", "error", "-show_entries", "stream=codec_type,codec_name", "-of", "csv=p=0", f],
                        capture_output=True, text=True)
    streams = pr.stdout.split()
    check(st == 200 and "h264,video" in streams and "aac,audio" in streams and probe(mp4).startswith("h264,96,96,24/1,9"),
          f"the LTX-2 MP4 has H.264 and AAC streams: {streams} {probe(mp4)}")
lx.stop()

# OpenSora 1.2 behind the same videos API: an MP4 at 24 fps of the requested frame count
OS = os.path.join(DATA, "opensora", "a")
os_ = Server(os.path.join(tmp, "opensora"), model=OS, sizes=["56x40"], frames=[34], max_sequence_length=None)
check(os_.wait_ready(), "the OpenSora model process gets ready")
st, v = os_.json("POST", "/v1/videos", {"prompt": "a red fox runs through the snow", "model": "a", "size": "56x40",
                                        "frames": 34, "steps": 2, "seed": 1})
done = os_.wait_video(v["id"]) if st == 200 else None
check(done and done["status"] == "completed", f"OpenSora video: {st} {v} {done}")
if done and done["status"] == "completed":
    st, mp4, _ = os_.req("GET", f"/v1/videos/{v['id']}/content")
    check(st == 200 and probe(mp4) == "h264,56,40,24/1,34", f"ffprobe: H.264, 56x40, 24 fps, 34 frames: {probe(mp4)}")
os_.stop()

# ---- OpenAI's SDK -------------------------------------------------------------------------------
try:
    import warnings
    import openai
except ImportError:
    openai = None
    print("note: the `openai` package is not importable by this interpreter; the SDK part is skipped "
          "(run under tools/venv/bin/python to include it)")
if openai:
    warnings.simplefilter("ignore", DeprecationWarning)
    s = Server(os.path.join(tmp, "sdk"))
    s.wait_ready()
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{s.port}/v1", api_key="unused")
    v = client.videos.create(prompt="a fox", model="a", seconds="0.5", size="48x32", extra_body={"steps": 2, "seed": 1})
    check(v.object == "video" and v.seconds == "0.5" and v.size == "48x32", f"SDK create: {v}")
    t0 = time.time()
    while v.status in ("queued", "in_progress") and time.time() - t0 < 30:
        time.sleep(0.1)
        v = client.videos.retrieve(v.id)
    check(v.status == "completed" and v.progress == 100 and v.completed_at, f"SDK retrieve: {v}")
    data = client.videos.download_content(v.id).read()
    check(probe(data) == "h264,48,32,16/1,9", f"SDK download_content: {probe(data)}")
    check([x.id for x in client.videos.list()] == [v.id], "SDK list")
    dl = client.videos.delete(v.id)
    check(dl.deleted and dl.id == v.id and dl.object == "video.deleted", f"SDK delete: {dl}")
    try:
        client.videos.retrieve(v.id)
        check(False, "SDK: a deleted video is gone")
    except openai.NotFoundError:
        check(True, "")
    try:
        client.videos.create(prompt="x", seconds="4")
        check(False, "SDK: an unserved length is refused")
    except openai.BadRequestError as ex:
        check(ex.body.get("param") == "seconds", f"SDK: 400 naming seconds: {ex.body}")
    s.stop()

subprocess.run(["rm", "-rf", tmp])
passed, failed = counts()
print(f"test_serve_video: {passed} passed, {failed} failed ({time.time() - T0:.0f} s)")
sys.exit(1 if failed else 0)
