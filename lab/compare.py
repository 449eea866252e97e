"""Did anything measured get slower? Rows of one commit (or run) against the newest earlier rows of the same
measurement: same family, op, version, dtype, shape and mode, on the same device.

    python -m lab compare                        # the newest commit's rows against each row's previous measurement
    python -m lab compare --new abc1234          # that commit's rows
    python -m lab compare --base 1f67da4         # against that commit's rows only

A row counts as slower when its median is more than `--tolerance` (default 5%) above the base's median AND the two
runs' p20-p80 bands do not overlap (run-to-run spread on the H100 is a few percent: a 5% change inside overlapping
bands is noise). Rows come in today's vocabulary (lab.results.current_names, lab/renames.json), so kron's old "v3" is
compared with today's "v1", and linear's old v14 at batch 1 with the gemv op's v1.
"""
from __future__ import annotations

from . import results

KEY = ("device_name", "family", "op", "version", "dtype", "shape", "mode")


def compare(rows: list[dict], new: str | None = None, base: str | None = None, tolerance: float = 0.05) -> list[dict]:
    """One entry per measurement of commit `new` (default: the newest commit in `rows`) that has an earlier one: the
    base row (of commit `base`, or the newest earlier one), the ratio new/base of medians, and whether it is slower."""
    if not rows:
        return []
    rows = [r for r in rows if r.get("median_us") not in (None, "")]
    if new is None:
        new = max(rows, key=lambda r: r["timestamp"])["commit"]
    rows = [results.current_names(r) for r in rows]   # (read() did this already for rows from the CSVs)
    new_rows = [r for r in rows if r["commit"] == new]
    start = min((r["timestamp"] for r in new_rows), default="")
    out = []
    for r in new_rows:
        k = tuple(r[c] for c in KEY)
        olds = [o for o in rows if tuple(o[c] for c in KEY) == k and o["commit"] != new and o["timestamp"] < start
                and (base is None or o["commit"] == base)]
        if not olds:
            continue
        o = max(olds, key=lambda x: x["timestamp"])
        ratio = float(r["median_us"]) / float(o["median_us"])
        apart = float(r["p20_us"]) > float(o["p80_us"])
        out.append({**{c: r[c] for c in KEY}, "base_commit": o["commit"], "base_us": float(o["median_us"]),
                    "new_us": float(r["median_us"]), "ratio": ratio, "slower": ratio > 1 + tolerance and apart})
    return sorted(out, key=lambda e: -e["ratio"])


BASELINE_PREFIXES = ("torch", "cublas", "cudnn", "triton")


def report(entries: list[dict], top: int = 20) -> str:
    """The slower measurements first; beside each, how PyTorch's baselines at the same shape moved between the same
    two runs: when they moved as much, the machine changed (clocks, a busy host), not our code."""
    if not entries:
        return "no measurement of that commit has an earlier one to compare with"
    slower = [e for e in entries if e["slower"]]
    base_moves: dict[tuple, list[float]] = {}
    for e in entries:
        if e["version"].startswith(BASELINE_PREFIXES):
            base_moves.setdefault((e["device_name"], e["family"], e["op"], e["dtype"], e["shape"], e["mode"]),
                                  []).append(e["ratio"])
    lines = [f"{len(entries)} measurements compared; {len(slower)} slower beyond the tolerance and the p20-p80 bands"]
    for e in (slower or entries)[:top]:
        moves = base_moves.get((e["device_name"], e["family"], e["op"], e["dtype"], e["shape"], e["mode"]), [])
        ctx = "" if e["version"].startswith(BASELINE_PREFIXES) or not moves else \
            f"  (baselines here: {', '.join(f'{m:.2f}x' for m in moves)})"
        lines.append(f"  {e['ratio']:6.2f}x  {e['family']}.{e['op']} {e['version']} {e['dtype']} {e['shape']} "
                     f"({e['mode']}): {e['base_us']:.2f} us at {e['base_commit']} -> {e['new_us']:.2f} us{ctx}")
    return "\n".join(lines)


def main(args) -> int:
    entries = compare(results.read(), args.new, args.base, args.tolerance)
    print(report(entries, args.top))
    return 1 if any(e["slower"] for e in entries) else 0
