"""embedding's study: the goals of issue 16 read from the recorded rows, the determinism and index-check
measurements of notebook 09, the profiler's kernels grouped by stage, and the ladder's figure (the family itself, the
API, reference and Ops: lab/kernels/embedding.py).

    rows_for                       the newest GPU's embedding rows in the results table (or rows handed in)
    table                          per op, shape, dtype and version: us, GB/s, % of copy, speedup (same mode)
    goals, goals_table             each goal's value, target, status and margin, from the rows
    determinism                    bits of each backward version's grad_weight across runs
    check_cost                     eager time with and without the index check (its synchronisation)
    group_kernels                  kernel_times of a backward, summed by stage (sort, offsets, pieces, rows)
    plot_ladder                    achieved GB/s against tokens, forward and backward, uniform and Zipf indices
                                   (results/<device>/plots/embedding_ladder_<dtype>.png), redrawn by `lab plot`
"""
from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import torch

from .. import registry, results
from ..plot import save_figure   # (lab.plot picks matplotlib's backend: Agg outside a notebook)
from ..timing import time_cuda
from ..kernels.embedding import (FAMILY, FORMULA_BWD, FORMULA_FWD, VOCAB, embedding, embedding_backward,
                                 make_backward, make_forward, make_shape)

# The issue's shape: 65536 tokens x dim 1024 x GPT-2's vocabulary.
GOAL_TOKENS, GOAL_DIM = 65536, 1024
DETERMINISTIC = ("v2", "v3", "v4")       # the sorted backward versions (v1 adds with atomics)
FWD_COPY_PCT = 95.0                      # forward >= 95 % of the copy bandwidth
BWD_SPEEDUP = 3.0                        # backward >= 3x PyTorch's, same mode
DET_SPEEDUP = 2.0                        # the deterministic backward >= 2x PyTorch's
FLOOR_RATIO = 2.0                        # backward <= 2x the memory floor (read grad_out + write grad_weight)


def _parse_shape(label: str) -> dict:
    """'tokens=65536 dim=1024 vocab=50257 dist=zipf idx=int64' -> {'tokens': '65536', ...}."""
    return dict(kv.split("=", 1) for kv in (label or "").split() if "=" in kv)


def _key(r: dict) -> str:
    return r["version"] + (" (graph)" if r["mode"] == "graph" else "")


def _is_kernel(r: dict) -> bool:
    return r["version"].startswith("v")


def rows_for(rows: list[dict] | None = None, device_name: str | None = None) -> list[dict]:
    """rows as given, or the newest embedding rows of `device_name` from the results table (default: the device of
    the newest CUDA row, else of the newest row), op x version x shape x dtype x mode once each."""
    return rows if rows is not None else results.family_rows(FAMILY, device_name)


def copy_gbps_of(rows: list[dict]) -> float | None:
    """The copy rate the rows' % of copy was read against (GB/s / its %), or None."""
    for r in rows:
        if r.get("gbps") and r.get("pct_copy_bw"):
            return r["gbps"] * 100.0 / r["pct_copy_bw"]
    return None


def _order(r: dict) -> tuple:
    s = _parse_shape(r["shape"])
    return (r["op"] != "forward", r["dtype"], s.get("dist", ""), int(s.get("tokens", 0)),
            not _is_kernel(r), r["version"], r["mode"])


def table(rows: list[dict], tokens: int | None = None) -> str:
    """One line per (op, tokens, dist, dtype, version, mode): median us, GB/s, % of copy, speedup over torch in the
    same mode. tokens: only that many tokens."""
    sel = [r for r in rows if tokens is None or int(_parse_shape(r["shape"]).get("tokens", -1)) == tokens]
    lines = [f"{'op':<9} {'tokens':>6} {'dist':<8} {'dtype':<9} {'version':<12} {'us':>9} {'GB/s':>7} {'%copy':>6} "
             f"{'vs torch':>8}"]
    prev = None
    for r in sorted(sel, key=_order):
        s = _parse_shape(r["shape"])
        group = (r["op"], s.get("tokens"), s.get("dist"), r["dtype"])
        if prev is not None and group != prev:
            lines.append("")
        prev = group
        f = lambda x, fmt: (fmt % x) if x is not None else "-"
        lines.append(f"{r['op']:<9} {s.get('tokens', '?'):>6} {s.get('dist', '?'):<8} {r['dtype']:<9} "
                     f"{_key(r):<12} {r['median_us']:>9.1f} {f(r['gbps'], '%7.0f'):>7} "
                     f"{f(r['pct_copy_bw'], '%5.1f'):>6} {f(r['speedup'], '%7.2fx'):>8}")
    return "\n".join(lines)


def _at_goal(rows, op, dist, dtype, mode):
    return [r for r in rows if r["op"] == op and r["dtype"] == dtype and r["mode"] == mode
            and _parse_shape(r["shape"]).get("dist") == dist
            and int(_parse_shape(r["shape"]).get("tokens", -1)) == GOAL_TOKENS
            and int(_parse_shape(r["shape"]).get("dim", -1)) == GOAL_DIM]


def _goal(name, value, target, at_least, unit, detail="") -> dict:
    if value is None:
        return {"goal": name, "value": None, "target": target, "met": None, "margin": None, "unit": unit,
                "detail": detail or "not measured"}
    margin = value / target if at_least else target / value
    return {"goal": name, "value": value, "target": target, "met": margin >= 1.0, "margin": margin, "unit": unit,
            "detail": detail}


def _best(rows, key, versions=None, largest=True):
    cands = [r for r in rows if _is_kernel(r) and r.get(key) is not None and (versions is None or r["version"] in
                                                                                versions)]
    if not cands:
        return None
    return (max if largest else min)(cands, key=lambda r: r[key])


def goals(rows: list[dict], deterministic: dict[str, bool] | None = None,
          dtypes=("float32", "bfloat16"), dists=("uniform", "zipf")) -> list[dict]:
    """Issue 16's goals at 65536 tokens x dim 1024 x vocab 50257, from bench rows of both ops (and, for the
    bit-for-bit goal, determinism()'s verdicts). Each: value, target, met (None: no rows), margin (>= 1 when met:
    value / target for an at-least goal, target / value for an at-most one), and which row it came from."""
    out = []
    copy = copy_gbps_of(rows)
    for dt in dtypes:
        for dist in dists:
            # forward: the best kernel replayed from a graph (no index check there, no launch gaps)
            b = _best(_at_goal(rows, "forward", dist, dt, "graph"), "pct_copy_bw")
            out.append(_goal(f"forward {dt} {dist}: % of copy (graph)", b and b["pct_copy_bw"], FWD_COPY_PCT, True,
                             "%", b and f"{b['version']}, {b['median_us']:.1f} us"))
    for dt in dtypes:
        for dist in dists:
            for mode in ("graph", "events"):
                at = _at_goal(rows, "backward", dist, dt, mode)
                m = "graph" if mode == "graph" else "eager"
                b = _best(at, "speedup")
                out.append(_goal(f"backward {dt} {dist}: speedup over torch ({m})", b and b["speedup"], BWD_SPEEDUP,
                                 True, "x", b and f"{b['version']}, {b['median_us']:.1f} us"))
                d = _best(at, "speedup", DETERMINISTIC)
                out.append(_goal(f"deterministic backward {dt} {dist}: speedup ({m})", d and d["speedup"],
                                 DET_SPEEDUP, True, "x", d and f"{d['version']}, {d['median_us']:.1f} us"))
            # the memory floor: read grad_out + write grad_weight once, at the measured copy rate
            b = _best(_at_goal(rows, "backward", dist, dt, "graph"), "median_us", largest=False)
            if b is not None and copy and b.get("gbps"):
                nbytes = b["gbps"] * 1e9 * b["median_us"] * 1e-6          # the op's byte formula, recovered
                floor_us = nbytes / (copy * 1e9) * 1e6
                out.append(_goal(f"backward {dt} {dist}: time / memory floor (graph)", b["median_us"] / floor_us,
                                 FLOOR_RATIO, False, "x of floor",
                                 f"{b['version']}, {b['median_us']:.1f} us; floor {nbytes / 1e6:.0f} MB at "
                                 f"{copy:.0f} GB/s = {floor_us:.1f} us"))
            else:
                out.append(_goal(f"backward {dt} {dist}: time / memory floor (graph)", None, FLOOR_RATIO, False,
                                 "x of floor"))
    if deterministic is not None:
        ours = {v: ok for v, ok in deterministic.items() if v in DETERMINISTIC or v == "cpu"}
        if ours:
            same = sum(ours.values())
            out.append({"goal": "deterministic backward: bit-for-bit identical run to run", "value": same,
                        "target": len(ours), "met": same == len(ours), "margin": None, "unit": "versions",
                        "detail": ", ".join(f"{v} {'identical' if ok else 'DIFFERS'}" for v, ok in ours.items())})
    return out


def goals_table(gs: list[dict]) -> str:
    lines = []
    for g in gs:
        status = {True: "met   ", False: "MISSED", None: "-     "}[g["met"]]
        if g["value"] is None:
            val = "no rows"
        elif g["unit"] == "versions":
            val = f"{g['value']}/{g['target']} versions"
        elif g["unit"] == "%":
            val = f"{g['value']:.1f}% (goal >= {g['target']:.0f}%)"
        elif g["unit"] == "x of floor":
            val = f"{g['value']:.2f}x (goal <= {g['target']:.0f}x)"
        else:
            val = f"{g['value']:.2f}x (goal >= {g['target']:.0f}x)"
        margin = f"margin {g['margin']:.2f}x" if g["margin"] is not None else ""
        lines.append(f"{status} {g['goal']:<58} {val:<26} {margin:<13} {g['detail'] or ''}")
    return "\n".join(lines)


def eager_minus_graph(rows: list[dict], versions=("v1", "v2", "v3", "v4", "torch")) -> str:
    """Per (op, dtype, dist) at the goal shape: the eager median minus the graph replay's, per version. Eager v1/v2
    pay a reduction and a sync before the launch, v3/v4 a sync after it; the replay has neither (nor launch gaps)."""
    lines = [f"{'op':<9} {'dtype':<9} {'dist':<8} " + " ".join(f"{v:>9}" for v in versions) + "   (eager - graph, us)"]
    for op in ("forward", "backward"):
        for dt in sorted({r["dtype"] for r in rows}):
            for dist in ("uniform", "zipf"):
                e = {r["version"]: r["median_us"] for r in _at_goal(rows, op, dist, dt, "events")}
                g = {r["version"]: r["median_us"] for r in _at_goal(rows, op, dist, dt, "graph")}
                if not e or not g:
                    continue
                cells = [f"{e[v] - g[v]:>9.1f}" if v in e and v in g else f"{'-':>9}" for v in versions]
                lines.append(f"{op:<9} {dt:<9} {dist:<8} " + " ".join(cells))
    return "\n".join(lines)


# ---- measurements on a device ------------------------------------------------------------------------------------
def determinism(device, versions, dtype: torch.dtype = torch.float32, runs: int = 5, tokens: int = 65536,
                dim: int = 256, vocab: int = 5000) -> dict[str, dict]:
    """grad_weight of each backward version (or 'torch') `runs` times on the same Zipf-like inputs: per version,
    whether every run has the first run's bits, and how many elements differed at most."""
    device = torch.device(device)
    s = make_shape(tokens, dim, vocab, "zipf")
    grad, idx, V, _ = make_backward(s, dtype, device, torch.Generator().manual_seed(8))
    out = {}
    for v in versions:
        if v == "torch":
            call = lambda: torch.ops.aten.embedding_dense_backward(grad, idx, V, -1, False)
        else:
            call = (lambda v: lambda: embedding_backward(grad, idx, V, version=v))(v)
        first = call().clone()
        worst = 0
        for _ in range(runs - 1):
            worst = max(worst, int((call() != first).sum()))   # bitwise: no NaN in these sums
        out[v] = {"identical": worst == 0, "max_elements_differing": worst, "elements": first.numel()}
    return out


def check_cost(device, dtype: torch.dtype = torch.float32, dist: str = "uniform", versions=("v3", "v4"),
               tokens: int = GOAL_TOKENS, dim: int = GOAL_DIM, vocab: int = VOCAB) -> list[dict]:
    """Eager time of forward and backward v3/v4 (default: at the goal shape) with the index check on (a ValueError
    for a bad index, bought with a synchronisation) and off (NaN rows instead): the check's price per call."""
    device = torch.device(device)
    s = make_shape(tokens, dim, vocab, dist)
    out = []
    idx, w, _ = make_forward(s, dtype, device, torch.Generator().manual_seed(1234))
    y = torch.empty((*idx.shape, dim), dtype=dtype, device=device)
    for v in versions:
        t = {c: time_cuda(lambda: embedding(idx, w, version=v, out=y, check_indices=c)).median_us for c in (True, False)}
        out.append({"op": "forward", "version": v, "checked_us": t[True], "unchecked_us": t[False]})
    del w, y
    grad, idx, V, _ = make_backward(s, dtype, device, torch.Generator().manual_seed(1234))
    gw = torch.empty((V, dim), dtype=dtype, device=device)
    for v in versions:
        t = {c: time_cuda(lambda: embedding_backward(grad, idx, V, version=v, out=gw, check_indices=c)).median_us
             for c in (True, False)}
        out.append({"op": "backward", "version": v, "checked_us": t[True], "unchecked_us": t[False]})
    return out


STAGES = (  # (stage, substrings of the kernel names, lower case); the first that matches names the stage
    ("sort", ("radix", "sort", "onesweep")),
    ("csr_offsets", ("csr_offsets",)),
    ("long_run_pieces", ("long_run_pieces",)),
    ("rows_from_runs", ("rows_from_runs",)),
    ("key_ends", ("key_ends",)),
    ("memcpy/memset", ("memcpy", "memset")),
)


def group_kernels(times: dict[str, float]) -> dict[str, float]:
    """lab.profile.kernel_times' {kernel name: us per call} summed by stage (STAGES; the rest under 'other'), largest
    first. v4's sort_inputs kernel counts as sort."""
    out: dict[str, float] = {}
    for name, us in times.items():
        low = name.lower()
        stage = next((s for s, keys in STAGES if any(k in low for k in keys)), "other")
        out[stage] = out.get(stage, 0.0) + us
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


# ---- the figure ---------------------------------------------------------------------------------------------------
def plot_ladder(rows: list[dict] | None = None, dtype: str = "float32", device_name: str | None = None,
                path: Path | str | None = None):
    """Achieved GB/s against tokens (dim 1024, vocab 50257), one panel per (op, dist), one line per version replayed
    from a CUDA graph (torch dashed), the copy rate dotted. rows: fresh bench rows, or None for the recorded ones
    (rows_for). Returns the figure's path (results/<device>/plots/embedding_ladder_<dtype>.png), or None without
    rows."""
    rows = [r for r in rows_for(rows, device_name) if r["dtype"] == dtype and r["mode"] == "graph" and r.get("gbps")]
    if not rows:
        return None
    fig, axes = plt.subplots(2, 2, figsize=(11, 8), squeeze=False)
    versions = sorted({r["version"] for r in rows}, key=lambda v: (not v.startswith("v"), v))
    copy = copy_gbps_of(rows)
    for i, (op, formula) in enumerate((("forward", FORMULA_FWD), ("backward", FORMULA_BWD))):
        for j, dist in enumerate(("uniform", "zipf")):
            ax = axes[i][j]
            sel = [r for r in rows if r["op"] == op and _parse_shape(r["shape"]).get("dist") == dist]
            for k, v in enumerate(versions):
                pts = sorted((int(_parse_shape(r["shape"])["tokens"]), r["gbps"]) for r in sel if r["version"] == v)
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], "--" if v == "torch" else "-", marker="o",
                            ms=4, color="0.4" if v == "torch" else f"C{k}", label=v)
            if copy:
                ax.axhline(copy, color="k", ls=":", lw=1, label=f"copy {copy:.0f} GB/s")
            ax.set_xscale("log", base=2)
            if op == "backward":
                ax.set_yscale("log")
            ax.set_xlabel("tokens (dim 1024, vocab 50257)")
            ax.set_ylabel("achieved GB/s (graph replay)")
            ax.set_title(f"{op}, {dist} indices, {dtype}", fontsize=10)
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7)
    r0 = max(rows, key=lambda r: r["timestamp"] or "")
    fig.text(0.01, 0.005, f"forward: {FORMULA_FWD}\nbackward: {FORMULA_BWD}\n{r0['device_name']} · torch "
                          f"{r0['torch']} · CUDA {r0['cuda']} · commit {r0['commit']} · {r0['timestamp']}",
             fontsize=7, color="0.35")
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    if path is None:
        return save_figure(fig, f"embedding_ladder_{dtype}", device_name=r0["device_name"])
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


registry.attach_plots(FAMILY, [lambda device_name: plot_ladder(device_name=device_name)])
