#!/usr/bin/env python3
"""difflet serve's images API as OpenAI's clients use it, against a real server (the
tiny FLUX test model, 32x48, an API key) on a free loopback port. The first part uses
the standard library only: every parameter OpenAI's images.generate can send is taken
(quality picks the step count when `steps` is absent; style, moderation, complexity,
user and partial_images are accepted and ignored; background is always opaque), the
answer carries OpenAI's fields (revised_prompt, usage with the prompt's T5 token count,
background, output_format, quality, size, safety_identifier), and bad values are 400s
naming the field; POST /v1/images/edits (multipart) does image-to-image and inpainting
(diffusers and OpenAI masks), byte-identical to `generate --image`, and refuses bad
uploads naming the field. The second part drives the `openai` SDK itself
(images.generate in every form, images.edit, models, and its error classes); it runs when `openai` is importable (e.g.
under tools/venv/bin/python) and is skipped with a note otherwise.

    tests/test_serve_openai.py path/to/difflet tests/data
"""
import base64
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

BIN, DATA = sys.argv[1], sys.argv[2]

# The SDK part needs the `openai` package: under tools/venv it is there; otherwise (a
# clean clone, CI) the test makes its own small virtualenv beside the binary, installs
# the SDK from PyPI once, and runs itself again under it. DIFFLET_NO_SDK_VENV=1 skips
# that (the SDK part is then skipped with a note).
try:
    import openai  # noqa: F401
except ImportError:
    if not os.environ.get("DIFFLET_NO_SDK_VENV") and not os.environ.get("DIFFLET_SDK_VENV_TRIED"):
        venv = os.path.join(os.path.dirname(os.path.abspath(BIN)), "sdk-venv")
        py = os.path.join(venv, "bin", "python")
        if not os.path.exists(os.path.join(venv, ".ok")):
            print(f"note: installing the openai SDK into {venv} (once)", flush=True)
            ok = subprocess.run([sys.executable, "-m", "venv", venv]).returncode == 0 and subprocess.run(
                [py, "-m", "pip", "install", "-q", "openai>=1.99,<4"]).returncode == 0
            if not ok:
                print("FAIL: the openai SDK could not be installed into a test virtualenv (PyPI unreachable?); "
                      "set DIFFLET_NO_SDK_VENV=1 to run without the SDK part")
                sys.exit(1)
            open(os.path.join(venv, ".ok"), "w").close()
        os.execve(py, [py] + sys.argv, dict(os.environ, DIFFLET_SDK_VENV_TRIED="1"))
FLUX = os.path.join(DATA, "flux", "dev")
KEY = "sk-test-openai-compat"
T0 = time.time()


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import check, counts  # noqa: E402


tmp = tempfile.mkdtemp(prefix="difflet-serve-openai-")
dep = {"model": FLUX, "sizes": ["32x48", "48x32"], "results_dir": os.path.join(tmp, "r"), "port": 0, "api_key": KEY,
       "request_timeout_s": 60, "queue_capacity": 8, "max_steps": 400}
with open(os.path.join(tmp, "deployment.json"), "w") as f:
    json.dump(dep, f)
proc = subprocess.Popen([BIN, "serve", "--deployment", os.path.join(tmp, "deployment.json")], stdout=subprocess.PIPE,
                        stderr=subprocess.DEVNULL, env=dict(os.environ, DIFFLET_LOG="warn"), text=True)
PORT = int(proc.stdout.readline().split("127.0.0.1:")[1].split()[0])
BASE = f"http://127.0.0.1:{PORT}"


def call(method, path, body=None, key=KEY, timeout=60):
    h = {"Content-Type": "application/json"}
    if key:
        h["Authorization"] = "Bearer " + key
    data = json.dumps(body).encode() if body is not None else None
    r = urllib.request.Request(BASE + path, data=data, method=method, headers=h)
    try:
        with urllib.request.urlopen(r, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        b = e.read()
        return e.code, json.loads(b) if b else None


t0 = time.time()
while time.time() - t0 < 60 and call("GET", "/ready")[0] != 200:
    time.sleep(0.05)

# ---- the parameters and the answer, with urllib ---------------------------------------------
P = "a large red circle in the centre on a blue background"
st, r = call("POST", "/v1/images/generations",
             {"prompt": P, "model": "dev", "n": 1, "size": "auto", "quality": "low", "style": "natural",
              "background": "transparent", "moderation": "low", "complexity": "high", "user": "user-1",
              "stream": False, "partial_images": 2, "response_format": "b64_json", "output_format": "png",
              "output_compression": 100, "seed": 3})
check(st == 200, f"every OpenAI parameter at once: {st} {r}")
if st == 200:
    png = base64.b64decode(r["data"][0]["b64_json"])
    check(png[:8] == b"\x89PNG\r\n\x1a\n", "the answer is a PNG")
    check(r["data"][0]["revised_prompt"] == P, f"revised_prompt is the prompt as given: {r['data'][0].get('revised_prompt')}")
    check(r["background"] == "opaque" and r["output_format"] == "png" and r["size"] == "32x48",
          f"background (never transparent), output_format, size (auto: the first served): {r}")
    check(r["quality"] == "low" and r["difflet"]["steps"] == 7, f"quality low: a quarter of the 28 default steps: {r}")
    check(r["safety_identifier"] == "user-1", f"user is echoed as safety_identifier: {r}")
    # T5's count: "▁a ▁large ▁red ▁circle ▁in ▁the ▁centre ..." plus </s>, as `difflet tokenize` gives it
    tk = subprocess.run([BIN, "tokenize", "--model", FLUX, "--component", "tokenizer_2", "--json", P], capture_output=True,
                        text=True)
    want = len(json.loads(tk.stdout)["ids"]) if tk.returncode == 0 else -1
    u = r["usage"]
    check(u["input_tokens"] == want and u["input_tokens_details"] == {"text_tokens": want, "image_tokens": 0} and
          u["output_tokens"] == 0 and u["total_tokens"] == want and want > 5,
          f"usage counts the prompt's T5 tokens ({want}): {u}")
for q, steps in (("medium", 14), ("hd", 28), ("auto", 28)):
    st, r = call("POST", "/v1/images/generations", {"prompt": "x", "quality": q, "response_format": "url"})
    check(st == 200 and r["difflet"]["steps"] == steps and r["quality"] == ("medium" if q == "medium" else "high"),
          f"quality {q}: {steps} steps: {st} {r if st != 200 else r['difflet']}")
st, r = call("POST", "/v1/images/generations", {"prompt": "x", "quality": "low", "steps": 2, "size": "48x32",
                                                "output_format": "webp", "output_compression": 50})
check(st == 200 and r["difflet"]["steps"] == 2 and "quality" not in r and r["size"] == "48x32" and
      r["output_format"] == "webp" and base64.b64decode(r["data"][0]["b64_json"])[8:12] == b"WEBP",
      f"explicit steps win over quality (no quality reported); webp: {st} {r if st != 200 else r['size']}")
# OpenAI's nulls are the parameter left out
st, r = call("POST", "/v1/images/generations", {"prompt": "x", "steps": 2, "model": None, "quality": None, "n": None,
                                                "style": None, "size": None, "user": None, "response_format": None})
check(st == 200 and len(r["data"]) == 1 and "b64_json" in r["data"][0] and "safety_identifier" not in r,
      f"null parameters are defaults: {st} {r if st != 200 else ''}")
# the asynchronous jobs take the same parameters
st, j = call("POST", "/v1/jobs", {"prompt": "x", "quality": "medium", "style": "vivid", "background": "opaque"})
check(st == 202, f"/v1/jobs takes quality/style/background: {st} {j}")
bad = [
    ({"quality": "ultra"}, "quality"), ({"quality": 3}, "quality"), ({"style": "photo"}, "style"),
    ({"background": "clear"}, "background"), ({"moderation": "high"}, "moderation"), ({"complexity": "x"}, "complexity"),
    ({"stream": "yes"}, "stream"), ({"partial_images": 4}, "partial_images"), ({"stream": True, "n": 2}, "n"),
    ({"partial_images": 1.5}, "partial_images"), ({"user": 5}, "user"), ({"safety_identifier": "x" * 300}, "safety_identifier"),
    ({"output_format": "gif"}, "output_format"), ({"output_format": "svg"}, "output_format"),
    ({"frame_count": 4}, "frame_count"), ({"svg": {}}, "svg"), ({"size": "1024x1024"}, "size"), ({"n": 5}, "n"),
    ({"output_compression": -1}, "output_compression"), ({"temperature": 1}, "temperature"),
]
for extra, param in bad:
    st, e = call("POST", "/v1/images/generations", dict({"prompt": "x"}, **extra))
    e = (e or {}).get("error", {})
    check(st == 400 and e.get("param") == param and e.get("type") == "invalid_request_error",
          f"400 naming `{param}` for {extra}: {st} {e}")


def sse_events(path, body, key=KEY):
    """POST body, read the whole text/event-stream answer: [(event, data dict)]"""
    r = urllib.request.Request(BASE + path, data=json.dumps(body).encode(), method="POST",
                               headers={"Content-Type": "application/json", "Authorization": "Bearer " + key})
    with urllib.request.urlopen(r, timeout=60) as resp:
        ctype, text = resp.headers.get("Content-Type"), resp.read().decode()
    out = []
    for block in text.split("\n\n"):
        ev = [l[7:] for l in block.split("\n") if l.startswith("event: ")]
        data = [l[6:] for l in block.split("\n") if l.startswith("data: ")]
        if ev and data:
            out.append((ev[0], json.loads(data[0])))
    return ctype, out


# stream: true, as OpenAI streams images: the previews, then the picture with usage
ctype, evs = sse_events("/v1/images/generations", {"prompt": P, "stream": True, "partial_images": 2, "steps": 6, "seed": 4,
                                                   "size": "32x48"})
kinds = [e for e, _ in evs]
check(ctype == "text/event-stream" and kinds == ["image_generation.partial_image"] * 2 + ["image_generation.completed"],
      f"stream: two previews then the picture: {ctype} {kinds}")
if len(evs) == 3:
    check([d.get("partial_image_index") for _, d in evs[:2]] == [0, 1] and all(d["type"] == e for e, d in evs),
          "stream: preview indices 0, 1 and types")
    pics = [base64.b64decode(d["b64_json"]) for _, d in evs]
    check(all(p[:4] == b"\x89PNG" and int.from_bytes(p[16:20], "big") == 32 for p in pics) and len(set(pics)) == 3,
          "stream: three different 32-wide PNGs")
    done = evs[2][1]
    check(done["usage"]["input_tokens"] > 5 and done["size"] == "32x48" and done["output_format"] == "png"
          and done["created_at"] > 1e9, f"stream: the completed event's fields: { {k: v for k, v in done.items() if k != 'b64_json'} }")
    st, same = call("POST", "/v1/images/generations", {"prompt": P, "steps": 6, "seed": 4, "size": "32x48"})
    check(st == 200 and base64.b64decode(same["data"][0]["b64_json"]) == pics[2], "stream: the picture is the unstreamed one")
ctype, evs = sse_events("/v1/images/generations", {"prompt": P, "stream": True, "steps": 2})
check([e for e, _ in evs] == ["image_generation.completed"], f"stream without partial_images: the picture alone: {evs and evs[0][0]}")
# a stream's events name its job (SSE id): cancelled by it, the stream ends with an error event
r = urllib.request.Request(BASE + "/v1/images/generations", method="POST",
                           data=json.dumps({"prompt": P, "stream": True, "partial_images": 3, "steps": 400}).encode(),
                           headers={"Content-Type": "application/json", "Authorization": "Bearer " + KEY})
with urllib.request.urlopen(r, timeout=60) as resp:
    first = []  # the first event's id, event and data lines (keep-alive comments may come before it)
    while len(first) < 3:
        line = resp.readline().decode()
        if not line:
            break
        if not line.startswith(":") and (first or line.strip()):
            first.append(line)
    jid = first[0][4:].strip() if first[0].startswith("id: ") else ""
    st, _ = call("POST", f"/v1/jobs/{jid}/cancel", {})
    rest = resp.read().decode()
check(first[1].strip() == "event: image_generation.partial_image" and st == 200, f"stream: the first preview names its job: {first[:2]} {st}")
errd = next((json.loads(l[6:]) for l in rest.split("event: error", 1)[-1].splitlines() if l.startswith("data: ")), {}) \
    if "event: error" in rest else {}
ee = errd.get("error") or {}
check(errd.get("type") == "error" and "cancelled" in str(ee.get("message")) and ee.get("type") and "code" in ee
      and "error" not in ee and "image_generation.completed" not in rest,
      f"stream: a cancelled job ends with an error event, OpenAI's one-level error object: {rest[-300:]}")
st, e = call("POST", "/v1/jobs", {"prompt": "x", "stream": True})
check(st == 400 and e["error"]["param"] == "stream", f"jobs: stream is refused (jobs have /events): {st}")
st, e = call("POST", "/v1/images/generations", {"prompt": "x"}, key=None)
check(st == 401 and e["error"]["code"] == "invalid_api_key", f"no key: 401: {st} {e}")

# ---- POST /v1/images/edits (multipart, as OpenAI's), standard library --------------------------
EDIT = os.path.join(DATA, "flux", "edit")  # a 32x48 init.png and an RGB grey-level mask.png


def multipart(fields, files):
    """a multipart/form-data body: fields {name: str}, files [(name, filename, bytes, type)]"""
    b = "----difflet-test-boundary-7d1f"
    out = b""
    for k, v in fields.items():
        out += f'--{b}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'.encode()
    for name, fn, data, ctype in files:
        out += (f'--{b}\r\nContent-Disposition: form-data; name="{name}"; filename="{fn}"\r\n'
                f"Content-Type: {ctype}\r\n\r\n").encode() + data + b"\r\n"
    return out + f"--{b}--\r\n".encode(), "multipart/form-data; boundary=" + b


def edit_call(fields, files, key=KEY, ctype=None):
    body, ct = multipart(fields, files)
    h = {"Content-Type": ctype or ct, "Authorization": "Bearer " + key}
    r = urllib.request.Request(BASE + "/v1/images/edits", data=body, method="POST", headers=h)
    try:
        with urllib.request.urlopen(r, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        b = e.read()
        return e.code, json.loads(b) if b else None


def png_size(b):
    return int.from_bytes(b[16:20], "big"), int.from_bytes(b[20:24], "big")


init_png = open(os.path.join(EDIT, "init.png"), "rb").read()
mask_png = open(os.path.join(EDIT, "mask.png"), "rb").read()
# an OpenAI-style mask: transparent where the picture is edited (the right half)
import zlib


def rgba_png(w, h, alpha_of):
    raw = b"".join(b"\0" + b"".join(bytes((255, 255, 255, alpha_of(x, y))) for x in range(w)) for y in range(h))
    chunk = lambda t, d: len(d).to_bytes(4, "big") + t + d + zlib.crc32(t + d).to_bytes(4, "big")
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", w.to_bytes(4, "big") + h.to_bytes(4, "big") + bytes((8, 6, 0, 0, 0)))
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


alpha_mask = rgba_png(32, 48, lambda x, y: 0 if x >= 16 else 255)
edits_ok = 0
for what, files, extra in (("image-to-image", [("image", "init.png", init_png, "image/png")], {}),
                           ("inpainting, diffusers mask", [("image", "init.png", init_png, "image/png"),
                                                           ("mask", "mask.png", mask_png, "image/png")], {"strength": "0.9"}),
                           ("inpainting, OpenAI mask", [("image[]", "init.png", init_png, "image/png"),
                                                        ("mask", "m.png", alpha_mask, "image/png")], {"input_fidelity": "high"})):
    st, r = edit_call(dict({"prompt": P, "model": "dev", "steps": "3", "seed": "5", "response_format": "b64_json"}, **extra), files)
    check(st == 200 and r and r["data"][0]["b64_json"], f"edits ({what}): {st} {str(r)[:300]}")
    if st == 200:
        out = base64.b64decode(r["data"][0]["b64_json"])
        check(out[:4] == b"\x89PNG" and png_size(out) == (32, 48) and r["size"] == "32x48", f"edits ({what}): a 32x48 PNG")
        check(r["data"][0]["revised_prompt"] == P and r["usage"]["input_tokens"] > 5, f"edits ({what}): answer fields {r.get('usage')}")
        edits_ok += 1
        if what == "image-to-image":
            first = out
        if what == "inpainting, OpenAI mask":
            check(out != first, "edits: inpainting differs from image-to-image")
# the job's own record does not echo the uploaded pictures back
if edits_ok:
    st, job = call("GET", f"/v1/jobs/{r['difflet']['job']}")
    check(st == 200 and job["request"]["image"].startswith("(a PNG,") and job["request"]["strength"] == 0.6
          and len(json.dumps(job)) < 4000, f"edits: GET /v1/jobs/ID names the picture, not its bytes: {str(job)[:300]}")
# the served edit is the CLI's (same seed, same flow, same prepared input)
if edits_ok:
    cli_out = os.path.join(tmp, "cli_i2i.png")
    cp = subprocess.run([BIN, "generate", "--model", FLUX, "--prompt", P, "--image", os.path.join(EDIT, "init.png"), "--steps", "3",
                         "--seed", "5", "--width", "32", "--height", "48", "-o", cli_out], capture_output=True, text=True)
    check(cp.returncode == 0 and open(cli_out, "rb").read() == first, f"edits: byte-identical to generate --image: {cp.stderr[-300:]}")
# size auto: a picture of another served size keeps it; one of no served size is resized to the first
st, r = edit_call({"prompt": P, "steps": "2", "size": "auto"}, [("image", "a.png", rgba_png(48, 32, lambda x, y: 255), "image/png")])
check(st == 200 and r["size"] == "48x32" and png_size(base64.b64decode(r["data"][0]["b64_json"])) == (48, 32), f"edits: auto size kept 48x32: {st}")
st, r = edit_call({"prompt": P, "steps": "2"}, [("image", "a.png", rgba_png(40, 40, lambda x, y: 255), "image/png")])
check(st == 200 and r["size"] == "32x48", f"edits: a 40x40 picture resized to the first served size: {st} {str(r)[:200]}")
# refusals, each naming its field
for what, fields, files, code, param in (
        ("no image", {"prompt": P}, [], 400, "image"),
        ("not an image", {"prompt": P}, [("image", "x.png", b"not a picture at all", "image/png")], 400, "image"),
        ("a corrupt PNG", {"prompt": P}, [("image", "x.png", init_png[:60], "image/png")], 400, "image"),
        ("two images", {"prompt": P}, [("image", "a.png", init_png, "image/png"), ("image", "b.png", init_png, "image/png")], 400, "image"),
        ("bad mask", {"prompt": P}, [("image", "a.png", init_png, "image/png"), ("mask", "m.png", b"GIF89a", "image/gif")], 400, "mask"),
        ("strength 0", {"prompt": P, "strength": "0"}, [("image", "a.png", init_png, "image/png")], 400, "strength"),
        ("strength text", {"prompt": P, "strength": "lots"}, [("image", "a.png", init_png, "image/png")], 400, "strength"),
        ("n text", {"prompt": P, "n": "two"}, [("image", "a.png", init_png, "image/png")], 400, "n"),
        ("no prompt", {}, [("image", "a.png", init_png, "image/png")], 400, "prompt"),
        ("unknown field", {"prompt": P, "colour": "red"}, [("image", "a.png", init_png, "image/png")], 400, "colour"),
        ("unserved size", {"prompt": P, "size": "1024x1024"}, [("image", "a.png", init_png, "image/png")], 400, "size"),
        ("another model", {"prompt": P, "model": "dall-e-2"}, [("image", "a.png", init_png, "image/png")], 404, "model")):
    st, r = edit_call(fields, files)
    check(st == code and r and r["error"]["param"] == param, f"edits refuse {what}: {st} {r}")
st, r = call("POST", "/v1/images/edits", {"prompt": P})
check(st == 415 and r["error"]["type"] == "invalid_request_error", f"edits: a JSON body is a 415: {st} {r}")
st, r = edit_call({"prompt": P}, [("image", "a.png", init_png, "image/png")], key="sk-wrong")
check(st == 401, f"edits: the key is required: {st}")

# ---- OpenAI's SDK ----------------------------------------------------------------------------
try:
    import warnings
    import openai
except ImportError:
    openai = None
    print("note: the `openai` package is not importable by this interpreter; the SDK part is skipped "
          "(run under tools/venv/bin/python to include it)")
if openai:
    warnings.simplefilter("ignore", DeprecationWarning)
    client = openai.OpenAI(base_url=BASE + "/v1", api_key=KEY, max_retries=0)
    ms = client.models.list()
    check([m.id for m in ms.data] == ["dev"] and ms.data[0].owned_by == "difflet", f"SDK models.list: {ms}")
    m = client.models.retrieve("dev")
    check(m.id == "dev" and m.object == "model" and m.created > 1e9, f"SDK models.retrieve: {m}")
    try:
        client.models.retrieve("gpt-image-1")
        check(False, "SDK: an unknown model is a NotFoundError")
    except openai.NotFoundError as ex:
        check(ex.body.get("code") == "model_not_found", f"SDK models.retrieve 404: {ex.body}")
    # every parameter the SDK has, b64_json
    r = client.images.generate(prompt=P, model="dev", n=2, size="32x48", quality="low", style="vivid", background="opaque",
                               moderation="auto", output_format="jpeg", output_compression=60, response_format="b64_json",
                               partial_images=0, stream=False, user="sdk-user", extra_body={"seed": 11})
    check(isinstance(r, openai.types.ImagesResponse) and len(r.data) == 2, f"SDK images.generate n=2: {r}")
    imgs = [base64.b64decode(d.b64_json) for d in r.data]
    check(all(b[:2] == b"\xff\xd8" for b in imgs) and imgs[0] != imgs[1], "SDK: two different JPEGs (seeds 11, 12)")
    check(all(d.revised_prompt == P for d in r.data), f"SDK: revised_prompt: {[d.revised_prompt for d in r.data]}")
    check(r.usage is not None and r.usage.input_tokens > 5 and r.usage.input_tokens_details.text_tokens == r.usage.input_tokens
          and r.usage.input_tokens_details.image_tokens == 0 and r.usage.output_tokens == 0
          and r.usage.total_tokens == r.usage.input_tokens, f"SDK: usage: {r.usage}")
    check(r.background == "opaque" and r.output_format == "jpeg" and r.quality == "low" and r.size == "32x48"
          and r.safety_identifier == "sdk-user" and r.created > 1e9, f"SDK: the answer's fields: {r.model_dump(exclude={'data'})}")
    # url answers, fetched without the key (signed), and every output format
    for fmt, magic in (("png", b"\x89PNG"), ("jpeg", b"\xff\xd8"), ("webp", b"RIFF")):
        r = client.images.generate(prompt="a blue square", output_format=fmt, output_compression=80, response_format="url",
                                   extra_body={"steps": 2})
        with urllib.request.urlopen(r.data[0].url, timeout=30) as resp:
            body = resp.read()
        check(body[:len(magic)] == magic and r.output_format == fmt, f"SDK url answer as {fmt}: {body[:12]}")
    # the SDK's defaults only (no quality: the default steps, reported as high)
    r = client.images.generate(prompt="x", extra_body={"steps": 2})
    check(r.data[0].b64_json and r.quality is None and r.output_format == "png", f"SDK defaults: {r.model_dump(exclude={'data'})}")
    r = client.images.generate(prompt="x", quality="medium", safety_identifier="sid", user="ignored")
    check(r.quality == "medium" and r.safety_identifier == "sid", f"SDK: safety_identifier wins over user: {r.safety_identifier}")
    for kw, param in (({"quality": "ultra"}, "quality"), ({"size": "1024x1024"}, "size"), ({"output_format": "gif"}, "output_format"),
                      ({"n": 9}, "n"), ({"background": "none"}, "background")):
        try:
            client.images.generate(prompt="x", **kw)
            check(False, f"SDK: {kw} is a BadRequestError")
        except openai.BadRequestError as ex:
            check(ex.body.get("param") == param and ex.body.get("code") == "invalid_value", f"SDK 400 naming {param}: {ex.body}")
    try:
        client.images.generate(prompt="x", model="dall-e-3")
        check(False, "SDK: another model is a NotFoundError")
    except openai.NotFoundError as ex:
        check(ex.body.get("param") == "model" and ex.body.get("code") == "model_not_found", f"SDK 404: {ex.body}")
    # images.edit: image-to-image and inpainting, files as the SDK uploads them
    with open(os.path.join(EDIT, "init.png"), "rb") as im:
        r = client.images.edit(image=im, prompt=P, model="dev", size="32x48", response_format="b64_json",
                               extra_body={"steps": 2, "seed": 5})
    check(isinstance(r, openai.types.ImagesResponse) and png_size(base64.b64decode(r.data[0].b64_json)) == (32, 48),
          f"SDK images.edit: {str(r)[:200]}")
    r = client.images.edit(image=("init.png", init_png, "image/png"), mask=("mask.png", alpha_mask, "image/png"), prompt=P, n=2,
                           output_format="webp", input_fidelity="low", extra_body={"steps": 2, "strength": 0.8})
    check(len(r.data) == 2 and all(base64.b64decode(d.b64_json)[:4] == b"RIFF" for d in r.data) and r.output_format == "webp",
          f"SDK images.edit with a mask, n=2, webp: {str(r)[:200]}")
    # streams through the SDK: its event types, in order
    evs = list(client.images.generate(prompt=P, stream=True, partial_images=1, extra_body={"steps": 4}))
    check([e.type for e in evs] == ["image_generation.partial_image", "image_generation.completed"]
          and evs[1].usage.input_tokens > 5 and evs[0].partial_image_index == 0, f"SDK generate stream: {[e.type for e in evs]}")
    evs = list(client.images.edit(image=("init.png", init_png, "image/png"), prompt=P, stream=True, partial_images=2,
                                  extra_body={"steps": 5}))
    check([e.type for e in evs] == ["image_edit.partial_image"] * 2 + ["image_edit.completed"],
          f"SDK edit stream: {[e.type for e in evs]}")
    try:
        client.images.edit(image=("x.png", b"nonsense", "image/png"), prompt=P)
        check(False, "SDK: a bad image is a BadRequestError")
    except openai.BadRequestError as ex:
        check(ex.body.get("param") == "image", f"SDK images.edit 400: {ex.body}")
    for bad_client in (openai.OpenAI(base_url=BASE + "/v1", api_key="sk-wrong", max_retries=0),
                       openai.OpenAI(base_url=BASE + "/v1", api_key="unused", max_retries=0,
                                     default_headers={"Authorization": ""})):  # the SDK refuses to send none at all
        try:
            bad_client.images.generate(prompt="x", extra_body={"steps": 2})
            check(False, "SDK: a wrong or missing key is an AuthenticationError")
        except openai.AuthenticationError as ex:
            check(ex.status_code == 401 and ex.body.get("code") == "invalid_api_key", f"SDK 401: {ex.body}")

proc.send_signal(signal.SIGTERM)
try:
    proc.wait(10)
except subprocess.TimeoutExpired:
    proc.kill()
subprocess.run(["rm", "-rf", tmp])
passed, failed = counts()
print(f"test_serve_openai: {passed} passed, {failed} failed ({time.time() - T0:.0f} s)")
sys.exit(1 if failed else 0)
