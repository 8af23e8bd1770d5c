#!/usr/bin/env python3
"""The hardening scenarios of issue 23, re-run against a real `difflet serve` on
127.0.0.1 (standard library only), with the counts printed as Markdown tables:

1. bad input: a battery of malformed requests of many kinds (bad JSON, wrong types,
   huge / negative / non-finite numbers, unknown fields, invalid UTF-8, oversized
   bodies, bad sizes, wrong methods, bad paths and ids, bad / missing / lowercase
   Bearer auth, bad content types, raw-socket malformed HTTP, multipart bodies for
   POST /v1/images/edits), sent twice; every answer is counted by status class,
   every connection that got no answer is counted; afterwards the server must be
   alive, /health must answer and a normal generation must give the same bytes as
   before. The server's RSS, descriptors and threads are read from /proc before
   and after each round (a leak shows as growth in the second round).
2. overload: a small queue_capacity, concurrent bursts of POST /v1/jobs and of
   POST /v1/images/generations beyond it; 202/200 vs 429 counted; every accepted
   job must complete exactly once (its status, its content, the denoise-step
   counter, the job store's rows and the results folder's files).
3. faults: (a) the model process (found as a child of the server in /proc, never
   from a number the server reports) SIGKILLed 9 times at random moments during
   jobs with fixed seeds: the time from the kill to /ready 200 again, and every job
   completed byte-identical to an undisturbed run of its seed, or failed and, re-run,
   was identical; (b) the API process SIGKILLed (twice) with jobs queued and in
   progress, restarted on the same job store and results folder: no accepted job
   lost, none run twice.

    tests/serve_scenarios.py path/to/difflet tests/data [--only 1,2,3]

Exits 1 when an invariant fails (a crash, a connection with no answer where one was
possible, a malformed request answered 2xx or 5xx other than the documented 501/505,
a lost or duplicated job, output that is not byte-identical). Runs in about 3-5
minutes on 2 cores (the tiny FLUX model at 32x48, 2-8 steps).
"""
import base64
import concurrent.futures
import json
import os
import random
import re
import select
import signal
import socket
import sqlite3
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import serve_util  # noqa: E402

if len(sys.argv) < 3:
    sys.exit(__doc__)
BIN, DATA = os.path.abspath(sys.argv[1]), sys.argv[2]
ONLY = set(sys.argv[4].split(",")) if len(sys.argv) > 4 and sys.argv[3] == "--only" else {"1", "2", "3"}
MODEL = os.path.abspath(os.path.join(DATA, "flux", "dev"))
SIZE = "32x48"
KEY = "sekret-23"
T_START = time.time()
failures = []
rows = []  # (scenario, what, count) for the summary table


def fail(what):
    failures.append(what)
    print("FAIL:", what, flush=True)


def note(scenario, what, value):
    rows.append((scenario, what, value))


def log(msg):
    print(f"[{time.time() - T_START:6.1f}s] {msg}", flush=True)


# ---- processes ---------------------------------------------------------------------


def proc_stat(pid):
    """(state, ppid) of a live process, None when there is none"""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return fields[0], int(fields[1])
    except (OSError, ValueError, IndexError):
        return None


def proc_cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def children(ppid, marker=b"serve-worker"):
    """live children of ppid whose command line has marker (the model processes of a
    server this script started: found in /proc, never from what the server says)"""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        pid = int(d)
        st = proc_stat(pid)
        if st and st[1] == ppid and st[0] not in "ZX" and marker in proc_cmdline(pid):
            out.append(pid)
    return sorted(out)


def kill_checked(pid, parent, sig=signal.SIGKILL, marker=b"serve-worker"):
    """signal a process only when it is an int > 1, not this script, and (now) a child
    of parent (a server this script started) running marker"""
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 1 or pid == os.getpid():
        raise RuntimeError(f"refusing to signal pid {pid!r}")
    st = proc_stat(pid)
    if not st or st[1] != parent or marker not in proc_cmdline(pid):
        raise RuntimeError(f"refusing to signal pid {pid}: not a {marker.decode()} child of {parent} ({st})")
    os.kill(pid, sig)


def proc_status(pid):
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                k, _, v = line.partition(":")
                out[k] = v.strip()
        out["fds"] = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        pass
    return out


class Server(serve_util.Server):
    """difflet serve on a free loopback port (port 0), its deployment written next to
    its results folder; stderr to <results>-stderr.log, stdout drained; restartable on
    the same store (start). The HTTP helpers are serve_util's."""

    def __init__(self, results, **deployment):
        dep = {"model": MODEL, "sizes": [SIZE], "results_dir": results, "port": 0, "request_timeout_s": 120,
               "cancel_grace_s": 2, "queue_capacity": 16, "max_steps": 50, "max_prompt_bytes": 200}
        dep.update(deployment)
        self.results = results
        self.key = dep.get("api_key")
        self.path = results + "-deployment.json"
        with open(self.path, "w") as f:
            json.dump(dep, f)
        self.start()

    def start(self):
        self.log = open(self.results + "-stderr.log", "ab")
        self.p = subprocess.Popen([BIN, "serve", "--deployment", self.path], stdout=subprocess.PIPE,
                                  stderr=self.log, env=dict(os.environ, DIFFLET_LOG="info"))
        self.pid = self.p.pid
        line = b""
        end = time.time() + 120
        while b"\n" not in line and time.time() < end:
            if select.select([self.p.stdout], [], [], 1)[0]:
                b = os.read(self.p.stdout.fileno(), 4096)
                if not b:
                    break
                line += b
        if b"127.0.0.1:" not in line:
            raise RuntimeError(f"the server did not say its port: {line!r} (see {self.results}-stderr.log)")
        self.port = int(line.split(b"127.0.0.1:")[1].split()[0].rstrip(b"/"))
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self):
        try:
            while os.read(self.p.stdout.fileno(), 4096):
                pass
        except (OSError, ValueError):
            pass

    def alive(self):
        return self.p.poll() is None

    def req(self, method, path, body=None, timeout=120, **kw):
        """as serve_util's, and (None, the error, {}) when the server is not there"""
        try:
            return super().req(method, path, body, timeout=timeout, **kw)
        except (urllib.error.URLError, OSError) as e:
            return None, repr(e).encode(), {}

    def ready(self):
        st, j = self.json("GET", "/ready", timeout=10)
        return st == 200, j

    def wait_ready(self, timeout=120, not_pid=None, poll=0.05):
        end = time.time() + timeout
        while time.time() < end:
            ok, j = self.ready()
            if ok and j and (not_pid is None or j.get("model_pid") != not_pid):
                return j
            if not self.alive():
                return None
            time.sleep(poll)
        return None

    def job(self, jid):
        return self.json("GET", f"/v1/jobs/{jid}", timeout=30)[1]

    def wait_job(self, jid, timeout=120):
        end = time.time() + timeout
        while time.time() < end:
            j = self.job(jid)
            if j and j.get("status") not in ("queued", "in_progress"):
                return j
            time.sleep(0.05)
        return None

    def content(self, jid):
        st, b, _ = self.req("GET", f"/v1/jobs/{jid}/content")
        return b if st == 200 else None

    def metric(self, prefix):
        st, b, _ = self.req("GET", "/metrics", timeout=30)
        if st != 200:
            return None
        return sum(float(l.split()[-1]) for l in b.decode().splitlines() if l.startswith(prefix))

    def model_pids(self):
        return children(self.pid)

    def sigkill(self):
        if self.alive():
            os.kill(self.pid, signal.SIGKILL)  # the Popen child itself: trusted
        self.p.wait()
        self.log.close()

    def stop(self):
        if self.alive():
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(20)
            except subprocess.TimeoutExpired:
                fail(f"the server {self.pid} did not stop within 20 s of SIGTERM")
                self.p.kill()
                self.p.wait()
        self.log.close()


def store_rows(db):
    """the job store's rows (read-only; the server that wrote them is gone)"""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
    try:
        return {r[0]: {"status": r[1], "result": r[2], "finished": r[3]}
                for r in con.execute("SELECT id, status, result, finished FROM jobs")}
    finally:
        con.close()


def png_1x1():
    """a real 32x48 RGB PNG (for the edits battery), built with zlib"""
    w, h = 32, 48
    raw = b"".join(b"\x00" + bytes([200, 30, 30]) * w for _ in range(h))

    def chunk(t, d):
        return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xffffffff)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


# ---- raw HTTP ----------------------------------------------------------------------


def status_of(buf):
    """the final status of a response (interim 1xx skipped), None when none came"""
    while buf.startswith(b"HTTP/1.") and len(buf) >= 12 and buf[9:12].isdigit():
        code = int(buf[9:12])
        if 100 <= code < 200 and b"\r\n\r\n" in buf:
            buf = buf.split(b"\r\n\r\n", 1)[1]
            continue
        return code
    return None


def exchange(port, data, half_close=False, timeout=15, pause=None):
    """send data on a new connection (pause: (at, seconds) to stop sending for a
    while), optionally close our side, read until the server closes; (status, bytes,
    error)"""
    err = None
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
    except OSError as e:
        return None, b"", f"connect: {e!r}"
    s.settimeout(timeout)
    try:
        if pause:
            s.sendall(data[:pause[0]])
            time.sleep(pause[1])
            s.sendall(data[pause[0]:])
        else:
            s.sendall(data)
    except OSError as e:
        err = f"send: {e!r}"
    if half_close:
        try:
            s.shutdown(socket.SHUT_WR)
        except OSError:
            pass
    buf = b""
    try:
        while True:
            b = s.recv(65536)
            if not b:
                break
            buf += b
    except socket.timeout:
        err = err or "no answer within the timeout"
    except OSError as e:
        err = err or f"recv: {e!r}"
    s.close()
    return status_of(buf), buf, err


def http(port, method, path, body=b"", headers=(), auth=KEY, host=True, ctype="application/json", version="HTTP/1.1",
         length=None):
    h = []
    if host:
        h.append(("Host", f"127.0.0.1:{port}"))
    if auth:
        h.append(("Authorization", f"Bearer {auth}"))
    if body or method in ("POST", "PUT", "PATCH"):
        if ctype:
            h.append(("Content-Type", ctype))
        h.append(("Content-Length", str(len(body) if length is None else length)))
    h += list(headers)
    if isinstance(path, str):
        path = path.encode()
    head = method.encode() + b" " + path + b" " + version.encode() + b"\r\n"
    for k, v in h:
        head += (k.encode() if isinstance(k, str) else k) + b": " + (v.encode() if isinstance(v, str) else v) + b"\r\n"
    return head + b"\r\n" + body


def multipart(fields, boundary="difflet23boundary"):
    out = b""
    for name, value, filename, ctype in fields:
        out += f"--{boundary}\r\n".encode()
        disp = f'Content-Disposition: form-data; name="{name}"'
        if filename:
            disp += f'; filename="{filename}"'
        out += disp.encode() + b"\r\n"
        if ctype:
            out += f"Content-Type: {ctype}\r\n".encode()
        out += b"\r\n" + (value if isinstance(value, bytes) else str(value).encode()) + b"\r\n"
    return out + f"--{boundary}--\r\n".encode()


# ---- 1. bad input ------------------------------------------------------------------


def battery(port, job_id):
    """[(category, name, bytes, options, allowed)]: allowed is the set of status classes
    or codes that are a right answer ("4xx" by default)"""
    cases = []

    def add(cat, name, data, allowed=("4xx",), **opt):
        cases.append((cat, name, data, opt, allowed))

    def post_json(cat, name, body, routes=("/v1/images/generations", "/v1/jobs"), **kw):
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        for r in routes:
            add(cat, f"{name} -> {r}", http(port, "POST", r, raw, **kw))

    # bad JSON
    for i, raw in enumerate([b"{not json", b"", b"{", b"}", b"[", b"null", b"true", b"1", b'"a string"', b"[1, 2]",
                             b'{"prompt": }', b'{"prompt": "x",}', b"{'prompt': 'x'}", b'{"prompt": "x"} trailing',
                             b'{"prompt": "x"}{"prompt": "y"}', b'{"prompt": "x" "steps": 2}', b"\x00",
                             b'{"prompt": "abc', b'{"prompt": "\\u12"}', b'{"prompt": "\\x41"}',
                             b"[" * 20000 + b"]" * 20000, b'{"a":' * 10000 + b"1" + b"}" * 10000,
                             b'{"prompt": "x", "steps": 2, }', b'{"prompt": "x"\x00}', b'{"prompt": "x", "steps": 0x10}']):
        post_json("bad JSON", f"#{i} {raw[:24]!r}", raw)
    # what a strict JSON parser refuses and a lax one may take: control bytes as white
    # space, a NUL after the value, numbers JSON does not have, raw control characters and
    # lone surrogates in strings, an escaped NUL that would cut a C string short
    for name, raw in [("a control byte before the object", b'\x01{"prompt": "x", "steps": 2}'),
                      ("a control byte as white space", b'{"prompt":\x1f"x", "steps": 2}'),
                      ("a NUL after the object", b'{"prompt": "x", "steps": 2}\x00'),
                      ("a leading zero", b'{"prompt": "x", "steps": 02}'),
                      ("a plus sign", b'{"prompt": "x", "steps": +2}'),
                      ("a number ending in '.'", b'{"prompt": "x", "steps": 2.}'),
                      ("a number starting with '.'", b'{"prompt": "x", "steps": 2, "guidance_scale": .5}'),
                      ("a raw control character in a string", b'{"prompt": "a\x01b", "steps": 2}'),
                      ("a raw line feed in a string", b'{"prompt": "a\nb", "steps": 2}'),
                      ("a lone surrogate escape", b'{"prompt": "a\\ud800", "steps": 2}'),
                      ("an escaped NUL in the prompt", b'{"prompt": "x\\u0000hidden", "steps": 2}'),
                      ("an escaped NUL in size", b'{"prompt": "x", "steps": 2, "size": "32x48\\u0000junk"}')]:
        post_json("lax JSON", name, raw)
    # non-finite numbers (JSON has none: NaN / Infinity are not JSON)
    for raw in (b'{"prompt": "x", "steps": NaN}', b'{"prompt": "x", "guidance_scale": Infinity}',
                b'{"prompt": "x", "seed": -Infinity}', b'{"prompt": "x", "guidance_scale": nan}'):
        post_json("NaN / Infinity", raw.decode(), raw)
    # wrong types
    for field, value in [("prompt", 5), ("prompt", None), ("prompt", ["x"]), ("prompt", {"t": "x"}), ("prompt", True),
                         ("steps", "4"), ("steps", 2.5), ("steps", True), ("steps", [2]), ("n", "1"), ("n", 1.5),
                         ("seed", "7"), ("seed", 1.5), ("seed", False), ("size", 64), ("size", [32, 48]),
                         ("guidance_scale", "high"), ("guidance_scale", []), ("true_cfg_scale", "x"),
                         ("negative_prompt", 5), ("response_format", 1), ("output_format", 5),
                         ("output_compression", "70"), ("cache", 5), ("model", 123), ("user", {"a": 1}),
                         ("quality", 5), ("style", 1), ("background", 2), ("stream", "yes")]:
        body = {"prompt": "x", "steps": 2}
        body[field] = value
        post_json("wrong type", f"{field}={value!r}", body)
    # huge, negative, out of range
    for field, value in [("steps", 0), ("steps", -1), ("steps", 51), ("steps", 10 ** 9), ("steps", 10 ** 30),
                         ("n", 0), ("n", 5), ("n", -1), ("seed", -1), ("seed", 2 ** 53), ("seed", 2 ** 64),
                         ("output_compression", -1), ("output_compression", 101), ("prompt", "x" * 300),
                         ("user", "u" * 300), ("partial_images", 9), ("output_format", "gif"),
                         ("response_format", "jpeg"), ("cache", "calibrated:/etc/passwd"), ("cache", "cadence:-3"),
                         ("model", "dall-e-3"), ("quality", "ultra")]:
        body = {"prompt": "x", "steps": 2}
        body[field] = value
        post_json("out of range", f"{field}={str(value)[:20]}", body)
    for raw in (b'{"prompt": "x", "steps": 1e400}', b'{"prompt": "x", "seed": 1e400}', b'{"prompt": "x", "n": -1e400}',
                b'{"prompt": "x", "steps": 2, "guidance_scale": 1e400}', b'{"prompt": "x", "steps": 2, "true_cfg_scale": -1e400}'):
        post_json("huge number (overflows double)", raw.decode(), raw)
    # bad sizes
    for size in ["64x64x64", "64x64", "0x0", "-32x48", "32x", "x48", "", "32x48 ", " 32x48", "32*48", "32x48\u0000",
                 "99999999999999999999x48", "32x-48", "auto\n"]:
        post_json("bad size", repr(size), {"prompt": "x", "steps": 2, "size": size})
    # unknown fields
    for field in ["bogus", "Prompt", "prompt ", "", "__proto__", "steps\u0000"]:
        body = {"prompt": "x", "steps": 2, field: 1}
        post_json("unknown field", repr(field), body)
    # invalid UTF-8
    for name, raw in [("0xff 0xfe", b'{"prompt": "a\xff\xfe", "steps": 2}'),
                      ("truncated sequence", b'{"prompt": "a\xc3", "steps": 2}'),
                      ("overlong '/'", b'{"prompt": "a\xc0\xaf", "steps": 2}'),
                      ("UTF-16 surrogate in UTF-8", b'{"prompt": "a\xed\xa0\x80", "steps": 2}'),
                      ("5-byte form", b'{"prompt": "a\xf8\x88\x80\x80\x80", "steps": 2}'),
                      ("beyond U+10FFFF", b'{"prompt": "a\xf4\x90\x80\x80", "steps": 2}'),
                      ("in negative_prompt", b'{"prompt": "a", "negative_prompt": "\xff", "steps": 2}'),
                      ("in a key", b'{"prompt": "a", "st\xffeps": 2}'),
                      ("in size", b'{"prompt": "a", "size": "32\xff48", "steps": 2}'),
                      ("latin-1 with a latin-1 charset", b'{"prompt": "caf\xe9", "steps": 2}')]:
        post_json("invalid UTF-8", name, raw, ctype="application/json; charset=iso-8859-1" if "latin" in name else "application/json")
    # oversized bodies (limit 64 KiB)
    big = json.dumps({"prompt": "x", "negative_prompt": "n" * 70000}).encode()
    for r in ("/v1/images/generations", "/v1/jobs"):
        add("oversized body", f"70 KB JSON -> {r}", http(port, "POST", r, big))
        add("oversized body", f"1 MiB JSON -> {r}", http(port, "POST", r, b'{"prompt": "' + b"x" * (1 << 20) + b'"}'))
        add("oversized body", f"Content-Length 100000, no body sent -> {r}", http(port, "POST", r, b"", length=100000))
        add("oversized body", f"Content-Length 2^40 -> {r}", http(port, "POST", r, b"", length=1 << 40))
    # bad content types: bodies that are not JSON
    for ctype, body in [("application/x-www-form-urlencoded", b"prompt=x&steps=2"), ("text/xml", b"<prompt>x</prompt>"),
                        ("multipart/form-data; boundary=b", b'--b\r\nContent-Disposition: form-data; name="prompt"\r\n\r\nx\r\n--b--\r\n'),
                        ("application/octet-stream", bytes(range(256))), ("text/plain", b"a red circle")]:
        post_json("bad content type", ctype.split(";")[0], body, ctype=ctype)
    # wrong methods
    for method, path in [("PUT", "/v1/jobs"), ("PATCH", "/v1/images/generations"), ("DELETE", "/v1/jobs"),
                         ("DELETE", f"/v1/jobs/{job_id}"), ("OPTIONS", "/v1/models"), ("HEAD", "/v1/models"),
                         ("TRACE", "/"), ("FOO", "/health"), ("get", "/health"), ("GET", "/v1/images/generations"),
                         ("GET", "/v1/jobs"), ("POST", "/v1/models"), ("POST", "/metrics"), ("PUT", f"/v1/jobs/{job_id}/cancel"),
                         ("GET", f"/v1/jobs/{job_id}/cancel"), ("POST", f"/v1/jobs/{job_id}"), ("DELETE", "/v1/models")]:
        add("wrong method", f"{method} {path.replace(job_id, 'ID')}", http(port, method, path, b"{}" if method in ("PUT", "PATCH", "POST") else b""))
    # bad paths
    for path in ["/v1/nothing", "/v1//jobs", "/../../etc/passwd", "/v1/jobs/../../etc/passwd", "/%00", "/v1/images/generations/",
                 "/V1/JOBS", "/v1/models/" + "m" * 4000, "/v1/models/%2e%2e%2fetc", "/v1/imäges", "/v1/images/generations%00",
                 "/v1/images", "http://example.com/v1/models", "/v1/models/dev/extra", "/v1/models%00junk", "/health%00junk"]:
        add("bad path", path[:40], http(port, "GET" if "generations" not in path else "POST", path, b""))
    # bad ids
    for path in ["/v1/jobs/0123456789abcdef", "/v1/jobs/xyz", "/v1/jobs/'%20OR%201=1", "/v1/jobs/0123456789abcdef0",
                 "/v1/jobs/ABCDEF0123456789", "/v1/jobs/0123456789abcdef/content", "/v1/jobs/0123456789abcdef/events",
                 f"/v1/jobs/{job_id}/nope", f"/v1/jobs/{job_id}x", "/v1/jobs/-1", "/v1/jobs/" + "a" * 5000,
                 "/v1/videos/video_0123456789abcdef", "/v1/jobs/%30123456789abcdef", "/v1/jobs/video_"]:
        add("bad id", path.replace(job_id, "ID")[:40], http(port, "GET", path, b""))
    add("bad id", "cancel of an unknown job", http(port, "POST", "/v1/jobs/0123456789abcdef/cancel", b""))
    # auth (a key is set)
    for name, value in [("wrong key", "Bearer wrong"), ("a prefix of the key", "Bearer " + KEY[:-1]), ("the key + 1", "Bearer " + KEY + "x"),
                        ("lowercase bearer, wrong key", "bearer wrong"), ("BEARER, empty key", "BEARER "), ("Bearer alone", "Bearer"),
                        ("Basic", "Basic " + base64.b64encode(KEY.encode()).decode()), ("no scheme", KEY),
                        ("Token scheme", "Token " + KEY), ("key with a NUL", "Bearer " + KEY[:3] + "\x00" + KEY[3:]),
                        ("key in latin-1", "Bearer s\xe9krit"), ("Bearer twice", "Bearer Bearer " + KEY)]:
        hv = value.encode("latin-1")
        for r, body in (("/v1/models", b""), ("/v1/jobs", b'{"prompt": "x", "steps": 2}')):
            add("bad auth", f"{name} -> {r}", http(port, "POST" if body else "GET", r, body, auth=None, headers=[("Authorization", hv)]))
    for r, body in (("/v1/models", b""), ("/v1/jobs", b'{"prompt": "x", "steps": 2}'), ("/metrics", b""), ("/ready", b"")):
        add("bad auth", f"no Authorization -> {r}", http(port, "POST" if body else "GET", r, body, auth=None))
    add("bad auth", "a cross-origin POST", http(port, "POST", "/v1/jobs", b'{"prompt": "x", "steps": 2}', headers=[("Origin", "http://evil.example")]))
    add("bad auth", "a key in the query string", http(port, "GET", f"/v1/models?api_key={KEY}", b"", auth=None))

    # raw socket: malformed HTTP
    def raw(name, data, allowed=("4xx",), **opt):
        add("malformed HTTP", name, data, allowed, **opt)
    raw("HTTP/1.1 without Host (GET)", b"GET /health HTTP/1.1\r\nConnection: close\r\n\r\n")
    raw("HTTP/1.1 without Host (POST)", http(port, "POST", "/v1/jobs", b'{"prompt": "x", "steps": 2}', host=False))
    raw("two Host headers", http(port, "GET", "/v1/models", headers=[("Host", "other")]))
    for v in ("HTTP/2.0", "HTTP/3.0", "HTTP/0.9"):
        raw(f"version {v}", http(port, "GET", "/v1/models", version=v), ("4xx", 505))
    for v in ("HTTP/1.1x", "HTTPS/1.1", "http/1.1", "HTTP/11", "HTTP/1.1 extra", "HTTP/1", "HTTP/a.b", ""):
        raw(f"version {v!r}", http(port, "GET", "/v1/models", version=v))
    raw("no version (HTTP/0.9 request)", b"GET /health\r\n\r\n")
    raw("two spaces after the method", b"GET  /health HTTP/1.1\r\nHost: x\r\n\r\n")
    raw("a space before the method", b" GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    raw("a 40-byte method", b"G" * 40 + b" /health HTTP/1.1\r\nHost: x\r\n\r\n")
    raw("a method with '('", b"GE(T /health HTTP/1.1\r\nHost: x\r\n\r\n")
    raw("a NUL in the request line", b"GET /hea\x00lth HTTP/1.1\r\nHost: x\r\n\r\n")
    raw("a tab in the target", b"GET /he\talth HTTP/1.1\r\nHost: x\r\n\r\n")
    raw("URI of 9000 bytes", http(port, "GET", "/v1/models/" + "a" * 9000))
    raw("URI of 70000 bytes", http(port, "GET", "/" + "a" * 70000))
    raw("a header of 40000 bytes", http(port, "GET", "/v1/models", headers=[("X-Big", "b" * 40000)]))
    raw("1500 headers", http(port, "GET", "/v1/models", headers=[(f"X-H{i}", "v" * 20) for i in range(1500)]))
    raw("a header line without a colon", http(port, "GET", "/v1/models", headers=[(b"NoColonHere", b"")]).replace(b"NoColonHere: ", b"NoColonHere"))
    raw("a space before the colon", http(port, "GET", "/v1/models").replace(b"Host:", b"Host :"))
    raw("obsolete line folding", http(port, "GET", "/v1/models", headers=[("X-A", "a\r\n b")]))
    raw("a control byte in a header value", http(port, "GET", "/v1/models", headers=[("X-A", "a\x01b")]))
    raw("a NUL in a header name", http(port, "GET", "/v1/models", headers=[(b"X-\x00A", b"b")]))
    rnd = random.Random(23)
    for i in range(4):
        raw(f"garbage bytes #{i}", bytes(rnd.randrange(256) for _ in range(300)) + b"\r\n\r\n")
    raw("a TLS ClientHello", bytes.fromhex("16030100a5010000a10303") + bytes(rnd.randrange(256) for _ in range(160)))
    raw("an SSH banner", b"SSH-2.0-OpenSSH_9.6\r\n\r\n")
    raw("only empty lines, then our side closed", b"\r\n\r\n\r\n", half_close=True)
    raw("a partial request line, then our side closed", b"GET /hea", half_close=True)
    raw("a head without its empty line, then our side closed", b"GET /health HTTP/1.1\r\nHost: x\r\n", half_close=True)
    raw("a head without its empty line, then silence (idle timeout)", b"GET /v1/models HTTP/1.1\r\nHost: x\r\n")
    raw("Content-Length: abc", http(port, "POST", "/v1/jobs", b"{}", length="abc"))
    raw("Content-Length: -1", http(port, "POST", "/v1/jobs", b"{}", length=-1))
    raw("Content-Length: 1e3", http(port, "POST", "/v1/jobs", b"{}", length="1e3"))
    raw("two Content-Lengths that differ", http(port, "POST", "/v1/jobs", b"{}", headers=[("Content-Length", "3")]))
    raw("Content-Length and Transfer-Encoding", http(port, "POST", "/v1/jobs", b"0\r\n\r\n", headers=[("Transfer-Encoding", "chunked")]))
    raw("Transfer-Encoding: gzip", http(port, "POST", "/v1/jobs", b"", ctype=None, length=None).replace(b"Content-Length: 0", b"Transfer-Encoding: gzip"), ("4xx", 501))
    raw("Transfer-Encoding: chunked, chunked", http(port, "POST", "/v1/jobs", b"0\r\n\r\n", ctype=None).replace(b"Content-Length: 5", b"Transfer-Encoding: chunked, chunked"), ("4xx", 501))

    def chunked(body_chunks, version="HTTP/1.1", extra=b""):
        return (f"POST /v1/jobs {version}\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {KEY}\r\nContent-Type: application/json\r\n"
                f"Transfer-Encoding: chunked\r\n").encode() + extra + b"\r\n" + body_chunks
    raw("chunked in HTTP/1.0", chunked(b"0\r\n\r\n", version="HTTP/1.0"))
    raw("chunked: a size that is not hex", chunked(b"zz\r\nabc\r\n0\r\n\r\n"))
    raw("chunked: data longer than its size", chunked(b"2\r\nabcdef\r\n0\r\n\r\n"))
    raw("an upload announced over 50 MB (edits)", (f"POST /v1/images/edits HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {KEY}\r\n"
                                                  "Content-Type: multipart/form-data; boundary=b\r\nContent-Length: 60000000\r\n\r\n").encode())
    raw("chunked: over 64 KiB", chunked(b"".join(b"4000\r\n" + b"x" * 0x4000 + b"\r\n" for _ in range(5)) + b"0\r\n\r\n"))
    raw("chunked: well-formed, a body that is not JSON", chunked(b"5\r\nhello\r\n0\r\n\r\n"))
    raw("chunked: well-formed, the JSON without a prompt", chunked(b"2\r\n{}\r\n0\r\n\r\n"))
    raw("chunked: truncated, then our side closed", chunked(b"10\r\nabc"), half_close=True)
    raw("chunked: Expect 100-continue, no body, our side closed", chunked(b"", extra=b"Expect: 100-continue\r\n"), half_close=True)
    raw("Content-Length body truncated, then our side closed", http(port, "POST", "/v1/jobs", b'{"prompt": "x"', length=100), half_close=True)
    raw("Content-Length body truncated, then silence (idle timeout)", http(port, "POST", "/v1/jobs", b'{"prompt": "x"', length=100))
    raw("a body on GET that is malformed JSON", http(port, "GET", "/v1/jobs/0123456789abcdef", b"{{{{"))
    raw("pipelined: a bad POST, then garbage", http(port, "POST", "/v1/jobs", b"{}") + b"\x00\x01garbage\r\n\r\n")
    raw("OPTIONS *", b"OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n")
    raw("CONNECT", b"CONNECT 127.0.0.1:22 HTTP/1.1\r\nHost: 127.0.0.1:22\r\n\r\n")
    raw("bare LF line ends without Host", b"GET /health HTTP/1.1\nConnection: close\n\n")
    raw("a request sent byte by byte slowly, no Host", b"GET /health HTTP/1.1\r\n\r\n", pause=(5, 1.0))
    raw("Upgrade to h2c without Host", b"GET / HTTP/1.1\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n\r\n")
    raw("the HTTP/2 preface", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", ("4xx", 505))

    # multipart bodies for POST /v1/images/edits
    img = png_1x1()

    def edit(name, body, ctype="multipart/form-data; boundary=difflet23boundary", method="POST"):
        add("edits (multipart)", name, http(port, method, "/v1/images/edits", body, ctype=ctype), edits=True)
    edit("a JSON body", b'{"prompt": "x", "image": "abc"}', ctype="application/json")
    edit("multipart without a boundary", multipart([("prompt", "x", None, None)]), ctype="multipart/form-data")
    edit("a boundary the body does not have", multipart([("prompt", "x", None, None)], boundary="other"))
    edit("no image part", multipart([("prompt", "x", None, None), ("steps", "2", None, None)]))
    edit("an image part that is text", multipart([("prompt", "x", None, None), ("image", b"not a picture", "a.png", "image/png")]))
    edit("a truncated PNG", multipart([("prompt", "x", None, None), ("image", img[:40], "a.png", "image/png")]))
    edit("no prompt", multipart([("image", img, "a.png", "image/png"), ("steps", "2", None, None)]))
    edit("an unknown part", multipart([("prompt", "x", None, None), ("image", img, "a.png", "image/png"), ("bogus", "1", None, None)]))
    edit("a mask that is not a picture", multipart([("prompt", "x", None, None), ("image", img, "a.png", "image/png"),
                                                    ("mask", b"nope", "m.png", "image/png")]))
    edit("60 parts", multipart([("prompt", "x", None, None), ("image", img, "a.png", "image/png")]
                               + [(f"f{i}", "1", None, None) for i in range(58)]))
    edit("no closing boundary", multipart([("prompt", "x", None, None), ("image", img, "a.png", "image/png")])[:-24])
    edit("n=9", multipart([("prompt", "x", None, None), ("image", img, "a.png", "image/png"), ("n", "9", None, None)]))
    edit("size 64x64x64", multipart([("prompt", "x", None, None), ("image", img, "a.png", "image/png"), ("size", "64x64x64", None, None)]))
    edit("steps abc", multipart([("prompt", "x", None, None), ("image", img, "a.png", "image/png"), ("steps", "abc", None, None)]))
    edit("steps 2.5", multipart([("prompt", "x", None, None), ("image", img, "a.png", "image/png"), ("steps", "2.5", None, None)]))
    edit("strength 7", multipart([("prompt", "x", None, None), ("image", img, "a.png", "image/png"), ("strength", "7", None, None)]))
    edit("a prompt in invalid UTF-8", multipart([("prompt", b"a\xff", None, None), ("image", img, "a.png", "image/png")]))
    edit("two images", multipart([("prompt", "x", None, None), ("image[]", img, "a.png", "image/png"), ("image[]", img, "b.png", "image/png")]))
    edit("stream with n=2", multipart([("prompt", "x", None, None), ("image", img, "a.png", "image/png"), ("stream", "true", None, None),
                                       ("n", "2", None, None)]))
    edit("a part without Content-Disposition", b"--difflet23boundary\r\nContent-Type: text/plain\r\n\r\nx\r\n--difflet23boundary--\r\n")
    edit("GET", b"", ctype=None, method="GET")
    return cases


def classify(code):
    return "none" if code is None else f"{code // 100}xx"


def run_battery(srv, cases, round_no):
    results = [None] * len(cases)

    def one(k):
        cat, name, data, opt, allowed = cases[k]
        t0 = time.time()
        # a request taken by mistake may be a generation that waits behind others: a long timeout
        code, buf, err = exchange(srv.port, data, half_close=opt.get("half_close", False), pause=opt.get("pause"), timeout=90)
        results[k] = (code, buf, err, time.time() - t0)
    with concurrent.futures.ThreadPoolExecutor(6) as ex:
        list(ex.map(one, range(len(cases))))
    return results


def scenario_bad_input(tmp):
    log("1. bad input: starting a server with an API key")
    # a queue long enough that a malformed request the server takes by mistake is run,
    # not refused with a 429 that would hide it
    srv = Server(os.path.join(tmp, "bad"), api_key=KEY, idle_timeout_s=2, queue_capacity=256)
    if not srv.wait_ready():
        fail("bad input: the server did not get ready")
        return srv
    body = {"prompt": "a red circle on blue", "steps": 2, "seed": 7}
    st, j = srv.json("POST", "/v1/images/generations", body)
    ref = base64.b64decode(j["data"][0]["b64_json"]) if st == 200 else None
    if ref is None:
        fail(f"bad input: a normal generation before the battery failed: {st} {j}")
    st, j = srv.json("POST", "/v1/jobs", {"prompt": "an id for the bad-id cases", "steps": 2, "seed": 1})
    job_id = j["id"] if st == 202 else "0123456789abcdef"
    srv.wait_job(job_id)
    model_pid0 = srv.model_pids()
    time.sleep(0.5)
    s0 = proc_status(srv.pid)
    cases = battery(srv.port, job_id)
    per_round = []
    for rnd in (1, 2):
        t0 = time.time()
        res = run_battery(srv, cases, rnd)
        time.sleep(3)  # refused connections linger 2 s: let them close before /proc is read
        per_round.append((res, proc_status(srv.pid), time.time() - t0))
        log(f"   round {rnd}: {len(cases)} requests in {per_round[-1][2]:.1f} s")
    alive = srv.alive()
    health = srv.req("GET", "/health", timeout=10)[0] if alive else None
    st, j = srv.json("POST", "/v1/images/generations", body) if alive else (None, None)
    after = base64.b64decode(j["data"][0]["b64_json"]) if st == 200 else None
    restarts = srv.metric("difflet_model_restarts_total") if alive else None
    model_pid1 = srv.model_pids()
    # lowercase bearer with the right key is documented as accepted: a control, not a malformed request
    ctl = exchange(srv.port, http(srv.port, "GET", "/v1/models", auth=None, headers=[("Authorization", "bearer " + KEY)]))[0]

    # ---- counts
    cats = {}
    bad = []
    edits_404 = edits_other = 0
    for rnd, (res, _, _) in enumerate(per_round, 1):
        for (cat, name, data, opt, allowed), (code, buf, err, dt) in zip(cases, res):
            c = cats.setdefault(cat, {"n": 0, "2xx": 0, "3xx": 0, "4xx": 0, "5xx": 0, "none": 0, "codes": {}})
            c["n"] += 1
            c[classify(code)] += 1
            c["codes"][code] = c["codes"].get(code, 0) + 1
            if opt.get("edits"):
                if code == 404:
                    edits_404 += 1
                else:
                    edits_other += 1
            # a 429 says the request passed validation (only the queue refused it)
            ok = code is not None and code != 429 and (classify(code) in allowed or code in allowed)
            if not ok:
                bad.append((rnd, cat, name, code, err, buf[:200], dt))
    print("\n### 1. Bad input: answers by category (both rounds)\n")
    print("| category | requests | 2xx | 4xx | 5xx | no answer | status codes |")
    print("|---|---:|---:|---:|---:|---:|---|")
    tot = {"n": 0, "2xx": 0, "3xx": 0, "4xx": 0, "5xx": 0, "none": 0}
    for cat, c in cats.items():
        for k in tot:
            tot[k] += c[k]
        codes = ", ".join(f"{k if k is not None else 'none'}: {v}" for k, v in sorted(c["codes"].items(), key=lambda kv: (kv[0] is None, kv[0] or 0)))
        print(f"| {cat} | {c['n']} | {c['2xx']} | {c['4xx']} | {c['5xx']} | {c['none']} | {codes} |")
    print(f"| **all** | **{tot['n']}** | {tot['2xx']} | {tot['4xx']} | {tot['5xx']} | {tot['none']} | |")
    if bad:
        print("\nRequests answered with a status outside what is right for them, or not at all:\n")
        seen = set()
        for rnd, cat, name, code, err, head, dt in bad:
            if (cat, name) in seen:
                continue
            seen.add((cat, name))
            n = sum(1 for b in bad if b[1] == cat and b[2] == name)
            print(f"- [{cat}] {name}: {code} ({n}x; {err or ''}; after {dt:.1f} s) {head!r}")
            fail(f"bad input [{cat}] {name}: answered {code} {err or ''}")
    n_cases = len(cases)
    note("1 bad input", "distinct malformed requests (each sent twice)", n_cases)
    note("1 bad input", "requests sent", tot["n"])
    note("1 bad input", "answered 4xx", tot["4xx"])
    note("1 bad input", "answered 5xx (501/505 for unsupported Transfer-Encoding / HTTP version)",
         f"{tot['5xx']} ({', '.join(f'{k}: {v}' for c in cats.values() for k, v in c['codes'].items() if k and k >= 500) or 'none'})")
    note("1 bad input", "answered 2xx (accepted)", tot["2xx"])
    note("1 bad input", "connections with no answer", tot["none"])
    edits_codes = [r[0] for res, _, _ in per_round for case, r in zip(cases, res) if case[3].get("edits")]
    edits_absent = edits_404 > 0 and all(code in (404, 413) for code in edits_codes)
    note("1 bad input", "POST /v1/images/edits (multipart) answered 404 / other"
         + (" (404: the route is absent from this build; the others are 413s for a body over 64 KiB, refused before routing)" if edits_absent else ""),
         f"{edits_404} / {edits_other}")
    note("1 bad input", "server alive after the battery / /health", f"{'yes' if alive else 'NO'} / {health}")
    note("1 bad input", "normal generation after: status, same bytes as before",
         f"{st}, {'yes' if after is not None and after == ref else 'NO'}")
    note("1 bad input", "model process restarts during the battery", f"{restarts:.0f}" if restarts is not None else "?")
    note("1 bad input", "lowercase `bearer` + right key (control)", ctl)
    kib = lambda s: int(s.get("VmRSS", "0 kB").split()[0])
    r1, r2 = per_round[0][1], per_round[1][1]
    note("1 bad input", "server RSS KiB: before / after round 1 / after round 2", f"{kib(s0)} / {kib(r1)} / {kib(r2)}")
    note("1 bad input", "server fds: before / after 1 / after 2", f"{s0.get('fds')} / {r1.get('fds')} / {r2.get('fds')}")
    note("1 bad input", "server threads: before / after 1 / after 2", f"{s0.get('Threads')} / {r1.get('Threads')} / {r2.get('Threads')}")
    if not alive:
        fail(f"bad input: the server died (exit {srv.p.returncode})")
    if health != 200:
        fail(f"bad input: /health answered {health}")
    if after is None or after != ref:
        fail(f"bad input: a normal generation afterwards: {st}, same bytes: {after == ref}")
    if restarts:
        fail(f"bad input: the model process restarted {restarts:.0f} times during the battery (pids {model_pid0} -> {model_pid1})")
    if ctl != 200:
        fail(f"bad input: lowercase `bearer` with the right key answered {ctl} (documented: accepted)")
    grow2 = kib(r2) - kib(r1)
    if grow2 > 8192:
        fail(f"bad input: the server's RSS grew {grow2} KiB during the second round (a leak?)")
    if r2.get("fds") is not None and s0.get("fds") is not None and r2["fds"] > s0["fds"] + 2:
        fail(f"bad input: the server holds {r2['fds']} descriptors after the battery, {s0['fds']} before (a leak?)")
    return srv


# ---- 2. overload -------------------------------------------------------------------


def scenario_overload(tmp):
    log("2. overload: queue_capacity 3")
    res = os.path.join(tmp, "over")
    srv = Server(res, queue_capacity=3)
    if not srv.wait_ready():
        fail("overload: the server did not get ready")
        srv.stop()
        return
    steps = 4
    m0 = srv.metric("difflet_denoise_steps_total")
    lock = threading.Lock()
    accepted, refused, other, retry_after = [], 0, [], []
    sync_ok, sync_refused, sync_other, sync_jobs = 0, 0, [], []
    seq = [0]

    def post_job():
        nonlocal refused
        with lock:
            seq[0] += 1
            i = seq[0]
        st, b, h = srv.req("POST", "/v1/jobs", {"prompt": f"burst {i}", "steps": steps, "seed": i})
        with lock:
            if st == 202:
                accepted.append(json.loads(b)["id"])
            elif st == 429:
                refused += 1
                retry_after.append(h.get("Retry-After"))
            else:
                other.append((st, b[:120]))

    def post_sync(i):
        nonlocal sync_ok, sync_refused
        st, b, h = srv.req("POST", "/v1/images/generations", {"prompt": f"sync {i}", "steps": 2, "seed": 1000 + i})
        with lock:
            if st == 200:
                j = json.loads(b)
                png = base64.b64decode(j["data"][0]["b64_json"])
                if png[:8] != b"\x89PNG\r\n\x1a\n":
                    sync_other.append((st, "not a PNG"))
                else:
                    sync_ok += 1
                    sync_jobs.append(j.get("difflet", {}).get("job"))
            elif st == 429:
                sync_refused += 1
                retry_after.append(h.get("Retry-After"))
            else:
                sync_other.append((st, b[:120]))
    bursts, per_burst, n_sync = 4, 14, 10
    t0 = time.time()
    for k in range(bursts):
        ts = [threading.Thread(target=post_job) for _ in range(per_burst)]
        [t.start() for t in ts]
        [t.join(120) for t in ts]
        time.sleep(1.0)
    for jid in list(accepted):  # the queue drains, then a burst of synchronous generations
        srv.wait_job(jid, timeout=180)
    ts = [threading.Thread(target=post_sync, args=(i,)) for i in range(n_sync)]
    [t.start() for t in ts]
    [t.join(180) for t in ts]
    ends = {jid: srv.wait_job(jid, timeout=180) for jid in accepted}
    dt = time.time() - t0
    completed = [jid for jid, e in ends.items() if e and e["status"] == "completed"]
    lost = [jid for jid, e in ends.items() if not e or e["status"] != "completed"]
    contents = {jid: srv.content(jid) for jid in completed}
    no_content = [jid for jid, c in contents.items() if not c or c[:8] != b"\x89PNG\r\n\x1a\n"]
    time.sleep(0.3)
    m1 = srv.metric("difflet_denoise_steps_total")
    qd = srv.metric("difflet_queue_depth")
    want_steps = len(completed) * steps + sync_ok * 2
    srv.stop()
    rows_ = store_rows(srv_db(res))
    files = [f for f in os.listdir(res) if f.endswith((".png", ".jpg", ".webp"))]
    known = set(accepted) | {j for j in sync_jobs if j}
    extra_rows = sorted(set(rows_) - known)
    missing_rows = sorted(known - set(rows_))
    not_done = sorted(j for j in known if j in rows_ and rows_[j]["status"] != "completed")
    dup_results = len({r["result"] for r in rows_.values() if r["result"]}) != sum(1 for r in rows_.values() if r["result"])
    print(f"\n(overload: {bursts} bursts of {per_burst} concurrent POST /v1/jobs, then one of {n_sync} concurrent POST /v1/images/generations; {dt:.1f} s)")
    note("2 overload", "POST /v1/jobs sent", bursts * per_burst)
    note("2 overload", "  accepted 202 / refused 429 / other", f"{len(accepted)} / {refused} / {len(other)}")
    note("2 overload", "POST /v1/images/generations sent (one burst)", n_sync)
    note("2 overload", "  answered 200 with a PNG / 429 / other", f"{sync_ok} / {sync_refused} / {len(sync_other)}")
    note("2 overload", "429s with Retry-After", f"{sum(1 for r in retry_after if r)} of {len(retry_after)}")
    note("2 overload", "accepted jobs completed with content / lost", f"{len(completed) - len(no_content)} / {len(lost) + len(no_content)}")
    note("2 overload", "denoise steps counted / expected (more: a job ran twice)", f"{m1 - m0:.0f} / {want_steps}")
    note("2 overload", "job store rows / accepted jobs; rows not accepted; missing", f"{len(rows_)} / {len(known)}; {len(extra_rows)}; {len(missing_rows)}")
    note("2 overload", "result files / completed rows", f"{len(files)} / {sum(1 for r in rows_.values() if r['status'] == 'completed')}")
    note("2 overload", "queue depth at the end", f"{qd:.0f}" if qd is not None else "?")
    if other or sync_other:
        fail(f"overload: answers other than 202/200/429: {other[:3]} {sync_other[:3]}")
    if refused + sync_refused == 0:
        fail("overload: no request was refused: the bursts did not pass the queue's capacity")
    if any(not r for r in retry_after):
        fail("overload: a 429 without Retry-After")
    if lost or no_content:
        fail(f"overload: accepted jobs lost or without content: {[(j, ends[j]) for j in lost[:3]]} {no_content[:3]}")
    if m0 is None or m1 is None or m1 - m0 != want_steps:
        fail(f"overload: {m1} - {m0} denoise steps counted, {want_steps} expected (a job run twice, or one not run)")
    if extra_rows or missing_rows or not_done or dup_results:
        fail(f"overload: the job store: rows not accepted {extra_rows[:3]}, missing {missing_rows[:3]}, not completed {not_done[:3]}, shared results {dup_results}")
    if len(files) != sum(1 for r in rows_.values() if r["status"] == "completed"):
        fail(f"overload: {len(files)} result files for {sum(1 for r in rows_.values() if r['status'] == 'completed')} completed jobs")
    if qd:
        fail(f"overload: queue depth {qd} after everything finished")


def srv_db(results):
    return os.path.join(results, "jobs.sqlite")


# ---- 3. faults ---------------------------------------------------------------------

PROMPT, STEPS, SEEDS = "a red circle in the centre on a blue background", 8, (11, 12, 13, 14)


def job_body(seed):
    return {"prompt": PROMPT, "steps": STEPS, "seed": seed}


def scenario_model_kills(tmp, n_kills=9):
    log(f"3a. faults: the model process SIGKILLed {n_kills} times")
    srv = Server(os.path.join(tmp, "kill-model"), queue_capacity=32)
    ref = {}
    if not srv.wait_ready():
        fail("model kills: the server did not get ready")
        srv.stop()
        return ref, []
    for seed in SEEDS:  # the undisturbed run
        st, j = srv.json("POST", "/v1/jobs", job_body(seed))
        e = srv.wait_job(j["id"]) if st == 202 else None
        ref[seed] = srv.content(j["id"]) if e and e["status"] == "completed" else None
        if not ref[seed]:
            fail(f"model kills: the undisturbed job of seed {seed} failed: {e}")
    if not all(ref.values()):
        srv.stop()
        return ref, []
    rnd = random.Random(2300)
    jobs = []  # (id, seed)
    recov, kills, kill_states = [], 0, {"in_progress": 0, "between jobs": 0}
    for k in range(n_kills):
        for _ in range(2):
            seed = rnd.choice(SEEDS)
            st, j = srv.json("POST", "/v1/jobs", job_body(seed))
            if st != 202:
                fail(f"model kills: a job was refused ({st} {j})")
                continue
            jobs.append((j["id"], seed))
        # a random moment: mostly while a job runs (after 0-2 of its steps' time), sometimes right after one
        end = time.time() + 10
        while time.time() < end and (srv.job(jobs[-2][0]) or {}).get("status") == "queued":
            time.sleep(0.01)
        time.sleep(rnd.uniform(0, 0.8))
        pids = srv.model_pids()
        if len(pids) != 1:
            fail(f"model kills: {len(pids)} model processes are children of the server: {pids}")
            break
        running = any((srv.job(j) or {}).get("status") == "in_progress" for j, _ in jobs[-2:])
        kill_checked(pids[0], srv.pid)
        t_kill = time.time()
        kills += 1
        kill_states["in_progress" if running else "between jobs"] += 1
        r = srv.wait_ready(timeout=120, not_pid=pids[0], poll=0.01)
        t_ready = time.time()
        new = srv.model_pids()
        if not r or not new or new[0] == pids[0]:
            fail(f"model kills: no replacement ready within 120 s of kill {k + 1} (/ready {r}, children {new})")
            break
        recov.append(t_ready - t_kill)
    # every job: completed identical, or failed (killed) and re-run identical
    first_ok = rerun_ok = non_identical = lost = failed_other = 0
    details = []
    for jid, seed in jobs:
        e = srv.wait_job(jid, timeout=180)
        if e and e["status"] == "completed":
            if srv.content(jid) == ref[seed]:
                first_ok += 1
            else:
                non_identical += 1
                details.append(f"{jid} (seed {seed}) completed with other bytes")
        elif e and e["status"] == "failed" and "model process" in (e.get("error") or ""):
            st, j = srv.json("POST", "/v1/jobs", job_body(seed))
            e2 = srv.wait_job(j["id"], timeout=180) if st == 202 else None
            if e2 and e2["status"] == "completed" and srv.content(j["id"]) == ref[seed]:
                rerun_ok += 1
            else:
                non_identical += 1
                details.append(f"{jid} (seed {seed}) re-run as {j and j.get('id')}: {e2 and e2['status']}, other bytes")
        elif e:
            failed_other += 1
            details.append(f"{jid}: {e['status']} {e.get('error')}")
        else:
            lost += 1
            details.append(f"{jid}: never finished")
    restarts = srv.metric("difflet_model_restarts_total")
    alive = srv.alive()
    srv.stop()
    # the replacements' own start-up (load, test generation), from the server's log
    with open(srv.results + "-stderr.log", errors="replace") as f:
        startups = [float(x) for x in re.findall(r"model process \d+ \(.*?\) ready \(([\d.]+) s\)", f.read())][1:]
    note("3a model kills", "model process SIGKILLs (in a job / between jobs)",
         f"{kills} ({kill_states['in_progress']} / {kill_states['between jobs']})")
    if recov:
        note("3a model kills", "recovery, kill to /ready 200 (s): min / median / max",
             f"{min(recov):.2f} / {statistics.median(recov):.2f} / {max(recov):.2f}")
    if startups:
        note("3a model kills", "  of which the replacement's own start-up, its log's `ready (X s)`: min / median / max",
             f"{min(startups):.1f} / {statistics.median(startups):.1f} / {max(startups):.1f}")
    note("3a model kills", "difflet_model_restarts_total", f"{restarts:.0f}" if restarts is not None else "?")
    note("3a model kills", "jobs submitted around the kills", len(jobs))
    note("3a model kills", "  completed, byte-identical to the undisturbed run", first_ok)
    note("3a model kills", "  failed by a kill, re-run, byte-identical", rerun_ok)
    note("3a model kills", "  not identical / failed otherwise / lost", f"{non_identical} / {failed_other} / {lost}")
    for d in details:
        print("   ", d)
    if non_identical or failed_other or lost:
        fail(f"model kills: {non_identical} not identical, {failed_other} failed otherwise, {lost} lost: {details[:4]}")
    if restarts is not None and restarts != kills:
        fail(f"model kills: {restarts} restarts counted for {kills} kills")
    if not alive:
        fail("model kills: the API process died")
    return ref, recov


def scenario_api_kills(tmp, ref, rounds=2):
    log(f"3b. faults: the API process SIGKILLed {rounds} times with jobs queued and running")
    res = os.path.join(tmp, "kill-api")
    srv = Server(res, queue_capacity=32)
    if not srv.wait_ready():
        fail("API kills: the server did not get ready")
        srv.stop()
        return
    rnd = random.Random(2301)
    jobs = {}  # id -> seed
    steps_by_life, done_by_life = [], []
    states_at_kill = []
    orphans = []
    done_before = set()
    for k in range(rounds):
        new = {}
        for i in range(6):
            seed = rnd.choice(SEEDS)
            st, j = srv.json("POST", "/v1/jobs", job_body(seed))
            if st == 202:
                new[j["id"]] = seed
            else:
                fail(f"API kills: a job was refused: {st} {j}")
        jobs.update(new)
        # kill once a job of this round is running and another has finished
        ids = list(new)
        end = time.time() + 60
        while time.time() < end:
            stt = [(srv.job(i) or {}).get("status") for i in ids]
            if "in_progress" in stt and "completed" in stt:
                break
            time.sleep(0.02)
        time.sleep(rnd.uniform(0, 0.3))
        workers = srv.model_pids()
        m = srv.metric("difflet_denoise_steps_total")
        srv.sigkill()
        t_kill = time.time()
        rows_ = store_rows(srv_db(res))
        st_count = {}
        for i in jobs:
            s = rows_.get(i, {}).get("status", "missing")
            st_count[s] = st_count.get(s, 0) + 1
        states_at_kill.append(st_count)
        # the old server's counter from just before the kill may miss a job that ended in the last moment:
        # the store says which jobs the old life completed
        done_now = {i for i in jobs if rows_.get(i, {}).get("status") == "completed"}
        done_by_life.append(done_now - done_before)
        steps_by_life.append(m)
        finished_at_kill = {i: (rows_[i]["finished"], rows_[i]["result"]) for i in done_now}
        done_before = done_now
        # the old model process must go with its API process
        for w in workers:
            while time.time() - t_kill < 10 and proc_stat(w) and b"serve-worker" in proc_cmdline(w) and res.encode() in proc_cmdline(w):
                time.sleep(0.05)
            if proc_stat(w) and b"serve-worker" in proc_cmdline(w) and res.encode() in proc_cmdline(w):
                orphans.append(w)
                if isinstance(w, int) and w > 1 and w != os.getpid():
                    os.kill(w, signal.SIGKILL)  # ours: its command line names this run's results folder
        srv.start()
        if not srv.wait_ready():
            fail(f"API kills: the restarted server did not get ready (round {k + 1})")
            srv.stop()
            return
        changed = []
        for i, (f, r) in finished_at_kill.items():
            j = srv.job(i)
            if not j or j.get("status") != "completed" or j.get("finished") != int(f):
                changed.append((i, f, j and j.get("finished")))
        if changed:
            fail(f"API kills: jobs completed before the kill changed after the restart: {changed[:3]}")
    ends = {i: srv.wait_job(i, timeout=180) for i in jobs}
    m_last = srv.metric("difflet_denoise_steps_total")
    completed = [i for i, e in ends.items() if e and e["status"] == "completed"]
    identical = sum(1 for i in completed if srv.content(i) == ref.get(jobs[i]))
    srv.stop()
    rows_ = store_rows(srv_db(res))
    done_by_life.append({i for i in jobs if rows_.get(i, {}).get("status") == "completed"} - done_before)
    # each life's counter against the jobs that life completed: more steps than that is a job run twice
    dup_lives = []  # each life's counter (read just before its kill, the last at the end) against its completions
    for life, (m, done) in enumerate(zip(steps_by_life + [m_last], done_by_life)):
        if m is not None and m > len(done) * STEPS:
            dup_lives.append((life, m, len(done)))
    files = [f for f in os.listdir(res) if f.endswith((".png", ".jpg", ".webp"))]
    ncomp_rows = sum(1 for r in rows_.values() if r["status"] == "completed")
    extra = sorted(set(rows_) - set(jobs))
    for k, s in enumerate(states_at_kill):
        note("3b API kills", f"kill {k + 1}: jobs in the store by status", ", ".join(f"{a} {b}" for a, b in sorted(s.items())))
    note("3b API kills", "accepted jobs / completed after the restarts / lost", f"{len(jobs)} / {len(completed)} / {len(jobs) - len(completed)}")
    note("3b API kills", "completed byte-identical to the undisturbed run", f"{identical} of {len(completed)}")
    note("3b API kills", "jobs completed by each server life", " + ".join(str(len(d)) for d in done_by_life))
    note("3b API kills", "denoise steps counted by each life (at most completed x steps)",
         " + ".join(f"{m:.0f}" if m is not None else "?" for m in steps_by_life + [m_last]))
    note("3b API kills", "jobs run twice (steps beyond a life's completions; result files vs completed rows)",
         f"{len(dup_lives)} lives over; {len(files)} files / {ncomp_rows} rows")
    note("3b API kills", "model processes left behind by a killed API process", len(orphans))
    if len(completed) != len(jobs):
        fail(f"API kills: accepted jobs lost: {[(i, ends[i] and ends[i]['status']) for i in jobs if i not in completed][:4]}")
    if identical != len(completed):
        fail(f"API kills: {len(completed) - identical} completed jobs are not byte-identical to the undisturbed run")
    if dup_lives or len(files) != ncomp_rows or extra:
        fail(f"API kills: a job run twice? lives over their completions {dup_lives}, {len(files)} files for {ncomp_rows} rows, rows not accepted {extra}")
    if orphans:
        fail(f"API kills: model processes {orphans} outlived their SIGKILLed API process by 10 s")


def main():
    tmp = tempfile.mkdtemp(prefix="difflet-scen-")
    os.environ["DIFFLET_CACHE"] = os.path.join(tmp, "cache")
    log(f"difflet {BIN}, model {MODEL}, work folder {tmp}")
    srv = None
    try:
        if "1" in ONLY:
            srv = scenario_bad_input(tmp)
            srv.stop()
            srv = None
        if "2" in ONLY:
            scenario_overload(tmp)
        if "3" in ONLY:
            ref, _ = scenario_model_kills(tmp)
            if ref and all(ref.values()):
                scenario_api_kills(tmp, ref)
            else:
                fail("API kills: skipped (no undisturbed reference)")
    except Exception as ex:  # a scenario that could not go on is a failure, with its reason
        import traceback
        traceback.print_exc()
        fail(f"a scenario stopped: {ex!r}")
    finally:
        if srv:
            srv.stop()
    dt = time.time() - T_START
    note("machine", "load average at the end (1 / 5 / 15 min), CPUs", " / ".join(f"{x:.1f}" for x in os.getloadavg()) + f", {os.cpu_count()}")
    print("\n### Summary\n")
    print("| scenario | count | value |")
    print("|---|---|---|")
    for s, w, v in rows:
        print(f"| {s} | {w} | {v} |")
    print(f"\n{len(failures)} invariant(s) failed; {dt:.0f} s in all (work folder {tmp}{'' if failures else ', removed'})")
    for f in failures:
        print("  FAIL:", f)
    if not failures:
        subprocess.run(["rm", "-rf", tmp])
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
