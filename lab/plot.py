"""Figures drawn from the results table, never by hand: `python -m lab plot` redraws them all.

Per op: time against size (one line per version), speedup over the baseline at the largest size, a roofline
(achieved TFLOP/s against arithmetic intensity, under the measured copy-bandwidth and matrix-rate ceilings), and the
profile figure (`plot_profile`: each version's device time per call split by kernel, from profiles.csv), and
where Nsight Compute ran, the measured figure (`plot_roofline_measured`: each version at the DRAM bytes ncu measured
beside the formula's bytes: a roofline, or bars of bytes for an op with no FLOP formula).
Each figure says which GPU, which run and which formula its rates come from.
"""
from __future__ import annotations

import re
import sys
import textwrap
from pathlib import Path

import matplotlib
import numpy as np
import torch

if "ipykernel" not in sys.modules:
    # scripts and the CLI draw to files (no display needed); inside a notebook keep the inline backend, or
    # plt.show() after `from lab import plot` would show nothing (seen in notebook 01's first H100 run)
    matplotlib.use("Agg")
import matplotlib.lines  # noqa: E402
import matplotlib.patches  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402

from . import env, profile, registry, results  # noqa: E402
from .ceilings import ceilings_cached, peak_for  # noqa: E402
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
        text = _wrap(formula) + "\n" + text   # a long formula folds rather than run off the figure
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


# the profile figure's colors, one per kernel category (lab.profile.CATEGORIES)
_CATEGORY_COLORS = {"ours": "#1f77b4", "cublas": "#ff7f0e", "cudnn": "#9467bd", "elementwise": "#2ca02c",
                    "copy": "#17becf", "memset": "#bcbd22", "other": "#7f7f7f", "cpu-op": "#8c564b"}


def _natural(s: str) -> list:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", s)]


def profile_rows(family: str, op: str, device_name: str | None = None, dtype: str | None = None,
                 shape: str | None = None) -> list[dict]:
    """The profiles.csv rows one profile figure draws: one device (default: the newest row's), one dtype and one
    shape (default: the newest row's of those), and per version only its newest profiled run."""
    runs = profile.newest_runs(profile.read_profiles(family=family, op=op), device_name, dtype, shape)
    return [r for rs in runs.values() for r in rs]


def plot_profile(family, op, device_name: str | None = None, dtype: str | None = None, shape: str | None = None,
                 label_share: float = 0.1, save: bool = True):
    """Each version's time per call split by kernel, from the recorded profiles.csv rows only: one horizontal bar per
    version (the baselines above our versions), one segment per kernel colored by its category, the largest kernels
    named on their segments. `family`, `op`: names or the registry's objects; shape: the row's label ("n=1048576").
    Returns the saved figure's path (save=False: the figure), or None when there are no rows."""
    fam = family if isinstance(family, str) else family.name
    opname = op if isinstance(op, str) else op.name
    rows = profile_rows(fam, opname, device_name, dtype, shape)
    if not rows:
        return None
    cpu = all(r["category"] == "cpu-op" for r in rows)
    by_version: dict[str, list[dict]] = {}
    for r in rows:
        by_version.setdefault(r["version"], []).append(r)
    # top to bottom: the baselines, then ours in ladder order (v2 before v10)
    order = sorted(by_version, key=lambda v: (by_version[v][0]["role"] != "baseline", _natural(v)))
    rank = {c: i for i, c in enumerate(profile.CATEGORIES)}
    totals = {v: sum(r["us_per_call"] or 0 for r in by_version[v]) for v in order}
    xmax = max(totals.values()) or 1.0
    height = 2.4 + 0.5 * len(order)    # inches: the bars, plus fixed room for the title, the x label and the footer
    fig, ax = plt.subplots(figsize=(10, height))
    seen: set[str] = set()
    for y, v in enumerate(order):
        left = 0.0
        segs = sorted(by_version[v], key=lambda r: (rank.get(r["category"], 99), -(r["us_per_call"] or 0)))
        for r in segs:
            w = r["us_per_call"] or 0.0
            cat = r["category"]
            ax.barh(y, w, left=left, height=0.6, color=_CATEGORY_COLORS.get(cat, "#7f7f7f"), edgecolor="white",
                    linewidth=0.8, label=cat if cat not in seen else None)
            seen.add(cat)
            if w >= label_share * xmax:
                calls = r["calls_per_call"] or 0
                width = max(8, int(60 * w / xmax))
                text = (r["kernel"][:width] if cpu else profile.short_kernel_name(r["kernel"], width))
                if calls and abs(calls - 1) > 1e-9:
                    text += f" ×{calls:g}"
                ax.text(left + w / 2, y, text, ha="center", va="center", fontsize=6.5, color="white", clip_on=True)
            left += w
        t = totals[v]
        ax.text(left + 0.01 * xmax, y, f"{t:,.0f} us" if t >= 100 else f"{t:.3g} us", va="center", fontsize=7.5)
    ax.set_yticks(range(len(order)))
    ax.set_yticklabels(order)
    for t, v in zip(ax.get_yticklabels(), order):
        if by_version[v][0]["role"] == "baseline":
            t.set_color("0.35")
            t.set_fontstyle("italic")
    ax.invert_yaxis()
    ax.set_xlim(0, xmax * 1.15)
    ax.set_xlabel("self CPU time per call (us), by operator" if cpu else "device time per call (us), by kernel")
    r0 = rows[0]
    ax.set_title(f"{fam}.{opname} ({r0['dtype']}) at {r0['shape']}: where each version's time goes", fontsize=10)
    handles, labels = ax.get_legend_handles_labels()
    keyed = sorted(zip(labels, handles), key=lambda lh: rank.get(lh[0], 99))
    ax.legend([h for _, h in keyed], [lab for lab, _ in keyed], fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1),
              title="category", title_fontsize=7)
    ax.grid(True, axis="x", alpha=0.3)
    fig.subplots_adjust(left=0.13, right=0.85, bottom=1.1 / height, top=1 - 0.45 / height)
    reps = int(max(r["reps"] or 0 for r in rows))
    formula = ("bar = sum of the operators' self CPU time per call (torch.profiler; no GPU: no kernels)" if cpu else
               "bar = sum of the kernels' device time per call (torch.profiler's GPU events, each kernel once)")
    _footer(fig, rows, f"{formula}, mean of {reps} calls\nsegment = one {'operator' if cpu else 'kernel'}, "
                       "colored by its category, named where wide enough (×n: launches per call)")
    if not save:
        return fig
    return save_figure(fig, f"{fam}_{opname}_{r0['dtype']}_kernels", device_name=r0["device_name"])


# ---- measured bytes (Nsight Compute) beside the formula's --------------------------------------------------------
_MEASURED = "C0"


def _wrap(text: str, width: int = 150) -> str:
    return "\n".join(textwrap.fill(par, width) if par else par for par in text.split("\n"))


def _ncu_footer(fig, calls: list[dict], what: str) -> int:
    """The footer of a figure from ncu rows: what it draws, the op's formula, the ncu version, then _footer's device /
    torch / CUDA / commit stamp of those rows. Returns its number of lines (the caller leaves room for them)."""
    rows = [r for c in calls for r in c["rows"]]
    formulas = sorted({c["formula"] for c in calls if c["formula"]})
    tools = sorted({r.get("ncu") or "?" for r in rows})
    text = _wrap(f"{what}\nformula: {'; '.join(formulas) or '(none registered)'}\n"
                 f"Nsight Compute {', '.join(tools)}; the ncu rows' commit and machine:")
    _footer(fig, rows, text)
    return text.count("\n") + 2


def _ncu_title(fam: str, opname: str, calls: list[dict], what: str) -> str:
    shapes = sorted({c["shape"] for c in calls})
    at = shapes[0] if len(shapes) == 1 else "the shape each version was profiled at (labels)"
    return f"{fam}.{opname} ({calls[0]['dtype']}): {what}\nat {at}"


def _measured_bars(fam: str, opname: str, calls: list[dict], ceil: dict | None):
    """Per version, measured DRAM bytes (filled) beside the formula's (hatched), in MB; above the measured bar the
    GB/s those bytes make in the call's time, against the copy ceiling."""
    n = len(calls)
    width_in = max(8.0, 2.4 + 1.45 * n)
    height = 6.2
    fig, ax = plt.subplots(figsize=(width_in, height))
    xs = np.arange(n)
    w = 0.38
    top = max([c["measured_bytes"] or 0 for c in calls] + [c["formula_bytes"] or 0 for c in calls]) / 1e6 or 1.0
    copy = (ceil or {}).get("copy_gbps")
    labels = []
    for x, c in zip(xs, calls):
        color = "0.55" if c["role"] == "baseline" else _MEASURED
        m, fb, t = c["measured_bytes"], c["formula_bytes"], c["time_us"]
        for dx, v, kw in ((-w / 2, m, {"color": color}),
                          (w / 2, fb, {"facecolor": "white", "edgecolor": color, "hatch": "///", "lw": 1.0})):
            if v is not None:
                ax.bar(x + dx, v / 1e6, w, zorder=3, **kw)
                ax.annotate(f"{v / 1e6:.3g} MB", (x + dx, v / 1e6), xytext=(0, 2), textcoords="offset points",
                            ha="center", va="bottom", fontsize=7, zorder=5)
        gbps = m / (t * 1e-6) / 1e9 if m is not None and t else None
        label = f"{c['version']}\n{t:.3g} us, {c['launches']} kernel{'s' if c['launches'] != 1 else ''}"
        if gbps is not None:
            label += f"\n{gbps:,.0f} GB/s" + (f" ({100 * gbps / copy:.0f}% of copy)" if copy else "")
        if m is not None and fb:
            label += f"\n{m / fb:.2f}x the formula"
        labels.append(label)
    ax.set_xticks(xs)
    ax.set_xticklabels(labels, fontsize=7.5)
    for lab, c in zip(ax.get_xticklabels(), calls):
        if c["role"] == "baseline":
            lab.set_color("0.35")
            lab.set_fontstyle("italic")
    ax.set_xlim(-0.6, n - 0.4)
    ax.set_ylim(0, top * 1.12)     # room for the MB above the bars
    ax.set_ylabel("bytes per call (MB)")
    ax.grid(True, axis="y", alpha=0.3, zorder=0)
    copy_txt = f"copy ceiling {copy:,.0f} GB/s" if copy else "no copy ceiling recorded for this device and torch"
    handles = [matplotlib.patches.Patch(color=_MEASURED, label="measured DRAM bytes\n(ncu, read + write)"),
               matplotlib.patches.Patch(facecolor="white", edgecolor=_MEASURED, hatch="///",
                                        label="formula bytes\n(op.nbytes)"),
               matplotlib.patches.Patch(color="0.55", label="baseline (grey)"),
               matplotlib.lines.Line2D([], [], color="none", label=f"under each version: its\nmeasured bytes' "
                                                                   f"GB/s;\n{copy_txt}")]
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1), borderaxespad=0)
    ax.set_title(_ncu_title(fam, opname, calls, "measured DRAM bytes against the formula's"), fontsize=10)
    lines = _ncu_footer(fig, calls, "bar = one call of the version (the kernels of its newest ncu run, summed); "
                                    "measured = dram__bytes_read.sum + dram__bytes_write.sum (= dram_gbps x duration "
                                    "per kernel); time = the kernels' durations under ncu (clocks locked by ncu: not "
                                    "the benchmark's time). Over 1x the formula: it moves more than it must; under: "
                                    "the L2 served part of what the formula counts (repeated rows read once; writes "
                                    "still in the L2 when the kernel ended: ncu counts DRAM traffic within a kernel)")
    right = 1 - 1.9 / width_in
    fig.subplots_adjust(left=0.9 / width_in, right=right, top=1 - 0.75 / height,
                        bottom=(0.8 + 0.125 * lines + 0.12) / height)
    return fig


def _measured_roofline(fam: str, opname: str, calls: list[dict], ceil: dict | None):
    """Achieved TFLOP/s (formula FLOPs over the ncu time) against arithmetic intensity, each version twice: at its
    measured DRAM bytes (filled) and at the formula's bytes (hollow), joined; under the copy roof and the compute roof
    of each version's ceiling (lab.ceilings.peak_for: cuBLAS at its precision, or the FP32 FMA probe)."""
    width_in, height = 10.0, 6.2
    fig, ax = plt.subplots(figsize=(width_in, height))
    pts = []
    for c in calls:
        if not c["flops"] or not c["time_us"]:
            continue
        y = c["flops"] / (c["time_us"] * 1e-6) / 1e12
        xm = c["flops"] / c["measured_bytes"] if c["measured_bytes"] else None
        xf = c["flops"] / c["formula_bytes"] if c["formula_bytes"] else None
        pts.append((c, y, xm, xf))
    peaks: dict[str, float] = {}
    o = _op_or_none(fam, opname)
    dt = getattr(torch, calls[0]["dtype"] or "", None)
    if ceil and o is not None and isinstance(dt, torch.dtype):
        for c in calls:
            try:
                kind = o.version(c["version"]).ceiling or o.compute_ceiling
            except KeyError:
                kind = o.compute_ceiling
            prec = c["precision"] if c["precision"] != c["dtype"] else None
            for k in ([kind] if kind else ["fma", "gemm"]):   # a memory-bound op: its dtype's compute roof, if any
                p = peak_for(ceil, dt, prec, k)
                if p:
                    peaks[f"FP32 FMA probe {p:.0f} TFLOP/s" if k == "fma" else
                          f"cuBLAS {prec or calls[0]['dtype']} {p:.0f} TFLOP/s"] = p
                    break
    bw = ceil["copy_gbps"] * 1e9 if ceil else None
    xs_all = [x for _, _, xm, xf in pts for x in (xm, xf) if x]
    if xs_all:
        lo = min(xs_all) / 4
        hi = max(xs_all) * 4
        if bw and peaks:
            hi = max(hi, max(peaks.values()) * 1e12 / bw * 4)
        grid = np.logspace(np.log10(lo), np.log10(hi), 200)
        if bw:   # the copy roof, up to the highest compute roof (the roofs in greys: the colors are the versions')
            mem = grid * bw / 1e12
            ax.plot(grid, np.minimum(mem, max(peaks.values())) if peaks else mem, color="0.25", lw=1.2, ls="--",
                    label=f"copy roof {ceil['copy_gbps']:,.0f} GB/s")
        for i, (name, p) in enumerate(sorted(peaks.items(), key=lambda kv: kv[1])):   # flat, from its ridge point on
            flat = grid[grid >= p * 1e12 / bw] if bw else grid
            ax.plot(flat, np.full_like(flat, p), lw=1.2, color=("0.45", "0.2", "0.6")[i % 3],
                    ls=("-", "-.", ":")[i % 3], label=name)
    for i, (c, y, xm, xf) in enumerate(pts):
        st = _style(i)
        if xm and xf:
            ax.plot([xm, xf], [y, y], color=st["color"], lw=1.2, zorder=3)
        if xm:
            ax.plot([xm], [y], ls="none", ms=8, marker=st["marker"], color=st["color"], zorder=4,
                    label=f"{c['version']}: {y:.3g} TFLOP/s, measured/formula bytes "
                          f"{c['measured_bytes'] / c['formula_bytes']:.2f}" if xf else c["version"])
        if xf:
            ax.plot([xf], [y], ls="none", ms=8, marker=st["marker"], markerfacecolor="none", mew=1.5,
                    color=st["color"], zorder=4, label=None if xm else f"{c['version']} (formula bytes only)")
    ax.plot([], [], ls="none", marker="o", color="0.3", ms=7, label="filled: at measured DRAM bytes (ncu)")
    ax.plot([], [], ls="none", marker="o", color="0.3", markerfacecolor="none", ms=7, label="hollow: at formula bytes")
    ax.set_xscale("log")
    ax.set_yscale("log")
    for axis in (ax.xaxis, ax.yaxis):   # ticks at 1, 2, 5 of each decade, written 20, 100, 500: not 2 x 10^1
        axis.set_major_locator(matplotlib.ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        axis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        axis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xlabel("arithmetic intensity (formula FLOPs per byte)")
    ax.set_ylabel("achieved TFLOP/s (formula FLOPs / ncu time)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1), borderaxespad=0)
    ax.set_title(_ncu_title(fam, opname, calls, "roofline from measured DRAM bytes"), fontsize=10)
    lines = _ncu_footer(fig, calls, "point = one call of the version (the kernels of its newest ncu run, summed): "
                                    "filled at the DRAM bytes ncu measured (read + write), hollow at the formula's; "
                                    "left of the hollow one: it moves more than it must. Time = the kernels' durations "
                                    "under ncu (clocks locked by ncu)")
    fig.subplots_adjust(left=0.8 / width_in, right=1 - 3.6 / width_in, top=1 - 0.75 / height,
                        bottom=(0.6 + 0.14 * lines + 0.15) / height)
    return fig


def _op_or_none(family: str, op: str) -> Op | None:
    try:
        return registry.get(family).op(op)
    except KeyError:
        return None


def plot_roofline_measured(family, op, device_name: str | None = None, dtype: str | None = None, save: bool = True):
    """Each version placed by what Nsight Compute measured (results/<device>/ncu.csv: its newest run, launches
    summed) beside the op's formula: for an op with a FLOP formula a roofline, each version at its measured DRAM
    bytes (filled) and at the formula's bytes (hollow), joined; for one without (memory-bound: embedding) bars of
    measured against formula bytes per version, with the GB/s of the measured bytes against the copy ceiling.
    `family`, `op`: names or the registry's objects; device: default the newest ncu row's, dtype the newest there.
    Returns the saved figure's path (save=False: the figure), or None when there are no ncu rows."""
    fam = family if isinstance(family, str) else family.name
    opname = op if isinstance(op, str) else op.name
    calls = profile.measured_calls(fam, opname, device_name, dtype)
    if not calls:
        return None
    r0 = max((r for c in calls for r in c["rows"]), key=lambda r: r["timestamp"] or "")
    ceil = ceilings_cached(r0["device_name"], r0["torch"])
    roof = any(c["flops"] for c in calls)
    fig = (_measured_roofline if roof else _measured_bars)(fam, opname, calls, ceil)
    if not save:
        return fig
    return save_figure(fig, f"{fam}_{opname}_{calls[0]['dtype']}_measured", device_name=r0["device_name"])


def plot_family(family, device_name: str | None = None) -> list[Path]:
    out = []
    for op in family.ops:
        dtypes = sorted({r["dtype"] for r in _rows_for(op, device_name, None)})
        for dt in dtypes:
            for fn in (time_vs_size, speedup_bars, roofline):
                p = fn(op, dt, device_name)
                if p:
                    out.append(p)
        prof = profile.read_profiles(family=family.name, op=op.name)
        dev = device_name or (max(prof, key=lambda r: r["timestamp"] or "")["device_name"] if prof else None)
        for dt in sorted({r["dtype"] for r in prof if r["device_name"] == dev}):
            p = plot_profile(family.name, op.name, dev, dt)
            if p:
                out.append(p)
        ncu_rows = profile.read_ncu(family=family.name, op=op.name)   # measured bytes beside the formula's
        ndev = device_name or (max(ncu_rows, key=lambda r: r["timestamp"] or "")["device_name"] if ncu_rows else None)
        for dt in sorted({r["dtype"] for r in ncu_rows if r["device_name"] == ndev}):
            p = plot_roofline_measured(family.name, op.name, ndev, dt)
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


def plot_all(device_name: str | None = None, devices: list[str] | None = None, progress: bool = False,
             families: list[str] | None = None) -> list[Path]:
    """Every family's figures (or those of `families`) from the rows of `device_name`, or of each of `devices`
    (default: this machine's devices that have rows), each into results/<device>/plots/ — never another machine's
    folder unless named."""
    if device_name:
        devices = [device_name]
    elif devices is None:
        have = {r["device_name"] for r in results.read()}
        devices = [d for d in this_machine() if d in have]
    out = []
    for dev in devices:
        for fam in registry.families():
            if families is not None and fam.name not in families:
                continue
            if progress:
                print(f"[lab] plotting {fam.name} ({dev}) ...", flush=True)
            out += plot_family(fam, dev)
    return out
