"""sparse24's study: issue 17's goals for 2:4 sparsity read from the recorded rows, and where the time of torch's
semi-structured F.linear goes (the family itself, the API, reference and Ops: lab/kernels/sparse24.py).

    rows_for          the newest GPU's sparse24 rows in the results table (or rows handed in)
    goals, goals_table  each goal's value, target, status and margin, from the rows
    designs           the tensor-core designs at the GEMM goal's shape side by side: time, margin, and Nsight Compute
    against           per shape: our best version against each baseline, in the same mode
    call_vs_kernels   a call (timed as the benchmarks time it) against the device time of the kernels it launches
"""
from __future__ import annotations

from .. import profile, results
from ..kernels.sparse24 import FAMILY, FC_OUT, SQUARE
from ..timing import time_cuda

SPEEDUP = 1.5            # >= 1.5x dense cuBLAS (bf16), same mode, at 4096 x 4096 x 4096 and at batch 1
GOAL_DTYPE = "bfloat16"


def rows_for(rows: list[dict] | None = None, device_name: str | None = None) -> list[dict]:
    """rows as given, or the newest sparse24 rows of `device_name` from the results table (default: the device of
    the newest CUDA row, else of the newest row), op x version x shape x dtype x mode once each."""
    return rows if rows is not None else results.family_rows(FAMILY, device_name)


def _shape(label: str) -> dict:
    return profile.parse_shape_label(label)   # 'M=1 N=4096 K=4096 bias=1' -> {'M': 1, ...}


def _pick(rows, op, m, n, k, dtype, mode):
    return [r for r in rows if r["op"] == op and r["dtype"] == dtype and r["mode"] == mode
            and (lambda s: (s.get("M"), s.get("N"), s.get("K")) == (m, n, k))(_shape(r["shape"]))]


def _best_ours(sel):
    ours = [r for r in sel if r["version"].startswith("v") and r.get("speedup") is not None]
    return max(ours, key=lambda r: r["speedup"]) if ours else None


def goals(rows: list[dict]) -> list[dict]:
    """Issue 17's goals for our sparse kernels (bf16), per timing mode: >= 1.5x dense cuBLAS at 4096 x 4096 x 4096 and
    at batch 1 (the 4096 x 4096 weight), and the decoder's fc_out shape run (cuSPARSELt refuses it)."""
    out = []
    for mode in ("events", "graph"):
        for what, op, (m, n, k) in (("4096 x 4096 x 4096", "linear", (SQUARE, SQUARE, SQUARE)),
                                    ("batch 1, 4096 x 4096 weight", "linear", (1, SQUARE, SQUARE)),
                                    ("batch 1, fc_out 1280 -> 5893", "fc_out", (1, FC_OUT["N"], FC_OUT["K"]))):
            best = _best_ours(_pick(rows, op, m, n, k, GOAL_DTYPE, mode))
            if best is None:
                continue
            target = SPEEDUP if op == "linear" else None
            margin = best["speedup"] / target if target else None
            out.append({"goal": f"{what}: x dense cuBLAS" + (f" >= {target:g}" if target else " (supported)"),
                        "mode": "eager" if mode == "events" else "graph", "version": best["version"],
                        "value": best["speedup"], "target": target, "margin": margin,
                        "met": margin >= 1.0 if margin is not None else True, "us": best["median_us"]})
    return out


def goals_table(gs: list[dict]) -> str:
    if not gs:
        return "no sparse24 rows recorded yet (python -m lab bench sparse24 on a GPU records them)"
    lines = [f"{'goal':<52} {'mode':<6} {'best':<5} {'us':>8} {'x dense':>8} {'target':>7} {'margin':>7}  status"]
    for g in gs:
        tgt = f"{g['target']:.2f}" if g["target"] else "-"
        mg = f"{g['margin']:.2f}" if g["margin"] is not None else "-"
        lines.append(f"{g['goal']:<52} {g['mode']:<6} {g['version']:<5} {g['us']:8.1f} {g['value']:7.2f}x {tgt:>7} "
                     f"{mg:>7}  {'met' if g['met'] else 'MISSED'}")
    return "\n".join(lines)


def against(rows: list[dict], op: str = "linear", dtype: str = GOAL_DTYPE, mode: str = "events") -> str:
    """Per shape: the fastest of our versions, its time, and its ratio to each baseline timed at that shape and mode
    (> 1: ours faster)."""
    sel = [r for r in rows if r["op"] == op and r["dtype"] == dtype and r["mode"] == mode]
    shapes = sorted({r["shape"] for r in sel}, key=lambda s: _shape(s).get("M", 0))
    bases = sorted({r["version"] for r in sel if not r["version"].startswith("v")})
    lines = [f"{op} {dtype} ({'eager' if mode == 'events' else 'graph'}): {'shape':<30} {'ours':<4} {'us':>8}  " +
             "  ".join(f"{'x ' + b:>14}" for b in bases)]
    for s in shapes:
        here = [r for r in sel if r["shape"] == s]
        ours = [r for r in here if r["version"].startswith("v")]
        if not ours:
            continue
        best = min(ours, key=lambda r: r["median_us"])
        ratios = []
        for b in bases:
            br = [r for r in here if r["version"] == b]
            ratios.append(f"{br[0]['median_us'] / best['median_us']:13.2f}x" if br else f"{'-':>14}")
        lines.append(f"{'':<{len(op) + len(dtype) + 10}}{s:<30} {best['version']:<4} {best['median_us']:8.1f}  " +
                     "  ".join(ratios))
    return "\n".join(lines)


def designs(rows: list[dict], ncu_rows: list[dict], versions=("v2", "v4"), mode: str = "events") -> str:
    """The GEMM goal (bf16, 4096 x 4096 x 4096) per tensor-core design: its time, its speedup over dense cuBLAS in the
    same run and mode, the margin to the goal (speedup / 1.5), and from Nsight Compute (the newest launch of its
    longest kernel at that shape) the kernel time, tensor-pipe and SM throughput and the top stalls: what bounds
    each design, printed beside cuBLAS's kernel."""
    sel = _pick(rows, "linear", SQUARE, SQUARE, SQUARE, GOAL_DTYPE, mode)
    label = {r["shape"] for r in sel}
    nc = [r for r in ncu_rows if r["op"] == "linear" and r["dtype"] == GOAL_DTYPE and r["shape"] in label]
    head = (f"{'version':<8} {'us':>8} {'x dense':>8} {'margin':>7}   {'ncu kernel':<28} {'us':>7} {'TC%':>5} "
            f"{'SM%':>5}  top stalls")
    lines = [f"linear {GOAL_DTYPE} {SQUARE}^3 ({'eager' if mode == 'events' else 'graph'}), goal >= {SPEEDUP:g}x "
             f"dense cuBLAS", head]
    for v in (*versions, "torch"):
        r = next((r for r in sel if r["version"] == v), None)
        mine = [k for k in nc if k["version"] == v]
        if mine:   # the newest ncu run of this version, its longest launch
            newest = max(k["timestamp"] or "" for k in mine)
            k = max((k for k in mine if (k["timestamp"] or "") == newest), key=lambda k: k["duration_us"] or 0)
            ncu = (f"{profile.short_kernel_name(k['kernel'], 28):<28} {k['duration_us'] or 0:7.1f} "
                   f"{k['tensor_pct'] or 0:5.1f} {k['sm_pct'] or 0:5.1f}  {profile.stall_text(k)}")
        else:
            ncu = "(no ncu row at this shape)"
        if r is None:
            lines.append(f"{v:<8} {'-':>8} {'-':>8} {'-':>7}   {ncu}")
            continue
        sp = r.get("speedup")
        margin = f"{sp / SPEEDUP:7.2f}" if sp is not None and v != "torch" else f"{'-':>7}"
        lines.append(f"{v:<8} {r['median_us']:8.1f} {(f'{sp:7.2f}x' if sp is not None else '-'):>8} {margin}   {ncu}")
    return "\n".join(lines)


def call_vs_kernels(fn, label: str, reps: int = 20) -> dict:
    """A call (a baseline's, or the lab's through its wrapper) timed as the benchmarks time it (the larger of the GPU's and the host's time a repetition,
    lab.timing) beside the device time of the kernels it launches (the profiler's GPU events): where they differ, the
    difference is the host's work around the kernels."""
    t = time_cuda(fn)
    kt = profile.kernel_times(fn, reps=reps)
    host = sorted(t.host_us)[len(t.host_us) // 2] if t.host_us else None
    return {"what": label, "call_us": t.median_us, "host_us": host, "kernels_us": sum(kt.values()),
            "kernels": kt}


def call_vs_kernels_table(entries: list[dict]) -> str:
    lines = [f"{'call':<44} {'timed call us':>13} {'host us':>9} {'kernels us':>11}  kernels"]
    for e in entries:
        ks = ", ".join(f"{profile.short_kernel_name(k, 28)} {v:.1f}" for k, v in list(e["kernels"].items())[:3])
        host = f"{e['host_us']:9.1f}" if e["host_us"] is not None else f"{'-':>9}"
        lines.append(f"{e['what']:<44} {e['call_us']:13.1f} {host} {e['kernels_us']:11.1f}  {ks}")
    return "\n".join(lines)
