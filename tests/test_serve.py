#!/usr/bin/env python3
"""difflet serve against a real server on a free loopback port (standard library
only: CI has no tools virtualenv). Covers every route, every bad-input case, the
bounded queue (429), a SIGKILLed model process (the request fails at once, a
replacement starts, the same request and seed give the same bytes as before), a
model process that ignores its cancel (timeout, kill after the grace period,
replacement), an API restart with queued jobs surviving, 8 concurrent clients
sending 56 requests with none lost or duplicated, data-parallel replicas, and a
parallel replica (an mpirun job of 2 ranks: same bytes as one rank, replaced whole
when killed, gone when the server stops).

    tests/test_serve.py path/to/difflet tests/data
"""
import base64
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

BIN, DATA = sys.argv[1], sys.argv[2]
MODEL = os.path.join(DATA, "flux", "dev")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import Server as _Server, check, counts, kill_one  # noqa: E402


class Server(_Server):
    def __init__(self, results, **profile):
        prof = {"model": MODEL, "sizes": ["32x48"], "results_dir": results, "port": 0, "request_timeout_s": 60,
                "cancel_grace_s": 1.0, "queue_capacity": 6, "max_steps": 3000, "max_prompt_bytes": 200}
        prof.update(profile)
        super().__init__(BIN, results, prof)

    def wait_job(self, jid, timeout=60):
        return self.wait_done(f"/v1/jobs/{jid}", timeout)


def chromium(chrome, args, timeout=120):
    """headless Chromium's stdout (None when it ran past timeout). It runs in its own
    process group, killed whole on a timeout: its helper processes hold the output pipe,
    so killing the main process alone would leave the test waiting (a page whose job is
    slow keeps --virtual-time-budget from ever running out)."""
    p = subprocess.Popen([chrome, "--headless", "--no-sandbox", "--disable-gpu", *args], stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    try:
        return p.communicate(timeout=timeout)[0]
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        return None


class Browser:
    """Headless Chromium driven by a script over the DevTools protocol on a pipe
    (--remote-debugging-pipe: commands in on fd 3, answers out on fd 4, NUL-separated
    JSON; standard library only). js() evaluates in the page, wait() polls until an
    expression is truthy. Every call has a deadline; close() kills the process group."""

    def __init__(self, chrome, user_dir):
        to_r, self.to_w = os.pipe()
        self.from_r, from_w = os.pipe()
        self.p = subprocess.Popen(["sh", "-c", f'exec "$0" "$@" 3<&{to_r} 4>&{from_w}', chrome, "--headless", "--no-sandbox",
                                   "--disable-gpu", "--remote-debugging-pipe", f"--user-data-dir={user_dir}",
                                   "--window-size=900,800", "about:blank"], pass_fds=(to_r, from_w),
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        os.close(to_r)
        os.close(from_w)
        self.buf, self.n, self.session = b"", 0, None
        page = [t for t in self.cmd("Target.getTargets")["targetInfos"] if t["type"] == "page"][0]
        self.session = self.cmd("Target.attachToTarget", targetId=page["targetId"], flatten=True)["sessionId"]

    def cmd(self, method, timeout=30, **params):
        self.n += 1
        msg = {"id": self.n, "method": method, "params": params}
        if self.session:
            msg["sessionId"] = self.session
        os.write(self.to_w, json.dumps(msg).encode() + b"\0")
        end = time.time() + timeout
        while True:
            while b"\0" in self.buf:
                line, self.buf = self.buf.split(b"\0", 1)
                r = json.loads(line)
                if r.get("id") == self.n:
                    if "error" in r:
                        raise RuntimeError(f"{method}: {r['error']}")
                    return r["result"]
            left = end - time.time()
            if left <= 0 or not select.select([self.from_r], [], [], left)[0]:
                raise TimeoutError(f"chromium did not answer {method} in {timeout} s")
            chunk = os.read(self.from_r, 1 << 16)
            if not chunk:
                raise EOFError("chromium closed its pipe")
            self.buf += chunk

    def js(self, expr):
        r = self.cmd("Runtime.evaluate", expression=expr, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in r:
            raise RuntimeError(f"{expr}: {r['exceptionDetails'].get('exception', {}).get('description')}")
        return r["result"].get("value")

    def wait(self, expr, timeout=60):
        end = time.time() + timeout
        while time.time() < end:  # an expression that throws (the page not loaded yet) is false
            v = self.js(f"(()=>{{try{{return {expr}}}catch(e){{return null}}}})()")
            if v:
                return v
            time.sleep(0.2)
        return None

    def close(self):
        try:
            self.cmd("Browser.close", timeout=5)
            self.p.wait(10)
        except Exception:
            pass
        try:
            os.killpg(self.p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.p.wait()
        os.close(self.to_w)
        os.close(self.from_r)


def image(srv, body):
    st, j = srv.json("POST", "/v1/images/generations", body)
    if st != 200:
        return st, None
    return st, base64.b64decode(j["data"][0]["b64_json"])


tmp = tempfile.mkdtemp(prefix="difflet-serve-")
os.environ["DIFFLET_CACHE"] = os.path.join(tmp, "cache")

# ---- routes and bad input ---------------------------------------------------------
s = Server(os.path.join(tmp, "r1"))
ready = s.wait_ready()
check(ready and ready["ready"], "ready after start-up")
check(s.json("GET", "/health")[0] == 200, "health")
st, j = s.json("GET", "/v1/models")
check(st == 200 and j["data"][0]["sizes"] == ["32x48"], "models")
st, png = image(s, {"prompt": "a red circle", "steps": 4, "seed": 5})
check(st == 200 and png[:8] == b"\x89PNG\r\n\x1a\n", "images/generations b64_json gives a PNG")
before_crash = png
st, j = s.json("POST", "/v1/images/generations", {"prompt": "a red circle", "steps": 3, "response_format": "url"})
check(st == 200 and j["data"][0]["url"].startswith(f"http://127.0.0.1:{s.port}/v1/jobs/"), f"url responses are absolute: {j}")
st, b, h = s.req("GET", j["data"][0]["url"].split(str(s.port), 1)[1])
check(st == 200 and b[:4] == b"\x89PNG" and h.get("Content-Type") == "image/png", "url content")
# output_format / output_compression as OpenAI has them; ffprobe reads each back
for fmt, magic, ctype, codec in (("jpeg", b"\xff\xd8\xff", "image/jpeg", "mjpeg"), ("webp", b"RIFF", "image/webp", "webp")):
    st, data = image(s, {"prompt": "a red circle", "steps": 2, "output_format": fmt, "output_compression": 70})
    check(st == 200 and data[:len(magic)] == magic, f"b64_json in {fmt}: {st} {data[:8] if data else None}")
    f = os.path.join(tempfile.gettempdir(), f"difflet-serve-out.{fmt}")
    with open(f, "wb") as fh:
        fh.write(data or b"")
    pr = subprocess.run(["ffprobe", "-v", "error", "-show_entries", "stream=codec_name,width,height", "-of", "csv=p=0", f],
                        capture_output=True, text=True)
    check(pr.stdout.strip() == f"{codec},32,48", f"ffprobe reads the {fmt} back as 32x48: {pr.stdout} {pr.stderr}")
    os.unlink(f)
    st, j = s.json("POST", "/v1/images/generations", {"prompt": "x", "steps": 2, "output_format": fmt, "response_format": "url"})
    st, b, h = s.req("GET", j["data"][0]["url"].split(str(s.port), 1)[1])
    check(st == 200 and b[:len(magic)] == magic and h.get("Content-Type") == ctype, f"url content in {fmt}: {h.get('Content-Type')}")
bad = [
    ({"raw": b"{not json"}, None, "not valid JSON"),
    ({"raw": b'{"prompt": "x", "steps": 2, "prompt": "y"}'}, None, "\"prompt\" appears twice"),
    ({"raw": b'{"prompt": "x", "extra_body": {"a": 1, "a": 2}}'}, None, "\"a\" appears twice"),
    ({"raw": b'{"prompt": "a red \\ud800 circle", "steps": 2}'}, None, "lone UTF-16 surrogate"),
    ({"body": [1, 2]}, None, "JSON object"),
    ({"body": {"prompt": 5}}, "prompt", "must be a string"),
    ({"body": {"steps": 4}}, "prompt", "required"),
    ({"body": {"prompt": "x", "bogus": 1}}, "bogus", "unknown field"),
    ({"body": {"prompt": "x", "size": "64x64"}}, "size", "supported: 32x48"),
    ({"body": {"prompt": "x" * 300}}, "prompt", "at most 200"),
    ({"body": {"prompt": "x", "steps": 0}}, "steps", "from 1 to"),
    ({"body": {"prompt": "x", "steps": 2.5}}, "steps", "integer"),
    ({"body": {"prompt": "x", "n": 9}}, "n", "1 to 4"),
    ({"body": {"prompt": "x", "seed": -1}}, "seed", "non-negative"),
    ({"body": {"prompt": "x", "response_format": "jpeg"}}, "response_format", "b64_json"),
    ({"body": {"prompt": "x", "output_format": "gif"}}, "output_format", "\"jpeg\""),
    ({"body": {"prompt": "x", "output_format": "jpeg", "output_compression": 101}}, "output_compression", "0 to 100"),
    ({"body": {"prompt": "x", "cache": "calibrated:/etc/passwd"}}, "cache", "cadence"),
    ({"body": {"prompt": "x", "guidance_scale": "high"}}, "guidance_scale", "number"),
]
for kw, param, msg in bad:
    st, b, _ = s.req("POST", "/v1/images/generations", **kw)
    e = json.loads(b).get("error", {}) if b else {}
    want_code = "unknown_parameter" if param == "bogus" else "missing_required_parameter" if msg == "required" else "invalid_value"
    check(st == 400 and e.get("param") == param and msg in e.get("message", "") and e.get("code") == want_code,
          f"400 with OpenAI's code `{want_code}` for {kw}: {st} {b[:200]}")
st, b, _ = s.req("POST", "/v1/images/generations", raw=b"{" + b" " * 70000 + b"}")
check(st == 413, f"413 for a large body ({st})")
check(s.json("GET", "/v1/nothing")[0] == 404, "404 route")
# models as OpenAI has them: the id clients use, created, owned_by; an unknown model is a 404 model_not_found
st, m = s.json("GET", "/v1/models/dev")
check(st == 200 and m["id"] == "dev" and m["object"] == "model" and m["owned_by"] == "difflet" and m["created"] > 1e9,
      f"GET /v1/models/dev: {st} {m}")
st, m = s.json("GET", "/v1/models/gpt-image-1")
check(st == 404 and m["error"]["code"] == "model_not_found", f"unknown model id: {st} {m}")
st, m = s.json("POST", "/v1/images/generations", {"prompt": "x", "model": "dall-e-3"})
check(st == 404 and m["error"]["code"] == "model_not_found" and m["error"]["param"] == "model", f"generation with another model: {st} {m}")
st, png2 = image(s, {"prompt": "a red circle", "steps": 4, "seed": 5, "model": "dev"})
check(st == 200 and png2 == before_crash, "the served model by name gives the same picture")
check(s.json("GET", "/v1/jobs/0123456789abcdef")[0] == 404, "404 job")
st, b, _ = s.req("GET", "/")
check(st == 200 and b"<form" in b and b"/v1/jobs" in b, "the web page")

# the page in a real browser: headless Chromium loads it, submits the form, and the
# screenshot is taken after the picture arrived (the query string fills the form)
chrome = next((c for c in ("chromium", "chromium-browser", "google-chrome") if subprocess.run(["which", c], capture_output=True).returncode == 0), None)
check(chrome is not None, "chromium is installed (make deps)")
if chrome:
    shot = os.path.join(tmp, "page.png")
    before = s.req("GET", "/metrics")[1]
    chromium(chrome, ["--hide-scrollbars", f"--screenshot={shot}", "--window-size=900,700", "--virtual-time-budget=15000",
                      f"http://127.0.0.1:{s.port}/?autorun=1&steps=2"])
    after = s.req("GET", "/metrics")[1].decode()
    ok_png = os.path.exists(shot) and open(shot, "rb").read(8) == b"\x89PNG\r\n\x1a\n" and os.path.getsize(shot) > 5000
    check(ok_png, "headless Chromium took a screenshot of the page")
    check('difflet_requests_total{status="202"}' in after, "the page submitted a job through the API")
    if os.environ.get("DIFFLET_KEEP_SCREENSHOT"):
        subprocess.run(["cp", shot, os.environ["DIFFLET_KEEP_SCREENSHOT"]])

    # a generation with every setting given: the gallery shows it with the settings, and
    # the job got them under the API's names (negative_prompt, guidance_scale)
    dom = chromium(chrome, ["--dump-dom", "--virtual-time-budget=30000", f"http://127.0.0.1:{s.port}/?autorun=1&steps=2&seed=42"
                            "&guidance_scale=2.5&prompt=a+green+square&negative_prompt=dull+colours&size=32x48"]) or ""
    gal = dom.split('id="q_gallery"', 1)[-1] if 'id="q_gallery"' in dom else ""
    jid = gal.split('data-job="', 1)[1].split('"', 1)[0] if 'data-job="' in gal else "none"
    check(gal.count("<figure") == 1 and '<div class="p">a green square</div>' in gal and "not: dull colours" in gal
          and "dev, 32x48, 2 steps, guidance 2.5, seed 42" in gal and f'src="/v1/jobs/{jid}/content"' in gal,
          f"the gallery has the generation with its settings and picture: {gal[:600] or dom[-600:]}")
    st, j = s.json("GET", f"/v1/jobs/{jid}")
    req = (j or {}).get("request", {})
    check(st == 200 and j["status"] == "completed" and req.get("negative_prompt") == "dull colours"
          and req.get("guidance_scale") == 2.5 and req.get("seed") == 42 and req.get("steps") == 2,
          f"the page sent the settings as the API names them: {st} {j}")

    # scripted through the DevTools protocol: type the settings, press Generate; a reload
    # keeps the gallery (sessionStorage) and fetches its picture again; Cancel cancels
    # a running job through the API
    b = None
    try:
        b = Browser(chrome, os.path.join(tmp, "chrome-cdp"))
        b.cmd("Page.navigate", url=f"http://127.0.0.1:{s.port}/")
        check(b.wait("$('q_size').options.length == 1 && $('q_mwrap').hidden && !$('q_go').disabled && $('q_cancel').disabled"),
              "the page loads its model's sizes; Generate on, Cancel off")
        b.js("for (const [i, v] of [['q_prompt', 'a blue square'], ['q_neg', 'noise'], ['q_steps', '3'], ['q_guid', '4'],"
             " ['q_seed', '']]) $(i).value = v; $('q_go').click()")
        fig = "document.querySelector('#q_gallery figure')"
        img = f"{fig}.querySelector('img').naturalWidth == 32 && {fig}.querySelector('img').naturalHeight == 48"
        ok = b.wait(f"$('q_status').textContent.startsWith('completed 3/3') && {img}", 90)
        cap = b.js(f"{fig} && {fig}.innerText") or ""
        jid = b.js(f"{fig} && {fig}.dataset.job") or "none"
        st, j = s.json("GET", f"/v1/jobs/{jid}")
        seed = (j or {}).get("request", {}).get("seed")
        seed = int(seed) if isinstance(seed, float) and seed.is_integer() else seed  # cJSON may write 16 digits as 5.2e+15
        check(ok and st == 200 and "seed" in j["request"] and cap.startswith("a blue square\nnot: noise\n")
              and f"dev, 32x48, 3 steps, guidance 4, seed {seed}\n" in cap,
              f"a typed generation is in the gallery with its settings (the seed the server chose): {ok} {cap!r} {j}")
        b.cmd("Page.reload")
        ok = b.wait(f"document.querySelectorAll('#q_gallery figure').length == 1 && {fig}.dataset.job == '{jid}' && {img}"
                    " && $('q_size').options.length == 1 && !$('q_go').disabled", 30)
        check(ok and b.js(f"{fig}.innerText") == cap, "a reload keeps the session's gallery and shows its picture again")
        b.js("$('q_steps').value = 2000; $('q_go').click()")
        running = b.wait("/^in_progress [1-9]/.test($('q_status').textContent) && !$('q_cancel').disabled && $('q_go').disabled", 60)
        cid = b.js("$('q_status').dataset.job")
        b.js("$('q_cancel').click()")
        ok = b.wait("$('q_status').textContent.startsWith('cancelled') && $('q_cancel').disabled && !$('q_go').disabled", 30)
        e = s.wait_job(cid, timeout=30)
        said = b.js("$('q_status').textContent")
        check(running and ok and e and e.get("status") == "cancelled" and e.get("steps_done", 2000) < 2000
              and b.js("document.querySelectorAll('#q_gallery figure').length") == 1,
              f"Cancel cancels the running job through the API (and it stays out of the gallery): {running} {ok} {e}"
              f" {said!r}")
        b.js("$('q_clear').click()")
        b.cmd("Page.reload")
        check(b.wait("$('q_size').options.length == 1") and b.js("document.querySelectorAll('#q_gallery figure').length") == 0,
              "clear empties the gallery")
    except Exception as ex:
        check(False, f"the page driven over the DevTools protocol: {ex!r}")
    finally:
        if b:
            b.close()

# ---- jobs, cancel, queue full ------------------------------------------------------
st, j = s.json("POST", "/v1/jobs", {"prompt": "a blue square", "steps": 5, "seed": 1})
check(st == 202 and ((j["status"] == "queued" and j["queue_position"] >= 1) or j["status"] == "in_progress"),
      f"jobs: 202, queued or already taken by the idle model process: {j}")
sse_lines = urllib.request.urlopen(f"http://127.0.0.1:{s.port}/v1/jobs/{j['id']}/events", timeout=60).read().decode()
events = [json.loads(l[6:]) for l in sse_lines.splitlines() if l.startswith("data: ")]
check(events and events[-1]["status"] == "completed" and "event: completed" in sse_lines, f"server-sent events end with completed: {sse_lines[-200:]}")
# an event per step, pushed as the model process reports it (not sampled from the store)
st, j60 = s.json("POST", "/v1/jobs", {"prompt": "steps", "steps": 60, "seed": 4})
lines60 = urllib.request.urlopen(f"http://127.0.0.1:{s.port}/v1/jobs/{j60['id']}/events", timeout=60).read().decode()
steps60 = sorted({e["steps_done"] for e in (json.loads(l[6:]) for l in lines60.splitlines() if l.startswith("data: "))
                  if e.get("status") == "in_progress"})
check(len(steps60) >= 55 and steps60[-1] >= 59,
      f"progress events for (nearly) every one of 60 steps: {len(steps60)} distinct, last {steps60[-1:]}")
done = s.wait_job(j["id"])
check(done and done["status"] == "completed" and done["steps_done"] == 5 and done["progress"] == 100, "job completes")
long_ids = []
codes = []
retry_after = []
for i in range(12):  # a slow job running, then the queue (capacity 6) fills
    st, b, h = s.req("POST", "/v1/jobs", {"prompt": "slow", "steps": 2000, "seed": i})
    codes.append(st)
    if st == 202:
        long_ids.append(json.loads(b)["id"])
    else:
        retry_after.append(h.get("Retry-After"))
check(codes.count(429) >= 1 and codes.count(202) >= 6 and all(retry_after), f"queue bounded, 429 with Retry-After: {codes} {retry_after}")
st, j = s.json("POST", f"/v1/jobs/{long_ids[-1]}/cancel")
check(st == 200 and j["status"] == "cancelled", "cancel a queued job")
# a job without content says its status (formatted from live memory, not a freed record)
for jid, want in ((long_ids[-1], "cancelled"), (long_ids[-2], "queued")):
    st, b, _ = s.req("GET", f"/v1/jobs/{jid}/content")
    try:
        msg = json.loads(b.decode("utf-8"))["error"]["message"]
    except (UnicodeDecodeError, ValueError, KeyError):
        msg = repr(b)
    check(st == 404 and msg.endswith(f"has no content (status {want})"), f"content of a {want} job: {st} {msg}")
for jid in long_ids[:-1]:  # cancel the rest (the running one stops at a step boundary)
    s.json("POST", f"/v1/jobs/{jid}/cancel")
ends = [s.wait_job(jid) for jid in long_ids[:-1]]
check(all(e and e["status"] in ("cancelled", "completed") for e in ends), "cancelled jobs end")
# a running job cancelled mid-way says the step it stopped at (not the store's last sampled one)
st, jc = s.json("POST", "/v1/jobs", {"prompt": "stop me", "steps": 2000, "seed": 12})
seen, sent = 0, False
with urllib.request.urlopen(f"http://127.0.0.1:{s.port}/v1/jobs/{jc['id']}/events", timeout=60) as stream:
    for raw in stream:
        line = raw.decode()
        if not line.startswith("data: "):
            continue
        ev = json.loads(line[6:])
        if ev.get("status") == "in_progress":
            seen = max(seen, ev.get("steps_done", 0))
        if seen >= 20 and not sent:
            s.json("POST", f"/v1/jobs/{jc['id']}/cancel")
            sent = True
        if ev.get("status") not in ("queued", "in_progress"):
            break
ec = s.wait_job(jc["id"])
check(sent and ec and ec["status"] == "cancelled" and seen <= ec["steps_done"] < 2000,
      f"a cancelled job's steps_done is where it stopped: last event {seen}, job {ec and ec.get('steps_done')}")

# ---- SIGKILL of the model process mid-request -------------------------------------
st, j = s.json("POST", "/v1/jobs", {"prompt": "a red circle", "steps": 3000, "seed": 9})
t_end = time.time() + 10
while time.time() < t_end and s.json("GET", f"/v1/jobs/{j['id']}")[1]["status"] != "in_progress":
    time.sleep(0.02)
pid = s.json("GET", "/ready")[1]["model_pid"]
kill_one(pid, signal.SIGKILL)
t0 = time.time()
e = s.wait_job(j["id"], timeout=5)
check(e and e["status"] == "failed" and "model process" in e.get("error", "") and time.time() - t0 < 1.5,
      f"the killed request fails within a second: {e}")
check(s.wait_ready(30) is not None, "a replacement becomes ready")
st, png = image(s, {"prompt": "a red circle", "steps": 4, "seed": 5})
check(st == 200 and png == before_crash, "after the crash, the same request and seed give the same bytes")
st, b, _ = s.req("GET", "/metrics")
check(b"difflet_model_restarts_total 1" in b and b"difflet_ready 1" in b, "metrics count the restart")
s.stop()

# ---- timeout with a model process that ignores the cancel -------------------------
s = Server(os.path.join(tmp, "r2"), request_timeout_s=1.0)
s.wait_ready()
res = {}
th = threading.Thread(target=lambda: res.update(r=s.json("POST", "/v1/images/generations", {"prompt": "x", "steps": 3000})))
th.start()
time.sleep(0.3)
pid = s.json("GET", "/ready")[1]["model_pid"]
kill_one(pid, signal.SIGSTOP)  # a stuck model process: it cannot see the cancel
th.join(15)
check(res.get("r", (0,))[0] == 504, f"504 at the deadline: {res.get('r')}")
t0 = time.time()
while time.time() - t0 < 5 and s.json("GET", "/ready")[0] == 200:
    time.sleep(0.05)
r = s.wait_ready(30)
check(r and r["model_pid"] != pid, "the stuck model process was killed and replaced")
st, png = image(s, {"prompt": "after", "steps": 1})  # one step: within the 1 s deadline on a slow machine too
check(st == 200, f"dispatch resumes after the recovery: {st}")
s.stop()

# ---- API restart: queued jobs survive ------------------------------------------------
res_dir = os.path.join(tmp, "r3")
s = Server(res_dir)
s.wait_ready()
# (20 steps: still queued or running when the API dies right after; the 60 s deadline counts from submission)
ids = [s.json("POST", "/v1/jobs", {"prompt": f"p{i}", "steps": 20, "seed": i})[1]["id"] for i in range(4)]
s.stop(signal.SIGKILL)  # the API process dies with jobs queued and one in progress
s = Server(res_dir)
s.wait_ready()
ends = [s.wait_job(i, timeout=120) for i in ids]
check(all(e and e["status"] == "completed" for e in ends),
      f"every accepted job completes after the restart: {[e and (e['status'], e.get('error')) for e in ends]}")

# ---- 8 concurrent clients, 56 requests ----------------------------------------------
results, lock = [], threading.Lock()


def client(k):
    """7 requests in turn; a 429 is retried after its Retry-After, as a client should"""
    for i in range(7):
        first, tries = None, 0
        while True:
            st, b, h = s.req("POST", "/v1/images/generations", {"prompt": f"client {k} request {i}", "steps": 2, "seed": k * 100 + i})
            first = first or st
            tries += 1
            if st != 429 or tries > 20:
                break
            time.sleep(min(float(dict(h).get("Retry-After", 2)), 2.0))
        try:
            j = json.loads(b)
        except ValueError:
            j = None
        with lock:
            results.append((first, st, j and len(j.get("data", [])), tries, dict(h).get("Retry-After")))


ts = [threading.Thread(target=client, args=(k,)) for k in range(8)]
[t.start() for t in ts]
[t.join(300) for t in ts]
check(len(results) == 56 and all(r[0] in (200, 429) for r in results),
      f"56 first answers, each an image or a 429: {[r[0] for r in results]}")
check(all(r[1] == 200 and r[2] == 1 for r in results),
      f"every request is served in the end, retried after its 429s: {[(r[1], r[3]) for r in results]}")
print(f"8 clients x 7 requests, queue of 6: {sum(r[0] == 200 for r in results)} served at once, "
      f"{sum(r[0] == 429 for r in results)} after a 429 (Retry-After)")
st, b, _ = s.req("GET", "/metrics")
check(b"difflet_queue_depth 0" in b, "the queue drains")
s.stop()

# ---- data parallel: two model processes -------------------------------------------
s = Server(os.path.join(tmp, "r5"), replicas=2)
t0 = time.time()
r = s.wait_ready()
while time.time() - t0 < 60 and sum(p > 0 for p in s.json("GET", "/ready")[1]["model_pids"]) < 2:
    time.sleep(0.05)
pids = s.json("GET", "/ready")[1]["model_pids"]
check(len(pids) == 2 and all(p > 0 for p in pids) and pids[0] != pids[1], f"two ready model processes: {pids}")
kill_one(pids[0], signal.SIGKILL)
t0 = time.time()  # once the supervisor has seen the death, requests go to the survivor
while time.time() - t0 < 10 and s.json("GET", "/ready")[1]["model_pids"][0] == pids[0]:
    time.sleep(0.02)
st, png = image(s, {"prompt": "while one restarts", "steps": 3})
check(st == 200, "the other replica serves while one is replaced")
res2 = []
ts = [threading.Thread(target=lambda: res2.append(image(s, {"prompt": "dp", "steps": 30})[0])) for _ in range(4)]
[t.start() for t in ts]
[t.join(120) for t in ts]
check(res2 == [200] * 4, f"requests spread over the replicas: {res2}")
s.stop()

# ---- a parallel replica: its model process is a 2-rank mpirun job ---------------------
if shutil.which("mpirun"):
    bad = os.path.join(tmp, "bad-par.json")
    with open(bad, "w") as f:
        json.dump({"model": MODEL, "parallel": "tp=4"}, f)
    p = subprocess.run([BIN, "serve", "--profile", bad], capture_output=True, text=True, timeout=60)
    check(p.returncode == 2 and "not divisible by tp=4" in p.stderr, f"an infeasible layout is refused: {p.stderr}")
    s = Server(os.path.join(tmp, "r6"), parallel="cp=2:ulysses")
    r = s.wait_ready(timeout=120)
    check(r and r["ready"], "a cp=2 model process (an mpirun job of 2 ranks) gets ready")
    st, png = image(s, {"prompt": "a red circle", "steps": 4, "seed": 5})
    check(st == 200 and png == before_crash, "the 2-rank replica gives the bytes one rank gave (Ulysses is exact)")

    def session(sid, settle=0):  # live processes of the mpirun job's session (a SIGKILL takes a moment)
        t0 = time.time()
        while True:
            out = []
            for d in os.listdir("/proc"):
                try:
                    with open(f"/proc/{d}/stat") as f:
                        fields = f.read().rsplit(")", 1)[1].split()
                    if int(fields[3]) == sid and fields[0] != "Z":
                        out.append(int(d))
                except (OSError, ValueError, IndexError):
                    pass
            if not out or time.time() - t0 >= settle:
                return out
            time.sleep(0.05)

    # a running job cancelled mid-way: every rank leaves it together, the next request is unchanged
    st, j = s.json("POST", "/v1/jobs", {"prompt": "slow", "steps": 2000, "seed": 3})
    t0 = time.time()
    while time.time() - t0 < 30 and s.json("GET", f"/v1/jobs/{j['id']}")[1].get("steps_done", 0) < 2:
        time.sleep(0.02)
    st2, c = s.json("POST", f"/v1/jobs/{j['id']}/cancel")
    e = s.wait_job(j["id"])
    check(st == 202 and e and e["status"] == "cancelled" and 0 < e.get("steps_done", 0) < 2000,
          f"a running job on the 2-rank replica is cancelled at a step boundary: {e}")
    st, png = image(s, {"prompt": "a red circle", "steps": 4, "seed": 5})
    check(st == 200 and png == before_crash, "after the cancel the ranks are still in step (same bytes)")
    old = r["model_pid"]
    check(len(session(old)) >= 3, f"mpirun and its 2 ranks share a session: {session(old)}")
    kill_one(old, signal.SIGKILL)  # mpirun dies: every rank goes, a new job starts
    t0 = time.time()
    while time.time() - t0 < 60 and s.json("GET", "/ready")[1].get("model_pid") in (old, -1, 0, None):
        time.sleep(0.05)
    r = s.wait_ready(timeout=60)
    check(r and r["model_pid"] != old and not session(old, 5), f"replaced, with no rank of the old job left: {session(old)}")
    st, png = image(s, {"prompt": "a red circle", "steps": 4, "seed": 5})
    check(st == 200 and png == before_crash, "the replacement gives the same bytes")
    new = r["model_pid"] if r else 0
    s.stop()
    check(not session(new, 5), f"stopping the server leaves no rank behind: {session(new)}")

# ---- hardening (issue 23): strict bodies, deadlines without a model process, cancels --
s = Server(os.path.join(tmp, "h1"))
s.wait_ready()
st, b, _ = s.req("POST", "/v1/images/generations", raw=b'{"prompt": "x"} trailing garbage')
check(st == 400, f"trailing garbage after the JSON body is refused: {st} {b[:120]}")
st, b, _ = s.req("POST", "/v1/images/generations", raw=b'{"prompt": "a\xff\xfe"}')
e = json.loads(b).get("error", {}) if b else {}
check(st == 400 and e.get("param") == "prompt" and "UTF-8" in e.get("message", ""), f"invalid UTF-8 prompt: {st} {b[:160]}")
for body, param in (({"prompt": "x", "model": 123}, "model"), ({"prompt": "x", "user": {"a": 1}}, "user"),
                    ({"prompt": "x", "size": "32x48x48"}, "size"), ({"prompt": "x", "size": " +32x048junk"}, "size"),
                    ({"prompt": "x", "seed": 2 ** 53}, "seed")):
    st, b, _ = s.req("POST", "/v1/images/generations", body)
    e = json.loads(b).get("error", {}) if b else {}
    check(st == 400 and e.get("param") == param, f"400 naming `{param}` for {body}: {st} {b[:160]}")
s.stop()

# one client holding idle connections denies nobody: per-IP limit, idle timeout, a health listener
s = Server(os.path.join(tmp, "h4"), health_port=0, idle_timeout_s=2, max_connections_per_ip=16)
s.wait_ready()
import socket
idle = []
for _ in range(256):
    try:
        idle.append(socket.create_connection(("127.0.0.1", s.port), timeout=5))
    except OSError:
        break
t0 = time.time()
with urllib.request.urlopen(f"http://127.0.0.1:{s.health_port}/health", timeout=5) as r:
    ok = r.status == 200
check(ok and time.time() - t0 < 2, f"the health listener answers while {len(idle)} idle connections are open")
time.sleep(3.5)  # past the idle timeout: the server has closed them
closed = 0
for sk in idle:
    try:
        sk.settimeout(0.5)
        closed += sk.recv(1) == b""
    except OSError:
        closed += 1
    sk.close()
check(closed == len(idle), f"idle connections are closed after idle_timeout_s ({closed} of {len(idle)})")
check(s.req("GET", "/health", timeout=5)[0] == 200, "the API answers again")
s.stop()

# with no model process able to start, a request ends at its deadline (504), not never
cache = os.environ["DIFFLET_CACHE"]
os.environ["DIFFLET_CACHE"] = os.path.join(tmp, "empty-cache")  # nothing compiled there, and no_compile: it cannot load
s = Server(os.path.join(tmp, "h2"), request_timeout_s=3, no_compile=1)
os.environ["DIFFLET_CACHE"] = cache
t0 = time.time()
st, j = s.json("POST", "/v1/images/generations", {"prompt": "x", "steps": 2}, timeout=30)
dt = time.time() - t0
check(st == 504 and dt < 10, f"504 within the deadline without a model process: {st} after {dt:.1f} s {j}")
st, j = s.json("POST", "/v1/jobs", {"prompt": "x", "steps": 2})
e = s.wait_job(j["id"], timeout=15) if st == 202 else None
check(e and e["status"] == "failed" and "timed out" in (e.get("error") or ""), f"a queued job fails at its deadline: {e}")
s.stop()

# two model processes, two back-to-back cancels of running jobs: both end cancelled
s = Server(os.path.join(tmp, "h3"), replicas=2)
s.wait_ready()
t0 = time.time()
while time.time() - t0 < 60 and sum(p > 0 for p in s.json("GET", "/ready")[1]["model_pids"]) < 2:
    time.sleep(0.05)
ids = [s.json("POST", "/v1/jobs", {"prompt": f"slow {i}", "steps": 3000, "seed": i})[1]["id"] for i in range(2)]
t0 = time.time()
while time.time() - t0 < 30 and not all(s.json("GET", f"/v1/jobs/{i}")[1].get("status") == "in_progress" for i in ids):
    time.sleep(0.02)
for i in ids:
    s.json("POST", f"/v1/jobs/{i}/cancel")
ends = [s.wait_job(i, timeout=60) for i in ids]
check(all(e and e["status"] == "cancelled" for e in ends), f"both back-to-back cancels hold: {[e and e['status'] for e in ends]}")
# a running job's cancel survives a crash of the API process
st, j = s.json("POST", "/v1/jobs", {"prompt": "slow", "steps": 3000, "seed": 9})
t0 = time.time()
while time.time() - t0 < 30 and s.json("GET", f"/v1/jobs/{j['id']}")[1].get("status") != "in_progress":
    time.sleep(0.02)
s.json("POST", f"/v1/jobs/{j['id']}/cancel")
s.stop(signal.SIGKILL)
s = Server(os.path.join(tmp, "h3"), replicas=2)
s.wait_ready()
e = s.wait_job(j["id"], timeout=60)
check(e and e["status"] == "cancelled", f"the cancel of a running job is kept across an API crash: {e}")
s.stop()

# one server per job store: a second one on the same store is refused (jobs would run twice)
s = Server(os.path.join(tmp, "h5"))
s.wait_ready()
p2 = subprocess.run([BIN, "serve", "--deployment", s.path], capture_output=True, text=True, timeout=60)
check(p2.returncode != 0 and "in use by another difflet serve" in p2.stderr, f"a second server on the store is refused: {p2.returncode} {p2.stderr[-200:]}")
s.stop(signal.SIGKILL)
s = Server(os.path.join(tmp, "h5"))  # a killed server's store is free at once
check(s.wait_ready() is not None, "the store is free again after the first server died")
s.stop()

# ---- API key --------------------------------------------------------------------------
s = Server(os.path.join(tmp, "r4"), api_key="sekret")
s.wait_ready()
check(s.req("GET", "/health", headers={"Authorization": "none"})[0] == 200, "health needs no key")
check(s.req("GET", "/v1/models", headers={"Authorization": "Bearer wrong"})[0] == 401, "401 with a wrong key")
check(s.req("GET", "/v1/models", headers={"Authorization": "Bearer sekre"})[0] == 401, "401 with a prefix of the key")
check(s.req("GET", "/v1/models")[0] == 200, "200 with the key")
check(s.req("GET", "/v1/models", headers={"Authorization": "bearer sekret"})[0] == 200, "the scheme in any case")
on_disk = "".join(open(os.path.join(tmp, "r4", f), errors="replace").read() for f in os.listdir(os.path.join(tmp, "r4"))
                  if f.endswith(".json"))
check("profile" in "".join(os.listdir(os.path.join(tmp, "r4"))) and "sekret" not in on_disk,
      "the API key is not written into the results folder (the model processes' profile.json)")
check(s.req("GET", "/", headers={"Authorization": "none"})[0] == 200, "the page itself needs no key (it holds no data)")
# an upload without the key is refused before its body is read (no memory held for it)
with socket.create_connection(("127.0.0.1", s.port), timeout=10) as sk:
    sk.sendall(b"POST /v1/images/edits HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: multipart/form-data; boundary=b\r\n"
               b"Content-Length: 40000000\r\n\r\n" + b"x" * 1000)
    try:
        head = sk.recv(4096)
    except OSError as ex:
        head = repr(ex).encode()
check(head.startswith(b"HTTP/1.1 401"), f"an unauthenticated 40 MB upload gets 401 before its body: {head[:120]!r}")
if chrome:  # the page with a key: given once as #key=..., kept in the browser, sent as Bearer
    before = s.req("GET", "/metrics")[1].decode()
    # polling (EventSource sends no key) runs out a virtual time budget before the job
    # ends in real time: this one is driven over the DevTools protocol instead
    b = None
    try:
        b = Browser(chrome, os.path.join(tmp, "chrome-key"))
        b.cmd("Page.navigate", url=f"http://127.0.0.1:{s.port}/?autorun=1&steps=2#key=sekret")
        fig = "document.querySelector('#q_gallery figure')"
        ok = b.wait(f"$('q_status').textContent.startsWith('completed 2/2') && {fig}.querySelector('img').naturalWidth == 32"
                    f" && {fig}.querySelector('img').src.startsWith('blob:')", 90)
        check(ok and b.js("localStorage.getItem('difflet_key') == 'sekret' && location.hash == ''"),
              f"with a key (#key=, kept in the browser) the page polls its job and shows the picture fetched with the key:"
              f" {b.js('document.body.innerText')!r}")
    except Exception as ex:
        check(False, f"the page with a key, driven over the DevTools protocol: {ex!r}")
    finally:
        if b:
            b.close()
    after = s.req("GET", "/metrics")[1].decode()
    n202 = lambda t: sum(int(l.split()[-1]) for l in t.splitlines() if l.startswith('difflet_requests_total{status="202"}'))
    check(n202(after) > n202(before), "with a key the page submits a job (Authorization from the browser)")
# url responses are signed: fetchable without the key (as OpenAI's are), a changed signature is not
st, j = s.json("POST", "/v1/images/generations", {"prompt": "x", "steps": 2, "response_format": "url"})
u = j["data"][0]["url"] if st == 200 else ""
try:
    with urllib.request.urlopen(u, timeout=30) as r:
        ok = r.status == 200 and r.read(4) == b"\x89PNG"
except Exception as ex:
    ok = False
check(ok, f"a signed url is fetched without the key: {u}")
bad_u = u[:-1] + ("0" if u[-1] != "0" else "1")
try:
    urllib.request.urlopen(bad_u, timeout=30)
    bad = 200
except urllib.error.HTTPError as ex:
    bad = ex.code
check(bad == 401, f"a tampered signature is refused: {bad}")
st, b, _ = s.req("POST", "/v1/jobs", {"prompt": "x", "steps": 2}, headers={"Authorization": "Bearer sekret", "Origin": "http://evil.example"})
check(st == 403, f"a cross-origin POST (another site's page) is refused: {st}")
st, b, _ = s.req("POST", "/v1/jobs", {"prompt": "x", "steps": 2},
                 headers={"Authorization": "Bearer sekret", "Origin": f"http://127.0.0.1:{s.port}"})
check(st == 202, f"a same-origin POST is accepted: {st} {b[:120]}")
check(s.req("PUT", "/v1/models")[0] == 405, "405 for a method the API does not have")
for m, path in (("GET", "/v1/images/generations"), ("GET", "/v1/images/edits"), ("POST", "/v1/models"), ("GET", "/v1/jobs"),
                ("POST", "/metrics")):
    st = s.req(m, path)[0]
    check(st == 405, f"405 for {m} {path}, a route that takes another method: {st}")
import socket
with socket.create_connection(("127.0.0.1", s.port), timeout=10) as sk:
    sk.sendall(b"GET /health HTTP/1.1\r\nConnection: close\r\n\r\n")
    resp = sk.recv(4096)
check(resp.startswith(b"HTTP/1.1 400"), f"HTTP/1.1 without Host: {resp[:40]}")
mode = os.stat(os.path.join(tmp, "r4", "jobs.sqlite")).st_mode & 0o777
check(mode == 0o600, f"the job store is private to the server's user ({oct(mode)})")
s.stop()
os.environ["DIFFLET_API_KEY"] = "from-env"
s = Server(os.path.join(tmp, "r4e"))
s.key = "from-env"
s.wait_ready()
check(s.req("GET", "/v1/models", headers={"Authorization": "Bearer sekret"})[0] == 401 and s.req("GET", "/v1/models")[0] == 200,
      "the key from DIFFLET_API_KEY (never on the command line)")
s.stop()
del os.environ["DIFFLET_API_KEY"]

# a corrupt program cache: the model process rebuilds the program instead of failing forever
for root, dirs, files in os.walk(os.path.join(os.environ["DIFFLET_CACHE"], "programs")):
    if "weights.bin" in files:
        f = os.path.join(root, "weights.bin")
        with open(f, "r+b") as fh:
            fh.seek(os.path.getsize(f) // 2)
            b = fh.read(1)
            fh.seek(os.path.getsize(f) // 2)
            fh.write(bytes([b[0] ^ 0xff]))
s = Server(os.path.join(tmp, "r7"))
r = s.wait_ready(timeout=120)
st, png = image(s, {"prompt": "a red circle", "steps": 4, "seed": 5})
check(r and r["ready"] and st == 200 and png == before_crash, f"corrupt programs are rebuilt: ready {r}, {st}, same bytes {png == before_crash}")
s.stop()

subprocess.run(["rm", "-rf", tmp])
passed, failed = counts()
print(f"test_serve: {passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
