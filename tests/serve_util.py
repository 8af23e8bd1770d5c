"""What the serve tests share: the pass/fail tally, a `difflet serve` on a free
loopback port (its deployment written beside its results folder), HTTP helpers, and
the guarded signal to a model process. Standard library only."""
import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request

_tally = {"passed": 0, "failed": 0}


def check(cond, what):
    if cond:
        _tally["passed"] += 1
    else:
        _tally["failed"] += 1
        print("FAIL:", what, flush=True)


def counts():
    """(passed, failed) so far"""
    return _tally["passed"], _tally["failed"]


def kill_one(pid, sig):
    """signal one model process: never pid 0 or -1, which would signal the test's own
    process group or every process (what /ready reports for a process not running)"""
    if not isinstance(pid, int) or pid <= 1:
        raise RuntimeError(f"no model process to signal (pid {pid!r})")
    os.kill(pid, sig)


class Server:
    """`binary serve --deployment results-<suffix>.json` (or argv as given): the first
    stdout line names the port; a health_port >= 0 in the deployment gives a second
    line. key: sent as Bearer on every request that brings no Authorization."""

    def __init__(self, binary, results, deployment=None, argv=None, suffix="profile", stop_wait=10):
        self.results, self.stop_wait = results, stop_wait
        deployment = deployment or {}
        self.key = deployment.get("api_key")
        if argv is None:
            self.path = f"{results}-{suffix}.json"
            with open(self.path, "w") as f:
                json.dump(deployment, f)
            argv = [binary, "serve", "--deployment", self.path]
        self.p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                  env=dict(os.environ, DIFFLET_LOG="warn"), text=True)
        self.port = int(self.p.stdout.readline().split("127.0.0.1:")[1].split()[0])
        if deployment.get("health_port", -1) >= 0:
            self.health_port = int(self.p.stdout.readline().split("127.0.0.1:")[1].split("/")[0])

    def req(self, method, path, body=None, raw=None, headers=None, timeout=60, port=None):
        """(status, body bytes, headers)"""
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        h = {"Content-Type": "application/json"} if body is not None else {}
        h.update(headers or {})
        if self.key and "Authorization" not in h:
            h["Authorization"] = "Bearer " + self.key
        r = urllib.request.Request(f"http://127.0.0.1:{port or self.port}{path}", data=data, method=method, headers=h)
        try:
            with urllib.request.urlopen(r, timeout=timeout) as resp:
                return resp.status, resp.read(), dict(resp.headers)
        except urllib.error.HTTPError as e:
            return e.code, e.read(), dict(e.headers)

    def json(self, method, path, body=None, **kw):
        """(status, parsed body or None)"""
        st, b, _ = self.req(method, path, body, **kw)
        try:
            return st, json.loads(b)
        except ValueError:
            return st, None

    def wait_ready(self, timeout=60):
        """/ready's body once it answers 200, None after timeout"""
        t0 = time.time()
        while time.time() - t0 < timeout:
            st, j = self.json("GET", "/ready")
            if st == 200:
                return j
            time.sleep(0.05)
        return None

    def wait_done(self, path, timeout=60):
        """a job's or video's object once it is no longer queued or running (or the
        answer when it is not a 200), None after timeout"""
        t0 = time.time()
        while time.time() - t0 < timeout:
            st, j = self.json("GET", path)
            if st != 200 or (j and j["status"] not in ("queued", "in_progress")):
                return j
            time.sleep(0.05)
        return None

    def stop(self, sig=signal.SIGTERM):
        self.p.send_signal(sig)
        try:
            self.p.wait(self.stop_wait)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
