"""Did anything measured get slower? Rows of one commit (or run) against the newest earlier rows of the same
measurement: same family, op, version, dtype, shape and mode, on the same device.

    python -m lab compare                        # the newest commit's rows against each row's previous measurement
    python -m lab compare --new abc1234          # that commit's rows
    python -m lab compare --base 1f67da4         # against that commit's rows only

A row counts as slower when its median is more than `--tolerance` (default 5%) above the base's median AND the two
runs' p20-p80 bands do not overlap (run-to-run spread on the H100 is a few percent: a 5% change inside overlapping
bands is noise). Rows come in today's vocabulary (lab.results.current_names, lab/renames.json), so kron's old "v3" is
compared with today's "v1", and linear's old v14 at batch 1 with the gemv op's v1.

Each slowdown of ours is then explained where the rows allow (`explain`): a baseline that moved as much (the machine),
a steady graph row of the same call (the host's time to issue the eager call), or a base row timed before host time
counted (de761d0) with a baseline slower too. The command fails only on a slowdown nothing explains.
"""
from __future__ import annotations

from . import results

KEY = ("device_name", "family", "op", "version", "dtype", "shape", "mode")


def _num(v) -> float | None:
    return float(v) if v not in (None, "") else None


def compare(rows: list[dict], new: str | None = None, base: str | None = None, tolerance: float = 0.05) -> list[dict]:
    """One entry per measurement of commit `new` (default: the newest commit in `rows`) that has an earlier one: the
    base row (the newest of another commit -- of commit `base` if given -- timed before this row), the ratio new/base
    of medians, and whether it is slower. Before *this row*, not before the commit's first row: an A/B run that times
    the base commit's tree and the new one alternately on one GPU (.ci/ab) compares each new row with the
    base tree's run just before it, on the same machine."""
    if not rows:
        return []
    rows = [r for r in rows if r.get("median_us") not in (None, "")]
    if new is None:
        new = max(rows, key=lambda r: r["timestamp"])["commit"]
    rows = [results.current_names(r) for r in rows]   # (read() did this already for rows from the CSVs)
    new_rows = [r for r in rows if r["commit"] == new]
    graph_us = {tuple(r[c] for c in KEY[:-1]): float(r["median_us"]) for r in new_rows if r["mode"] == "graph"}
    out = []
    for r in new_rows:
        k = tuple(r[c] for c in KEY)
        olds = [o for o in rows if tuple(o[c] for c in KEY) == k and o["commit"] != new
                and o["timestamp"] < r["timestamp"]
                and (base is None or o["commit"] == base)]
        if not olds:
            continue
        o = max(olds, key=lambda x: x["timestamp"])
        ratio = float(r["median_us"]) / float(o["median_us"])
        apart = float(r["p20_us"]) > float(o["p80_us"])
        # the GPU's part of each side where the rows tell it: recorded (gpu_us), or the whole time of a row timed
        # before host time counted
        base_gpu = _num(o.get("gpu_us")) or (float(o["median_us"]) if o["timestamp"] < HOST_COUNTED_SINCE[1] else None)
        out.append({**{c: r[c] for c in KEY}, "base_commit": o["commit"], "base_us": float(o["median_us"]),
                    "base_ts": o["timestamp"],
                    "new_us": float(r["median_us"]), "ratio": ratio, "slower": ratio > 1 + tolerance and apart,
                    "graph_us": graph_us.get(k[:-1]) if r["mode"] == "events" else None,
                    "gpu_us": _num(r.get("gpu_us")), "base_gpu_us": base_gpu})
    return sorted(out, key=lambda e: -e["ratio"])


# a baseline's shift in microseconds explains ours only where its base time is at most this many times ours
SHIFT_SCALE = 4.0
BASELINE_PREFIXES = ("torch", "cublas", "cudnn", "triton", "cusparselt", "reference")
# the commit from which a repetition's time is the larger of the GPU's and the host's (lab/timing.py); rows timed
# before it counted the GPU's time alone, so a call that is host-bound today read faster then
HOST_COUNTED_SINCE = ("de761d0", "2026-11-25T03:34:37")


def explain(entries: list[dict], tolerance: float = 0.05) -> list[dict]:
    """Each slower entry gets `why`: 'machine' when a PyTorch baseline of the same measurement (device, op, dtype,
    shape, mode) moved at least as much between the same two runs, as a ratio or in microseconds (clocks, the lent
    VM's host, a launch latency: not our code);
    'host' when the kernels ran as fast and what grew is the host's time to issue the call, which a repetition counts
    since de761d0 (lab/timing.py: the larger of GPU and host time) -- read from the GPU's part of the new row (gpu_us)
    against the base's (its gpu_us, or its whole time if timed before de761d0; where a base row since de761d0 has no
    gpu_us, its whole time bounds its GPU part from above, so a new GPU part at or below it counts), or for an eager
    row from the same run's graph row of the call (not slower than the base eager row, or compared with the base's
    graph row and not slower; a replay also drops the gaps between a call's kernels, so for a call of several kernels
    this reading is the weaker one); 'rule' when the base row was timed before de761d0 and a baseline of the same
    measurement got slower too (the shape is host-bound under today's rule, ours by its own host time); '' when none
    of these explains it. Returns the entries."""
    moves: dict[tuple, list[float]] = {}
    shifts: dict[tuple, list[tuple[float, float]]] = {}   # (microseconds it grew by, its base time)
    graph: dict[tuple, dict] = {}
    for e in entries:
        k = (e["device_name"], e["family"], e["op"], e["dtype"], e["shape"])
        if e["version"].startswith(BASELINE_PREFIXES):
            moves.setdefault(k + (e["mode"],), []).append(e["ratio"])
            if e["ratio"] > 1 + tolerance:   # a baseline that itself got slower: its shift is a move, not noise
                shifts.setdefault(k + (e["mode"],), []).append((e["new_us"] - e["base_us"], e["base_us"]))
        if e["mode"] == "graph":
            graph[k + (e["version"],)] = e
    for e in entries:
        e["why"] = ""
        if not e["slower"] or e["version"].startswith(BASELINE_PREFIXES):
            continue
        k = (e["device_name"], e["family"], e["op"], e["dtype"], e["shape"])
        if any(m * (1 + tolerance) >= e["ratio"] for m in moves.get(k + (e["mode"],), [])):
            e["why"] = "machine"
        elif any(d * (1 + tolerance) >= e["new_us"] - e["base_us"] and b <= SHIFT_SCALE * e["base_us"]
                 for d, b in shifts.get(k + (e["mode"],), [])):
            # a baseline of the same measurement, a call of the same scale, got slower by as many microseconds: a
            # fixed cost per call moved (a graph replay's or a launch's latency on another host), which reads as a
            # larger ratio on the shorter call. (A long baseline's few percent cannot explain a short call's growth.)
            e["why"] = "machine"
        elif (e.get("gpu_us") is not None and e.get("base_gpu_us") is not None
              and e["gpu_us"] <= e["base_gpu_us"] * (1 + tolerance)):
            e["why"] = "host"
        elif (e.get("gpu_us") is not None and e.get("base_gpu_us") is None
              and e["gpu_us"] <= e["base_us"] * (1 + tolerance)):
            # a base row timed since de761d0 but before rows kept their GPU part: a repetition is the larger of GPU
            # and host time, so the base's whole time bounds its GPU part from above; a GPU part at or below it now
            # means the kernels did not get slower and the growth is host time
            e["why"] = "host"
        elif e["mode"] == "events" and (
                (e.get("graph_us") is not None and e["graph_us"] <= e["base_us"] * (1 + tolerance))
                or ((g := graph.get(k + (e["version"],))) is not None and not g["slower"])):
            e["why"] = "host"
        elif e.get("base_ts", "") < HOST_COUNTED_SINCE[1] and any(m > 1 + tolerance
                                                                 for m in moves.get(k + (e["mode"],), [])):
            e["why"] = "rule"
    return entries


def report(entries: list[dict], top: int = 20, tolerance: float = 0.05) -> str:
    """The slower measurements first, the unexplained ones before those `explain` accounts for; beside each, how
    PyTorch's baselines at the same shape moved between the same two runs: when they moved as much, the machine
    changed (clocks, a busy host), not our code."""
    if not entries:
        return "no measurement of that commit has an earlier one to compare with"
    explain(entries, tolerance)
    slower = [e for e in entries if e["slower"]]
    ours = [e for e in slower if not e["version"].startswith(BASELINE_PREFIXES)]
    n = {w: sum(e["why"] == w for e in ours) for w in ("", "machine", "host", "rule")}
    base_moves: dict[tuple, list[float]] = {}
    for e in entries:
        if e["version"].startswith(BASELINE_PREFIXES):
            base_moves.setdefault((e["device_name"], e["family"], e["op"], e["dtype"], e["shape"], e["mode"]),
                                  []).append(e["ratio"])
    lines = [f"{len(entries)} measurements compared; {len(slower)} slower beyond the tolerance and the p20-p80 bands"
             f" ({len(slower) - len(ours)} of them baselines); of ours: {n['']} unexplained, {n['machine']} where a "
             f"baseline moved as much (machine), {n['host']} whose GPU part or graph row is steady (host time), "
             f"{n['rule']} timed before {HOST_COUNTED_SINCE[0]} where a baseline got slower too (rule)"]
    tag = {"": "", "machine": "  [machine]", "host": "  [host: GPU part or graph row steady]",
           "rule": f"  [rule: host time counted since {HOST_COUNTED_SINCE[0]}]"}
    order = sorted(slower, key=lambda e: (e["version"].startswith(BASELINE_PREFIXES), e.get("why", "") != "",
                                           -e["ratio"]))
    for e in (order or entries)[:top]:
        moves = base_moves.get((e["device_name"], e["family"], e["op"], e["dtype"], e["shape"], e["mode"]), [])
        ctx = "" if e["version"].startswith(BASELINE_PREFIXES) or not moves else \
            f"  (baselines here: {', '.join(f'{m:.2f}x' for m in moves)})"
        lines.append(f"  {e['ratio']:6.2f}x  {e['family']}.{e['op']} {e['version']} {e['dtype']} {e['shape']} "
                     f"({e['mode']}): {e['base_us']:.2f} us at {e['base_commit']} -> {e['new_us']:.2f} us{ctx}"
                     f"{tag[e.get('why', '')]}")
    return "\n".join(lines)


def rerun_commands(entries: list[dict]) -> list[str]:
    """The `python -m lab bench` commands that time the unexplained slower rows of ours again (one per family, op,
    dtype and shape, its versions named; the ratio baselines are timed beside them, as always): run them on the
    base's kind of machine, alone, then compare again -- a row that is back is the machine's, one that is not is
    ours."""
    if any("why" not in e for e in entries):
        explain(entries)
    todo: dict[tuple, list[str]] = {}
    for e in entries:
        if e["slower"] and not e["why"] and not e["version"].startswith(BASELINE_PREFIXES):
            vs = todo.setdefault((e["family"], e["op"], e["dtype"], e["shape"]), [])
            if e["version"] not in vs:
                vs.append(e["version"])
    return [f"python -m lab bench {fam} --op {op} --dtype {dt} --size {shape.replace(' ', ',')} "
            + " ".join(f"--version {v}" for v in vs) for (fam, op, dt, shape), vs in todo.items()]


def main(args) -> int:
    entries = compare(results.read(), args.new, args.base, args.tolerance)
    print(report(entries, args.top, args.tolerance))
    if getattr(args, "rerun", False):
        cmds = rerun_commands(entries)
        print(f"\n{len(cmds)} command(s) that time the unexplained rows again:" if cmds else
              "\nnothing unexplained to time again")
        print("\n".join(cmds))
    # exit 1 for a slowdown of ours that `explain` does not account for (machine, host or rule)
    return 1 if any(e["slower"] and not e["version"].startswith(BASELINE_PREFIXES) and not e["why"]
                    for e in entries) else 0
