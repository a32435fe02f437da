"""Figures: acceptance by position (Figure 5), sweeps (Figures 4, 6), trees (Figures 8-11), depths (Figure 7),
tuning, serving speedup by concurrency; each function writes one PNG, complete or not at all, and returns its path."""

from __future__ import annotations

import io
from collections.abc import Callable, Mapping, Sequence
from itertools import product
from pathlib import Path

from matplotlib.figure import Figure

from dartree.eval.bench import Summary
from dartree.eval.concurrency import ConcurrencyRow
from dartree.eval.costmodel import setting_text
from dartree.eval.outdir import write_atomic
from dartree.eval.tune import TuneResult
from dartree.tree import DraftTree, children_lists

__all__ = ["plot_acceptance", "plot_sweep", "plot_tree", "plot_depth_distribution", "plot_tuning", "plot_concurrency",
           "token_label", "save_png", "label_axes"]


def save_png(fig: Figure, path: Path) -> Path:
    """Render ``fig`` in memory, then write the PNG complete or not at all (:func:`write_atomic`)."""
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=120, bbox_inches="tight")
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_atomic(path, png.getvalue())


def label_axes(ax, xlabel: str, ylabel: str, legend: bool = True, **grid) -> None:
    """Axis labels, a light grid and (``legend``) a small legend: what every figure here draws."""
    ax.set(xlabel=xlabel, ylabel=ylabel)
    ax.grid(alpha=0.3, **grid)
    if legend:
        ax.legend(fontsize=7)


def plot_acceptance(summaries: Sequence[Summary], path: Path) -> Path:
    """Pr(L >= t) against t, one line per method; panels: a row per temperature, a column per dataset."""
    temps = list(dict.fromkeys(s.temperature for s in summaries))
    datasets = list(dict.fromkeys(s.dataset for s in summaries))
    fig = Figure(figsize=(4.8 * len(datasets), 3.6 * len(temps)))
    grid = fig.subplots(len(temps), len(datasets), squeeze=False)
    for (t, d), ax in zip(product(temps, datasets), grid.flat, strict=True):     # a row per temperature
        for s in summaries:
            if s.temperature == t and s.dataset == d and s.acceptance:
                ax.plot(range(1, len(s.acceptance) + 1), s.acceptance, marker="o", markersize=3,
                        label=f"{s.method} (tau {s.tau:.2f})")
        ax.set(title=f"{d}, T={t:g}", ylim=(0, 1.02))
        label_axes(ax, "position t", "Pr(L >= t)")
    return save_png(fig, path)


def plot_sweep(param: str, series: Mapping[str, Sequence[tuple[float, float, float]]], path: Path) -> Path:
    """A sweep of ``param``: ``series[method] = [(value, tau, expected speedup), ...]``; two panels."""
    fig = Figure(figsize=(10, 3.8))
    left, right = fig.subplots(1, 2)
    for method, points in series.items():
        xs = [p[0] for p in points]
        left.plot(xs, [p[1] for p in points], marker="o", label=method)
        right.plot(xs, [p[2] for p in points], marker="o", label=method)
    for ax, ylabel in ((left, "tau (tokens per round)"), (right, "expected speedup over AR")):
        label_axes(ax, param, ylabel)
        if param in ("budget", "width", "topk") and all(p[0] > 0 for pts in series.values() for p in pts):
            ax.set_xscale("log", base=2)
    right.axhline(1.0, color="gray", lw=0.8, ls="--")
    return save_png(fig, path)


def token_label(text: str, limit: int = 10) -> str:
    """A token's text made visible on a node: newline as ↵, tab as ⇥, space as ·, other controls escaped."""
    shown = text.replace("\n", "↵").replace("\t", "⇥").replace(" ", "·")
    shown = "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in shown)
    return shown if len(shown) <= limit else shown[: limit - 1] + "…"


def plot_tree(tree: DraftTree, accepted: Sequence[int], token_text: Callable[[int], str], path: Path,
              title: str = "", row: int = 0) -> Path:
    """Render row ``row`` of ``tree``: depth left to right, accepted path (node indices) highlighted."""
    n = int(tree.num_nodes[row])
    parents = tree.parents[row, :n].tolist()
    depths = tree.depths[row, :n].tolist()
    tokens = tree.tokens[row, :n].tolist()
    children = children_lists(parents, n)
    y: dict[int, float] = {}
    next_leaf = [0.0]

    def place(i: int) -> None:            # leaves top to bottom in depth-first order, parents centred
        kids = children[i]
        for c in kids:
            place(c)
        if kids:
            y[i] = sum(y[c] for c in kids) / len(kids)
        else:
            y[i] = next_leaf[0]
            next_leaf[0] += 1.0

    place(0)
    leaves = max(1.0, next_leaf[0])
    max_depth = max(depths)
    on_path = set(accepted)
    fig = Figure(figsize=(1.6 + 1.25 * (max_depth + 1), 0.9 + 0.32 * leaves))
    ax = fig.subplots()
    for i in range(1, n):
        p = parents[i]
        good = i in on_path and p in on_path
        ax.plot([depths[p], depths[i]], [y[p], y[i]], color="#2e7d32" if good else "#9e9e9e",
                lw=2.2 if good else 0.8, zorder=1)
    for i in range(n):
        good = i in on_path
        ax.text(depths[i], y[i], token_label(token_text(tokens[i])) + ("\n(root)" if i == 0 else ""),
                ha="center", va="center", fontsize=7, zorder=2,
                bbox={"boxstyle": "round,pad=0.25", "fc": "#c8e6c9" if good else "white",
                      "ec": "#2e7d32" if good else "#757575", "lw": 1.2 if good else 0.6})
    ax.set_xlim(-0.6, max_depth + 0.6)
    ax.set_ylim(leaves - 0.5, -0.5)
    ax.set_xlabel("depth")
    ax.set_yticks([])
    ax.set_xticks(range(max_depth + 1))
    ax.spines[["top", "right", "left"]].set_visible(False)
    ax.set_title(title or f"{n - 1} draft nodes, {len(on_path) - 1} accepted", fontsize=9)
    return save_png(fig, path)


def plot_depth_distribution(depth_counts: Mapping[str, Sequence[float]], path: Path) -> Path:
    """Mean draft nodes per depth per tree, one bar group per method (Figure 7)."""
    fig = Figure(figsize=(8, 3.8))
    ax = fig.subplots()
    methods = list(depth_counts)
    width = 0.8 / max(1, len(methods))
    for k, method in enumerate(methods):
        counts = depth_counts[method]
        xs = [d + 1 + (k - (len(methods) - 1) / 2) * width for d in range(len(counts))]
        ax.bar(xs, counts, width=width, label=method)
    label_axes(ax, "depth", "nodes per tree (mean)", axis="y")
    return save_png(fig, path)


def plot_tuning(result: TuneResult, path: Path) -> Path:
    """Measured verify cost by tree size, and the cost model's expected tokens/s by budget (per width)."""
    fig = Figure(figsize=(10, 3.8))
    left, right = fig.subplots(1, 2)
    cost = result.verify_cost
    left.plot(cost.sizes, [1000 * s for s in cost.seconds], marker="o")
    label_axes(left, "tree nodes n (root included)", "verify ms (inputs + target forward)", legend=False)
    left.set_title(f"verify cost on this machine (prefix {cost.prefix_len})", fontsize=9)
    # one line per (builder, verifier, width): auto compares builders, T>0 ranks under each verifier
    series = list(dict.fromkeys((c.builder, c.verifier, c.width) for c in result.candidates))
    for builder, verifier, w in series:
        cs = [c for c in result.candidates if (c.builder, c.verifier, c.width) == (builder, verifier, w)]
        name = " ".join(x for x in (builder if result.builder == "auto" else "", verifier or "",
                                    "" if w is None else f"W={w}") if x)
        right.plot([c.budget for c in cs], [c.tokens_per_s for c in cs], marker="o", label=name or "no width")
    best = result.best
    right.scatter([best.budget], [best.tokens_per_s], s=120, facecolors="none", edgecolors="red", zorder=3,
                  label=f"chosen {setting_text(best.budget, best.width, best.beta)}")
    right.axhline(result.ar_tokens_per_s, color="gray", ls="--", lw=0.8, label="AR")
    right.set_xscale("log", base=2)
    right.set_title(f"cost model for {result.method}", fontsize=9)
    label_axes(right, "budget B", "expected tokens / s")
    return save_png(fig, path)


def plot_concurrency(rows: Sequence[ConcurrencyRow], path: Path) -> Path:
    """Speedup over batched AR against concurrency, one line per method (log2 x axis); returns ``path``."""
    fig = Figure(figsize=(6.4, 4.0))
    ax = fig.subplots()
    for method in dict.fromkeys(r.method for r in rows):
        mine = sorted((r.concurrency, r.speedup) for r in rows if r.method == method)
        ax.plot([c for c, _ in mine], [s for _, s in mine], marker="o", markersize=4, label=method)
    ax.set_xscale("log", base=2)
    ax.axhline(1.0, color="grey", linewidth=0.8)
    label_axes(ax, "concurrency C (requests in flight)", "speedup over batched AR")
    return save_png(fig, path)
