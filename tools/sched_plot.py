#!/usr/bin/env python3
"""Plots of `difflet sched-eval` CSVs (docs/sched): Figure 10 (single node, p99 and
average latency normalised by the worst policy per cell), Figure 12 (multi-node cost
relative to the theoretical optimum: held device-seconds and devices x makespan),
Figures 13/14 (decoupling / promotion ablations), and the request-count and burst-size
sweeps (p99 against the best static DoP per cell).
Run with the tools virtualenv: tools/venv/bin/python tools/sched_plot.py docs/sched"""
import csv
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

d = sys.argv[1] if len(sys.argv) > 1 else "docs/sched"
rows = list(csv.DictReader(open(f"{d}/single_node.csv")))
mixes = list(dict.fromkeys(r["mix"] for r in rows))
rates = list(dict.fromkeys(r["rate"] for r in rows))
pols = list(dict.fromkeys(r["policy"] for r in rows))
for metric, label in (("p99_latency", "p99"), ("avg_latency", "average")):
    ncol = min(5, len(mixes))  # the paper's ten mixes: Figure 10's four and Figure 16's six, two rows
    nrow = (len(mixes) + ncol - 1) // ncol
    fig, axes = plt.subplots(nrow, ncol, figsize=(4 * ncol, 3.6 * nrow), sharey=True, squeeze=False)
    axes = [a for row in axes for a in row]
    for ax in axes[len(mixes):]:
        ax.axis("off")
    for ax, mix in zip(axes, mixes):
        w = 0.8 / len(pols)
        for k, pol in enumerate(pols):
            ys = []
            for rate in rates:
                cell = [r for r in rows if r["mix"] == mix and r["rate"] == rate]
                worst = max(float(r[metric]) for r in cell)
                ys.append(next(float(r[metric]) for r in cell if r["policy"] == pol) / worst)
            ax.bar([i + k * w for i in range(len(rates))], ys, w, label=pol)
        ax.set_xticks([i + 0.4 - w / 2 for i in range(len(rates))], rates)
        ax.set_title(f"Low:Medium:High = {mix}")
        ax.set_xlabel("arrival rate (requests/s)")
    for r in range(nrow):
        axes[r * ncol].set_ylabel(f"normalised {label} latency")
    axes[len(mixes) - 1].legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(f"{d}/single_node_{label}.png", dpi=80)

rows = list(csv.DictReader(open(f"{d}/multi_node.csv")))
mixes = list(dict.fromkeys(r["mix"] for r in rows))
pols = list(dict.fromkeys(r["policy"] for r in rows))
fig, axes = plt.subplots(2, 1, figsize=(12, 6.4), sharex=True)
for ax, col, title in ((axes[0], "cost_vs_optimal", "device-seconds held by requests"),
                       (axes[1], "makespan_cost_vs_optimal", "devices x makespan")):
    w = 0.8 / len(pols)
    for k, pol in enumerate(pols):
        ax.bar([i + k * w for i in range(len(mixes))],
               [next(float(r[col]) for r in rows if r["mix"] == m and r["policy"] == pol) for m in mixes], w, label=pol)
    ax.axhline(1.0, color="k", lw=0.8)
    for y, lab in ((1.39, "paper: DDiT 1.39x"), (2.08, "paper: best baseline 2.08x")):
        ax.axhline(y, color="gray", lw=0.8, ls="--")
        ax.text(len(mixes) - 0.2, y, lab, fontsize=7, va="bottom", ha="right", color="gray")
    ax.set_xticks([i + 0.4 - w / 2 for i in range(len(mixes))], mixes)
    ax.set_ylabel("cost / Algorithm 1's")
    ax.set_title(f"8 nodes x 8 devices, burst: {title}")
axes[0].legend(fontsize=7, ncol=7)
axes[1].set_xlabel("Low:Medium:High")
fig.tight_layout()
fig.savefig(f"{d}/multi_node_cost.png", dpi=80)

rows = list(csv.DictReader(open(f"{d}/ablation.csv")))
fig, axes = plt.subplots(1, 3, figsize=(15, 3.6))
for ax, ab in zip(axes, ("decoupling", "promotion")):
    by = defaultdict(list)
    for r in rows:
        if r["ablation"] == ab:
            by[(r["rate"], r["setting"])].append(float(r["p99_latency"]))
    rates = list(dict.fromkeys(r["rate"] for r in rows))
    for k, setting in enumerate(("on", "off")):
        ax.bar([i + k * 0.4 for i in range(len(rates))], [sum(by[(x, setting)]) / len(by[(x, setting)]) for x in rates], 0.4,
               label=f"{ab} {setting}")
    ax.set_xticks([i + 0.2 for i in range(len(rates))], rates)
    ax.set_yscale("log")
    ax.set_xlabel("arrival rate (requests/s)")
    ax.set_ylabel("p99 latency, mean over mixes (s)")
    ax.set_title(f"DDiT, {ab} on / off")
    ax.legend(fontsize=8)
# Figure 13 as the paper runs it: static DoP 2 with and without the VAE decoupled; p99
# relative to "off" in each mix, the bar the mean over mixes and the whisker the range
ax = axes[2]
rates = list(dict.fromkeys(r["rate"] for r in rows))
sub = [r for r in rows if r["ablation"] == "sdop2-decoupling"]
off = {(r["rate"], r["mix"]): float(r["p99_latency"]) for r in sub if r["setting"] == "off"}
for k, (setting, label) in enumerate((("on", "decoupled, aligned pairs"), ("on-any", "decoupled, any free pair"))):
    rel = [[float(r["p99_latency"]) / off[(x, r["mix"])] for r in sub if r["rate"] == x and r["setting"] == setting] for x in rates]
    mean = [sum(v) / len(v) for v in rel]
    ax.bar([i + k * 0.4 for i in range(len(rates))], mean, 0.4, label=label,
           yerr=[[m - min(v) for m, v in zip(mean, rel)], [max(v) - m for m, v in zip(mean, rel)]], capsize=2)
ax.axhline(1.0, color="k", lw=0.8)
ax.set_ylim(0.9, 1.02)
ax.set_xticks([i + 0.2 for i in range(len(rates))], rates)
ax.set_xlabel("arrival rate (requests/s)")
ax.set_ylabel("p99 / p99 of static DoP 2")
ax.set_title("Fig. 13: static DoP 2 + decoupling")
ax.legend(fontsize=8)
fig.tight_layout()
fig.savefig(f"{d}/ablations.png", dpi=80)


def sweep_bars(ax, rows, key, groups):
    """p99 / best static DoP per (group, mix): bars the mean over mixes, whiskers the range"""
    pols = list(dict.fromkeys(r["policy"] for r in rows))
    w = 0.8 / len(pols)
    for k, pol in enumerate(pols):
        vals = [[float(r["p99_vs_best_static"]) for r in rows if r[key] == g and r["policy"] == pol] for g in groups]
        mean = [sum(v) / len(v) for v in vals]
        ax.bar([i + k * w for i in range(len(groups))], mean, w, label=pol,
               yerr=[[m - min(v) for m, v in zip(mean, vals)], [max(v) - m for m, v in zip(mean, vals)]],
               capsize=1, error_kw={"lw": 0.6})
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks([i + 0.4 - w / 2 for i in range(len(groups))], groups)
    return pols


rows = list(csv.DictReader(open(f"{d}/count_sweep.csv")))
rates = list(dict.fromkeys(r["rate"] for r in rows))
counts = list(dict.fromkeys(r["requests"] for r in rows))
fig, axes = plt.subplots(2, len(rates), figsize=(4 * len(rates), 6.6))
for j, rate in enumerate(rates):
    sub = [r for r in rows if r["rate"] == rate]
    pols = sweep_bars(axes[0][j], sub, "requests", counts)
    axes[0][j].set_yscale("log")
    axes[0][j].set_ylim(0.6, 3)  # the contest is near 1; far-off policies are clipped
    axes[0][j].set_title(f"rate {rate}" if rate != "burst" else "burst of N requests")
    for pol in pols:  # absolute p99, mean over mixes
        axes[1][j].plot([int(n) for n in counts],
                        [sum(float(r["p99_latency"]) for r in sub if r["requests"] == n and r["policy"] == pol) /
                         sum(1 for r in sub if r["requests"] == n and r["policy"] == pol) for n in counts],
                        marker="o", ms=3, label=pol)
    axes[1][j].set_xscale("log")
    axes[1][j].set_yscale("log")
    axes[1][j].set_xlabel("requests in the run")
axes[0][0].set_ylabel("p99 / best static DoP\n(mixes: mean, range; clipped at 3)")
axes[1][0].set_ylabel("p99 latency, mean over mixes (s)")
axes[0][-1].legend(fontsize=6, ncol=2)
fig.tight_layout()
fig.savefig(f"{d}/count_sweep.png", dpi=80)

rows = list(csv.DictReader(open(f"{d}/burst_sweep.csv")))
sizes = list(dict.fromkeys(r["burst"] for r in rows))
fig, ax = plt.subplots(figsize=(10, 3.8))
sweep_bars(ax, rows, "burst", sizes)
ax.set_yscale("log")
ax.set_ylim(0.6, 3)
ax.set_xlabel("requests in the burst (8 devices)")
ax.set_ylabel("p99 / best static DoP\n(mixes: mean, range; clipped at 3)")
ax.set_title("burst-size sweep, one node")
ax.legend(fontsize=7, ncol=5)
fig.tight_layout()
fig.savefig(f"{d}/burst_sweep.png", dpi=80)
print(f"wrote plots to {d}")
