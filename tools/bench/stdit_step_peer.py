"""Peer measurement for `difflet bench stdit-step`: OpenSora 1.2's STDiT3 forward in plain
torch, on the same weights and inputs, torch CPU, the same dtype and thread count.

Open-Sora's own code may not be committed or run from here, so this is our own
transcription of the STDiT3 math (hpcaitech/Open-Sora v1.2.0; the formulas are the
ones src/models/stdit3.c states in its header): nn.Linear / nn.Conv3d with the
published key names (loaded strictly), F.layer_norm, Llama RMSNorm per head,
interleaved RoPE over the frame index in the temporal blocks,
F.scaled_dot_product_attention for self- and cross-attention, the GELU-tanh MLPs and
the adaLN-single modulation. `--check` verifies it against Open-Sora's own outputs,
the committed oracle vectors (tests/data/opensora/{a,b}/vectors.safetensors, made by the
reference's modules): every intermediate of one batch-2 forward, from the timestep
embedding to the unpatchified output.

    python stdit_step_peer.py MODEL_DIR INPUTS.safetensors OUT.safetensors THREADS REPS [bf16|f32 [WARMUP]]
    python stdit_step_peer.py --check [CONFIG_DIR ...]   (default: tests/data/opensora/a and b)

INPUTS holds latents [Cin, F, H, W], caption [L, caption_channels], valid [1] (the
caption's valid rows), timestep, fps, height, width [1] (f32). One step is what the
RFLOW sampler does: one batch-2 call, the latents twice, the caption and the null
caption (y_embedder.y_embedding) with the caption's mask. The JSON line and the output
(both branches, [2, Cout, F, H, W] as `out`) are peer_common.py's.
"""
import json
import math
import os
import sys

import torch
import torch.nn.functional as F
from torch import nn
from safetensors.torch import load_file

FREQ = 256  # the timestep / fps sinusoid's width


def sinusoid(v, dim=FREQ):
    """[cos(v f_k) | sin(v f_k)], f_k = exp(-ln(10000) k / (dim / 2)), in f32"""
    half = dim // 2
    f = torch.exp(-math.log(10000) * torch.arange(half, dtype=torch.float32) / half)
    a = v.float()[:, None] * f[None]
    return torch.cat([torch.cos(a), torch.sin(a)], dim=-1)


class Embedder(nn.Module):  # t_embedder / fps_embedder: mlp = Linear, SiLU, Linear
    def __init__(self, d):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(FREQ, d), nn.SiLU(), nn.Linear(d, d))

    def forward(self, v, dt):
        return self.mlp(sinusoid(v).to(dt))


class Mlp(nn.Module):  # fc1, GELU (tanh), fc2
    def __init__(self, cin, hidden, cout):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(cin, hidden), nn.Linear(hidden, cout)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class CaptionEmbedder(nn.Module):
    def __init__(self, ccap, d, lmax):
        super().__init__()
        self.y_proj = Mlp(ccap, d, d)
        self.y_embedding = nn.Parameter(torch.zeros(lmax, ccap))  # the null caption


class RMSNorm(nn.Module):  # Llama's: w * (x * rsqrt(mean(x^2) + eps)) with the sums in f32
    def __init__(self, n, eps=1e-6):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(n)), eps

    def forward(self, x):
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


class Rope(nn.Module):  # rope.freqs [Dh / 2]: 1 / 10000^(2k / Dh), stored in the checkpoint
    def __init__(self, dh):
        super().__init__()
        self.freqs = nn.Parameter(torch.zeros(dh // 2))

    def forward(self, x):
        """x [..., T', Dh]: pairs (2k, 2k+1) rotated by angle t' freqs[k]"""
        n = x.shape[-2]
        a = torch.arange(n, dtype=torch.float32)[:, None] * self.freqs.float()[None]  # [T', Dh / 2]
        cos, sin = torch.cos(a), torch.sin(a)
        xf = x.float().unflatten(-1, (-1, 2))
        x0, x1 = xf[..., 0], xf[..., 1]
        out = torch.stack([x0 * cos - x1 * sin, x1 * cos + x0 * sin], dim=-1).flatten(-2)
        return out.to(x.dtype)


class SelfAttention(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads, self.dh = heads, d // heads
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.q_norm, self.k_norm = RMSNorm(self.dh), RMSNorm(self.dh)

    def forward(self, x, rope=None):
        b, n, d = x.shape  # [sequences, tokens, D]
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, self.dh).permute(2, 0, 3, 1, 4)  # each [b, H, n, Dh]
        q, k = self.q_norm(q), self.k_norm(k)
        if rope is not None:
            q, k = rope(q), rope(k)
        o = F.scaled_dot_product_attention(q, k, v)
        return self.proj(o.transpose(1, 2).reshape(b, n, d))


class CrossAttention(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads, self.dh = heads, d // heads
        self.q_linear, self.kv_linear, self.proj = nn.Linear(d, d), nn.Linear(d, 2 * d), nn.Linear(d, d)

    def forward(self, x, ys):
        """x [B, N, D]; ys: per sample its valid caption tokens [L_b, D] (block-diagonal)"""
        B, N, D = x.shape
        q = self.q_linear(x).view(B, N, self.heads, self.dh).transpose(1, 2)  # [B, H, N, Dh]

        def kv(y):
            k, v = self.kv_linear(y).view(y.shape[0], 2, self.heads, self.dh).permute(1, 2, 0, 3)  # [H, L, Dh]
            return k, v

        if all(y.shape[0] == ys[0].shape[0] for y in ys):  # equal lengths (CFG's two branches): one call
            k, v = zip(*(kv(y) for y in ys))
            o = F.scaled_dot_product_attention(q, torch.stack(k), torch.stack(v))
        else:
            o = torch.cat([F.scaled_dot_product_attention(q[b:b + 1], *(t[None] for t in kv(ys[b]))) for b in range(B)])
        return self.proj(o.transpose(1, 2).reshape(B, N, D))


class Block(nn.Module):  # STDiT3Block
    def __init__(self, d, heads, mlp_ratio, temporal):
        super().__init__()
        self.temporal = temporal
        self.scale_shift_table = nn.Parameter(torch.zeros(6, d))
        self.attn, self.cross_attn = SelfAttention(d, heads), CrossAttention(d, heads)
        self.mlp = Mlp(d, int(d * mlp_ratio), d)

    def forward(self, x, ys, t_mlp, grid, rope):
        B, N, D = x.shape
        T1, S = grid
        m = self.scale_shift_table[None] + t_mlp.reshape(B, 6, D)
        shift1, scale1, gate1, shift2, scale2, gate2 = m.chunk(6, dim=1)  # each [B, 1, D]
        h = F.layer_norm(x, (D,), eps=1e-6) * (1 + scale1) + shift1
        if self.temporal:  # sequences of T' tokens per (branch, position); token n = t' S + s
            h = h.view(B, T1, S, D).transpose(1, 2).reshape(B * S, T1, D)
            h = self.attn(h, rope).view(B, S, T1, D).transpose(1, 2).reshape(B, N, D)
        else:  # sequences of S tokens per (branch, frame)
            h = self.attn(h.reshape(B * T1, S, D)).view(B, N, D)
        x = x + gate1 * h
        x = x + self.cross_attn(x, ys)  # no norm, no modulation
        h = F.layer_norm(x, (D,), eps=1e-6) * (1 + scale2) + shift2
        return x + gate2 * self.mlp(h)


class FinalLayer(nn.Module):
    def __init__(self, d, n):
        super().__init__()
        self.scale_shift_table = nn.Parameter(torch.zeros(2, d))
        self.linear = nn.Linear(d, n)


class PatchEmbed(nn.Module):
    def __init__(self, cin, d, patch):
        super().__init__()
        self.proj = nn.Conv3d(cin, d, kernel_size=patch, stride=patch)


class STDiT3(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d, heads, depth = cfg["hidden_size"], cfg["num_heads"], cfg["depth"]
        self.d, self.heads, self.input_sq = d, heads, cfg.get("input_sq_size", 512)
        self.patch = tuple(cfg.get("patch_size", [1, 2, 2]))
        self.cin = cfg.get("in_channels", 4)
        self.cout = 2 * self.cin if cfg.get("pred_sigma", True) else self.cin
        ratio = cfg.get("mlp_ratio", 4.0)
        self.x_embedder = PatchEmbed(self.cin, d, self.patch)
        self.t_embedder, self.fps_embedder = Embedder(d), Embedder(d)
        self.t_block = nn.Sequential(nn.SiLU(), nn.Linear(d, 6 * d))
        self.y_embedder = CaptionEmbedder(cfg["caption_channels"], d, cfg["model_max_length"])
        self.spatial_blocks = nn.ModuleList([Block(d, heads, ratio, False) for _ in range(depth)])
        self.temporal_blocks = nn.ModuleList([Block(d, heads, ratio, True) for _ in range(depth)])
        self.final_layer = FinalLayer(d, self.patch[0] * self.patch[1] * self.patch[2] * self.cout)
        self.rope = Rope(d // heads)

    @classmethod
    def from_pretrained(cls, path, torch_dtype=torch.float32):
        with open(os.path.join(path, "config.json")) as f:
            m = cls(json.load(f))
        m.load_state_dict(load_file(os.path.join(path, "model.safetensors")), strict=True)
        return m.to(torch_dtype)

    def pos_embed(self, gh, gw, height, width):
        """[S, D] f32: [e(column) | e(row)], e(p) = [sin(p g) | cos(p g)], g_k = 10000^(-2k / (D / 2))"""
        base = round(math.sqrt(gh * gw))
        scale = math.sqrt(height * width) / self.input_sq
        g = 1.0 / (10000 ** (torch.arange(0, self.d // 2, 2).float() / (self.d // 2)))
        ph = torch.arange(gh, dtype=torch.float32) / scale * (base / gh)
        pw = torch.arange(gw, dtype=torch.float32) / scale * (base / gw)

        def e(p):
            a = p[:, None] * g[None]
            return torch.cat([torch.sin(a), torch.cos(a)], dim=-1)

        eh, ew = e(ph), e(pw)
        return torch.cat([ew[None, :, :].expand(gh, gw, -1), eh[:, None, :].expand(gh, gw, -1)], dim=-1).reshape(gh * gw, -1)

    def forward(self, x, timestep, y, mask, fps, height, width, taps=None):
        """x [B, Cin, T, H, W]; timestep [B]; y [B, 1, L, Ccap]; mask [B', L] (repeated to B);
        fps, height, width [B'] (the first used). Returns [B, Cout, T, H, W] f32."""
        dt = self.x_embedder.proj.weight.dtype
        tap = (lambda k, v: taps.__setitem__(k, v.float())) if taps is not None else (lambda k, v: None)
        B, _, T, H, W = x.shape
        pt, ph, pw = self.patch
        G = (-(-T // pt), -(-H // ph), -(-W // pw))
        S = G[1] * G[2]
        # conditioning
        t_emb = self.t_embedder(timestep.to(dt), dt)
        fps_emb = self.fps_embedder(fps.repeat(B // fps.shape[0]), dt)
        t = t_emb + fps_emb
        t_mlp = self.t_block(t)
        tap("t_emb", t_emb), tap("fps_emb", fps_emb), tap("t", t), tap("t_mlp", t_mlp)
        yp = self.y_embedder.y_proj(y.to(dt))[:, 0]  # [B, L, D]: every row projected
        mask = mask.repeat(B // mask.shape[0], 1).bool()
        ys = [yp[b][mask[b]] for b in range(B)]  # masked_select: the valid tokens per sample
        tap("y_tokens", torch.cat(ys))
        # patch + position embedding
        xp = F.pad(x.to(dt), (0, G[2] * pw - W, 0, G[1] * ph - H, 0, G[0] * pt - T))
        xe = self.x_embedder.proj(xp).flatten(2).transpose(1, 2)  # [B, N, D], n = t' S + h' W' + w'
        pos = self.pos_embed(G[1], G[2], float(height[0]), float(width[0]))
        tap("patch_embed", xe), tap("pos_emb", pos)
        xe = (xe.view(B, G[0], S, -1) + pos.to(dt)).view(B, G[0] * S, -1)
        tap("x_embed", xe)
        for i, (sb, tb) in enumerate(zip(self.spatial_blocks, self.temporal_blocks)):
            xe = sb(xe, ys, t_mlp, (G[0], S), None)
            tap(f"spatial_{i}", xe)
            xe = tb(xe, ys, t_mlp, (G[0], S), self.rope)
            tap(f"temporal_{i}", xe)
        # final layer: the same t added to shift and scale
        fl = self.final_layer
        shift, scale = fl.scale_shift_table[0][None] + t, fl.scale_shift_table[1][None] + t  # [B, D]
        h = F.layer_norm(xe, (self.d,), eps=1e-6) * (1 + scale[:, None]) + shift[:, None]
        h = fl.linear(h)
        tap("final", h)
        # unpatchify: column ((a ph + b) pw + c) Cout + o of token (t', h', w') -> out[o, t' pt + a, h' ph + b, w' pw + c]
        o = h.view(B, G[0], G[1], G[2], pt, ph, pw, self.cout).permute(0, 7, 1, 4, 2, 5, 3, 6)
        o = o.reshape(B, self.cout, G[0] * pt, G[1] * ph, G[2] * pw)[:, :, :T, :H, :W].float()
        tap("out", o)
        return o


def make_step(tr, x, dt):
    lat = x["latents"].to(dt)[None].repeat(2, 1, 1, 1, 1)  # z_in = [z; z]
    cap = x["caption"]
    L = cap.shape[0]
    y = torch.stack([cap.to(dt), tr.y_embedder.y_embedding.detach().to(dt)])[:, None]  # [cond; null]
    mask = (torch.arange(L) < int(x["valid"][0]))[None].long()  # the prompt's mask, batch 1
    t = x["timestep"].float().repeat(2)
    fps, height, width = x["fps"].float(), x["height"].float(), x["width"].float()
    return lambda: tr(lat, t, y, mask, fps, height, width)[None]  # out[0]: both branches


def check(dirs):
    """Every intermediate of the committed oracle forward vs this transcription (f32)."""
    bad = 0
    for d in dirs:
        v = load_file(os.path.join(d, "vectors.safetensors"))
        tr = STDiT3.from_pretrained(os.path.join(d, "transformer")).eval()
        taps = {}
        with torch.inference_mode():
            tr(v["stdit3.x"], v["stdit3.timestep"], v["stdit3.y"], v["stdit3.mask"], v["stdit3.fps"],
               v["stdit3.height"], v["stdit3.width"], taps)
        names = [k[len("stdit3."):] for k in v if k.startswith("stdit3.") and k[len("stdit3."):] in taps]
        worst = 0.0
        for n in names:
            want, got = v["stdit3." + n].float(), taps[n]
            if tuple(want.shape) != tuple(got.shape):
                got = got.reshape(want.shape) if got.numel() == want.numel() else got
            if tuple(want.shape) != tuple(got.shape):
                print(f"  {d}: {n}: shape {tuple(got.shape)}, the oracle's {tuple(want.shape)}  FAIL")
                bad += 1
                continue
            rel = ((got - want).abs().max() / want.abs().max().clamp_min(1e-30)).item()
            worst = max(worst, rel)
            ok = rel <= 1e-5
            bad += not ok
            print(f"  {os.path.basename(os.path.normpath(d))}: {n:12s} {tuple(want.shape)!s:22s} max|diff| / max|oracle| {rel:.2e}  {'ok' if ok else 'FAIL'}")
        missing = {"t_mlp", "y_tokens", "x_embed", "spatial_0", "temporal_0", "final", "out"} - set(names)
        if missing:
            print(f"  {d}: the vectors lack {sorted(missing)}  FAIL")
            bad += 1
        print(f"{d}: {len(names)} tensors, worst {worst:.2e} (tolerance 1e-5)")
    print("stdit_step_peer --check: " + ("FAILED" if bad else "the transcription matches Open-Sora's own outputs"))
    return 1 if bad else 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--check":
        here = os.path.dirname(os.path.abspath(__file__))
        root = os.path.normpath(os.path.join(here, "..", ".."))
        dirs = sys.argv[2:] or [os.path.join(root, "tests", "data", "opensora", c) for c in ("a", "b")]
        sys.exit(check(dirs))
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import peer_common

    peer_common.run(STDiT3, make_step)
