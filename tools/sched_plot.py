#!/usr/bin/env python3
"""Plots of `difflet sched-eval` CSVs (docs/sched): Figure 10 (single node, p99 and
average latency normalised by the worst policy per cell), Figure 12 (multi-node cost
relative to the theoretical optimum), Figures 13/14 (decoupling / promotion ablations).
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
    fig, axes = plt.subplots(1, len(mixes), figsize=(4 * len(mixes), 3.6), sharey=True)
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
    axes[0].set_ylabel(f"normalised {label} latency")
    axes[-1].legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(f"{d}/single_node_{label}.png", dpi=80)

rows = list(csv.DictReader(open(f"{d}/multi_node.csv")))
mixes = list(dict.fromkeys(r["mix"] for r in rows))
pols = list(dict.fromkeys(r["policy"] for r in rows))
fig, ax = plt.subplots(figsize=(9, 3.6))
w = 0.8 / len(pols)
for k, pol in enumerate(pols):
    ax.bar([i + k * w for i in range(len(mixes))],
           [next(float(r["cost_vs_optimal"]) for r in rows if r["mix"] == m and r["policy"] == pol) for m in mixes], w, label=pol)
ax.axhline(1.0, color="k", lw=0.8)
ax.set_xticks([i + 0.4 - w / 2 for i in range(len(mixes))], mixes)
ax.set_ylabel("cost / theoretical optimum")
ax.set_title("8 nodes x 8 devices, burst")
ax.legend(fontsize=7, ncol=4)
fig.tight_layout()
fig.savefig(f"{d}/multi_node_cost.png", dpi=80)

rows = list(csv.DictReader(open(f"{d}/ablation.csv")))
fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
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
    ax.legend(fontsize=8)
fig.tight_layout()
fig.savefig(f"{d}/ablations.png", dpi=80)
print(f"wrote plots to {d}")
