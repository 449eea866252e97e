"""Figures drawn from the results table, never by hand: `python -m lab plot` redraws them all.

Per op: time against size (one line per version), speedup over the baseline at the largest size, and a roofline
(achieved TFLOP/s against arithmetic intensity, under the measured copy-bandwidth and matrix-rate ceilings).
Each figure says which GPU, which run and which formula its rates come from.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

import matplotlib
import numpy as np

if "ipykernel" not in sys.modules:
    # scripts and the CLI draw to files (no display needed); inside a notebook keep the inline backend, or
    # plt.show() after `from lab import plot` would show nothing (seen in notebook 01's first H100 run)
    matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from . import env, registry, results  # noqa: E402
from .ceilings import ceilings_cached  # noqa: E402
from .registry import Op  # noqa: E402


def _style_key(r: dict) -> str:
    return r["version"] + (" (graph)" if r["mode"] == "graph" else "")


def _rows_for(op: Op, device_name: str | None, dtype: str | None) -> list[dict]:
    rows = results.latest(results.read(family=op.family, op=op.name))
    if device_name:
        rows = [r for r in rows if r["device_name"] == device_name]
    elif rows:  # default: the device of the newest row
        newest = max(rows, key=lambda r: r["timestamp"] or "")
        rows = [r for r in rows if r["device_name"] == newest["device_name"]]
    if dtype:
        rows = [r for r in rows if r["dtype"] == dtype]
    return rows


def _footer(fig, rows: list[dict], formula: str) -> None:
    r = max(rows, key=lambda r: r["timestamp"] or "")
    text = f"{r['device_name']} · torch {r['torch']} · CUDA {r['cuda']} · commit {r['commit']} · {r['timestamp']}"
    commits = sorted({x["commit"] or "?" for x in rows})
    if len(commits) > 1:   # points from more than one run: say so, a curve may join them
        text = (f"{r['device_name']} · torch {r['torch']} · CUDA {r['cuda']} · points from the runs of commits "
                f"{', '.join(commits)}; newest {r['timestamp']}")
    if formula:
        text = formula + "\n" + text
    fig.text(0.01, 0.01, text, fontsize=7, color="0.35", va="bottom")


_MARKERS = "os^vDP*Xhp<>"


def _keys(rows: list[dict]) -> list[str]:
    """The rows' style keys in natural order (v2 before v10)."""
    return sorted({_style_key(r) for r in rows},
                  key=lambda k: [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", k)])


def _style(i: int) -> dict:
    """Color and marker of the i-th series: 20 colors x 12 markers, so a 15-version ladder has no two alike."""
    return {"color": plt.get_cmap("tab20")(i % 20), "marker": _MARKERS[i % len(_MARKERS)]}


def save_figure(fig, name: str, dpi: int = 130, device_name: str | None = None) -> Path:
    """results/<device>/plots/<name>.png (the device whose rows it draws; default this machine's); closes the
    figure."""
    out = (env.device_dir(device_name) if device_name else env.results_dir()) / "plots"
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.png"
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


def time_vs_size(op: Op, dtype: str, device_name: str | None = None, rows: list[dict] | None = None,
                 save: bool = True):
    """rows: draw these (e.g. fresh from bench_op) instead of reading the results table."""
    rows = [r for r in (rows if rows is not None else _rows_for(op, device_name, dtype))
            if r["size"] is not None and r["dtype"] == dtype]
    if len({r["size"] for r in rows}) < 2:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.6))
    for i, key in enumerate(_keys(rows)):
        pts = sorted((r["size"], r["median_us"], r["p20_us"], r["p80_us"]) for r in rows if _style_key(r) == key)
        xs, ys = [p[0] for p in pts], [p[1] for p in pts]
        ls = "--" if any(r["version"] == op.baseline for r in rows if _style_key(r) == key) or "torch" in key else "-"
        st = _style(i)
        ax.plot(xs, ys, ls, ms=3, label=key, **st)
        ax.fill_between(xs, [p[2] for p in pts], [p[3] for p in pts], alpha=0.15, color=st["color"])
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(op.size_key)
    ax.set_ylabel("median time (us), band = p20..p80")
    ax.set_title(f"{op.family}.{op.name} ({dtype}): time against {op.size_key}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.subplots_adjust(bottom=0.2)
    _footer(fig, rows, op.formula)
    return save_figure(fig, f"{op.family}_{op.name}_{dtype}_time", device_name=rows[0]["device_name"]) if save else fig


def speedup_bars(op: Op, dtype: str, device_name: str | None = None, rows: list[dict] | None = None,
                 save: bool = True):
    rows = [r for r in (rows if rows is not None else _rows_for(op, device_name, dtype))
            if r["speedup"] is not None and r["dtype"] == dtype]
    if not rows:
        return None
    # the largest shape that has the most versions timed
    by_shape: dict[str, list[dict]] = {}
    for r in rows:
        by_shape.setdefault(r["shape"], []).append(r)
    shape = max(by_shape, key=lambda s: (len(by_shape[s]), max((r["size"] or 0) for r in by_shape[s])))
    sel = sorted(by_shape[shape], key=lambda r: _style_key(r))
    fig, ax = plt.subplots(figsize=(7, 4.2))
    names = [_style_key(r) for r in sel]
    vals = [r["speedup"] for r in sel]
    colors = ["0.6" if r["version"] == op.baseline or r["version"].startswith("torch") else "C0" for r in sel]
    bars = ax.bar(names, vals, color=colors)
    for b, r in zip(bars, sel):
        ax.annotate(f"{r['speedup']:.2f}x\n{r['median_us']:.1f} us", (b.get_x() + b.get_width() / 2, b.get_height()),
                    ha="center", va="bottom", fontsize=7 if len(sel) <= 8 else 5.5)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_ylim(0, max(vals) * 1.2)          # room for the two-line labels above the tallest bar
    bases = sorted({r["baseline"] for r in sel if r.get("baseline")})
    # rows since the same-mode rule name "torch (graph)"; older rows name only the baseline (eager was the divisor)
    same = bases and all(b.endswith(")") for b in bases)
    ax.set_ylabel("speedup: time ratio over\n" + (", ".join(bases) if bases else op.baseline) +
                  ("\n(same mode, same precision)" if same else "\n(its eager run: rows of an older run)"), fontsize=8)
    ax.set_title(f"{op.family}.{op.name} ({dtype}) at {shape}")
    ax.tick_params(axis="x", labelsize=8)
    plt.setp(ax.get_xticklabels(), rotation=30, ha="right", rotation_mode="anchor")   # long names end under their bar
    fig.subplots_adjust(bottom=0.32)
    _footer(fig, sel, op.formula)
    return (save_figure(fig, f"{op.family}_{op.name}_{dtype}_speedup", device_name=sel[0]["device_name"]) if save
            else fig)


def roofline(op: Op, dtype: str, device_name: str | None = None) -> Path | None:
    rows = [r for r in _rows_for(op, device_name, dtype) if r["tflops"] and r["gbps"]]
    if not rows:
        return None
    ceil = ceilings_cached(rows[0]["device_name"], rows[0]["torch"])
    if not ceil:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.6))
    bw = ceil["copy_gbps"] * 1e9
    # the ceilings of the precisions these rows ran at (float32 rows: also TF32 and the FP32 FMA probe)
    precisions = {r["precision"] or r["dtype"] for r in rows} | ({"tf32"} if dtype == "float32" else set())
    peaks = {k: v for k, v in ceil.get("gemm_tflops", {}).items() if k in precisions}
    if ceil.get("fma_tflops") and dtype == "float32":
        peaks["fp32 FMA"] = ceil["fma_tflops"]
    if not peaks:
        return None
    ai = [r["tflops"] * 1e12 / (r["gbps"] * 1e9) for r in rows]
    lo, hi = min(ai) / 4, max(max(ai) * 4, max(peaks.values()) * 1e12 / bw * 4)
    xs = np.logspace(np.log10(lo), np.log10(hi), 200)
    for name, p in sorted(peaks.items(), key=lambda kv: kv[1]):
        ax.plot(xs, np.minimum(p, xs * bw / 1e12), lw=0.8, alpha=0.6, label=f"{name} {p:.0f} TFLOP/s")
    for i, key in enumerate(_keys(rows)):
        sel = [(a, r["tflops"]) for a, r in zip(ai, rows) if _style_key(r) == key]
        ax.scatter([s[0] for s in sel], [s[1] for s in sel], s=18, label=key, zorder=3, **_style(i))
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP per byte moved)")
    ax.set_ylabel("achieved TFLOP/s")
    ax.set_title(f"{op.family}.{op.name} ({dtype}) roofline; copy {ceil['copy_gbps']:.0f} GB/s")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.subplots_adjust(bottom=0.2)
    _footer(fig, rows, op.formula)
    return save_figure(fig, f"{op.family}_{op.name}_{dtype}_roofline", device_name=rows[0]["device_name"])


def plot_family(family, device_name: str | None = None) -> list[Path]:
    out = []
    for op in family.ops:
        dtypes = sorted({r["dtype"] for r in _rows_for(op, device_name, None)})
        for dt in dtypes:
            for fn in (time_vs_size, speedup_bars, roofline):
                p = fn(op, dt, device_name)
                if p:
                    out.append(p)
    for fn in family.plots:   # the family's own figures (optim's step figure), from its recorded rows
        p = fn(device_name)
        if p:
            out.append(p)
    return out


def this_machine() -> list[str]:
    """The devices of this machine: its GPU (if any) and its CPU."""
    names = [env.device_name("cpu")]
    return ([env.device_name("cuda")] if env.has_gpu() else []) + names


def plot_all(device_name: str | None = None, devices: list[str] | None = None, progress: bool = False) -> list[Path]:
    """Every family's figures from the rows of `device_name`, or of each of `devices` (default: this machine's
    devices that have rows), each into results/<device>/plots/ — never another machine's folder unless named."""
    if device_name:
        devices = [device_name]
    elif devices is None:
        have = {r["device_name"] for r in results.read()}
        devices = [d for d in this_machine() if d in have]
    out = []
    for dev in devices:
        for fam in registry.families():
            if progress:
                print(f"[lab] plotting {fam.name} ({dev}) ...", flush=True)
            out += plot_family(fam, dev)
    return out
