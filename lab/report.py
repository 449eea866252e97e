"""The main job (`python -m lab report`): everything this machine can run, into results/.

1. build every family at once (CUDA + C++ with a GPU, C++ alone without one), and time the build loop;
2. check every version against its float64 reference, on the CPU and (with a GPU) on the GPU;
3. measure the ceilings, then bench every op and the families' extra benchmarks on the main device;
4. profile each op (torch.profiler tables under results/profiles/, traces under results/traces/);
5. redraw the plots; write results/<device>/SUMMARY.md.
Progress is printed as it goes; what is skipped is said, with the reason.
"""
from __future__ import annotations

import json
import pathlib
import time

import torch

from . import bench, build, buildtime, env, plot, registry, results, steps, verify
from .ceilings import ceilings, ceilings_cached


def _say(msg: str) -> None:
    print(f"[lab] {msg}", flush=True)


def run(args) -> int:
    t_start = time.perf_counter()
    gpu = env.has_gpu()
    dev = env.default_device()
    fams = [registry.get(n) for n in args.families] if args.families else registry.families()
    m = env.machine()
    _say(f"report on {m['device_name']} (torch {m['torch']}, CUDA {m['cuda']}, commit {m['commit']}); "
         f"families: {', '.join(f.name for f in fams)}")
    skipped: list[str] = []
    if not gpu:
        skipped.append("CUDA versions, GPU baselines and GPU-only benchmarks: no GPU visible "
                       "(torch.cuda.is_available() is False); the C++ CPU versions ran instead")

    # 1. build
    _say(f"[1/5] building {len(fams)} families ({'cuda' if gpu else 'cpu'}) ...")
    built = build.build_all([f.name for f in fams])
    broken = {f: e for f, e in built.items() if isinstance(e, build.BuildError)}
    for f, e in broken.items():
        _say(f"BUILD FAILED {e}")
        skipped.append(f"{f}: build failed ({e.summary.splitlines()[0]})")
    fams = [f for f in fams if f.name not in broken]
    if not args.quick and "basics" in [f.name for f in fams]:
        try:
            buildtime.run(["basics"], verbose=False)
        except (build.BuildError, RuntimeError) as e:
            skipped.append(f"build-time figures: {str(e).splitlines()[0]}")

    # 2. check
    _say("[2/5] checking every version against its float64 reference ...")
    # the CPU versions are checked in CI on every push; a --quick GPU run checks the GPU versions only
    devices = ([] if (args.quick and gpu) else [torch.device("cpu")]) + ([torch.device("cuda")] if gpu else [])
    checks: list[verify.CheckResult] = []
    checked: dict[tuple[str, str, str], list[verify.CheckResult]] = {}   # (family, op, device type) -> results
    for fam in fams:
        for d in devices:
            for op in fam.ops:
                rs = steps.check(op, d, seeds=range(3))   # three seeds, quick or not (README's promise)
                verify.record(rs, fam.name, d)
                checks += rs
                checked[(fam.name, op.name, d.type)] = rs
                _say(f"  check {fam.name}.{op.name} on {d.type}: {sum(r.passed for r in rs)}/{len(rs)} passed")
    failed = [r for r in checks if not r.passed]

    # 3. bench
    rows: list[dict] = []
    broken_extras: list[str] = []
    if args.no_bench:
        skipped.append("benchmarks: --no-bench")
    else:
        _say("[3/5] ceilings, then benchmarks ...")
        ceil = ceilings(dev)
        _say(f"  ceilings: copy {ceil['copy_gbps']:.0f} GB/s; GEMM " +
             ", ".join(f"{k} {v:.1f}" for k, v in ceil['gemm_tflops'].items()) + " TFLOP/s" +
             (f"; FP32 FMA {ceil['fma_tflops']:.1f} TFLOP/s" if ceil.get("fma_tflops") else ""))
        for fam in fams:
            if fam.needs_gpu and not gpu:
                skipped.append(f"{fam.name} benchmarks: need a GPU")
                continue
            for op in fam.ops:
                shapes = op.shapes_for(dev)
                if args.quick:
                    shapes = shapes[::2]
                # validate, then benchmark: the checks of step 2 on this device already named the wrong versions
                wrong = steps.wrong_versions(checked.get((fam.name, op.name, dev.type), []))
                rows += steps.benchmark(op, dev, shapes=shapes, validate=False, skip=wrong, say=_say)
            extra_rows, failed_extras = steps.extras(fam, dev, record=True, quick=args.quick, say=_say)
            rows += extra_rows
            skipped += failed_extras
            broken_extras += [f.split(":")[0] for f in failed_extras]

    # 4. profile (--quick: the newest kernel version and the baseline of each op, not every version)
    _say("[4/5] profiling ...")
    for fam in fams:
        for op in fam.ops:
            shapes = op.shapes_for(dev)
            shape = shapes[len(shapes) // 2]
            dt = op.dtypes[0]
            versions = op.versions_for(dev, dt)
            if args.quick:
                kernels = [v for v in versions if not v.baseline]
                versions = kernels[-1:] + [v for v in versions if v.name == op.baseline]
            try:
                steps.profile_op(fam, op, dev, [dt], [v.name for v in versions], shape)
            except RuntimeError as e:
                skipped.append(f"profile {fam.name}.{op.name}: {e}")

    # 5. plots + summary
    _say("[5/5] plots and summary ...")
    # the reported families' figures only: redrawing every family's (122 figures on the H100) took a minute a report
    figs = [] if args.no_plot or not rows else plot.plot_all(m["device_name"], families=[f.name for f in fams])
    path = write_summary(skipped)
    _say(f"{len(checks) - len(failed)}/{len(checks)} checks passed; {len(rows)} timings; {len(figs)} figures; "
         f"{time.perf_counter() - t_start:.0f} s; summary in {path.relative_to(env.ROOT) if path.is_relative_to(env.ROOT) else path}")
    for s in skipped:
        _say(f"skipped: {s}")
    for r in failed:
        print(r.details())
    return 1 if failed or broken or broken_extras else 0


def write_summary(skipped: list[str] | None = None, device: str | None = None):
    """results/<device>/SUMMARY.md, from the tables: the newest row of every benchmark, check and
    build event on this kind of device, so runs of a few families at a time add up to one summary."""
    device = device or env.default_device().type
    rows = [r for r in results.latest(results.read()) if r["device"] == device]
    name = max(rows, key=lambda r: r["timestamp"] or "")["device_name"] if rows else env.device_name(device)
    rows = [r for r in rows if r["device_name"] == name]
    ck = results.read(numeric={"rel_err", "max_abs", "tol", "torch_rel_err", "seeds"}, name="checks.csv")
    checks = results.latest_checks([c for c in ck if c["device_name"] == name
                                    or (c["device"] == "cpu" and device == "cuda")])
    bt = [b for b in results.read(numeric={"seconds", "cpus"}, name="build_times.csv")
          if b["device_name"] == name]
    stamp = max(rows, key=lambda r: r["timestamp"] or "") if rows else env.machine(device)
    lines = [f"# Lab results — {name}", "",
             f"Generated from results/{env.slug(name)}/results.csv, checks.csv and build_times.csv (newest row per "
             f"key). "
             f"torch {stamp.get('torch')}, CUDA {stamp.get('cuda')}, newest commit {stamp.get('commit')}.", ""]
    ceil = ceilings_cached(name, stamp.get("torch", "")) or {}
    if ceil:
        blas = "cuBLAS via torch.mm" if device == "cuda" else "torch.mm on the CPU"
        lines += ["## Ceilings (measured on this device)", "",
                  f"- {'device-to-device' if device == 'cuda' else 'memory-to-memory'} copy: "
                  f"{ceil['copy_gbps']:.0f} GB/s (bytes read + written)"]
        at = ceil.get("gemm_size")   # per precision (the best of the sizes tried), or one size (older entries)
        lines += [f"- {k} matrix product ({at.get(k) if isinstance(at, dict) else at}³, {blas}): {v:.3g} TFLOP/s"
                  for k, v in ceil["gemm_tflops"].items()]
        if ceil.get("fma_tflops"):
            lines.append(f"- FP32 FMA (register-only kernel): {ceil['fma_tflops']:.1f} TFLOP/s")
        lines.append("")
    if bt:
        # a whole-lab row ("(all)") is keyed by the families it built too: a `lab buildtime gru` run's cold build is
        # gru's alone, not the newest cold build of every family
        newest_bt: dict[tuple, dict] = {}
        for b in bt:
            newest_bt[(b["family"], b["event"], b.get("target", "") if b["family"] == "(all)" else "")] = b
        lines += ["## Build loop", "", "| family | event | seconds |", "|---|---|---|"]
        lines += [f"| {b['family'] + (': ' + b['target'] if b['family'] == '(all)' and b.get('target') else '')} | "
                  f"{b['event']} | {b['seconds']:.2f} |" for b in newest_bt.values()] + [""]
    if checks:
        passed = sum(c["passed"] == "True" for c in checks)
        lines += ["## Checks", "", f"{passed}/{len(checks)} (version, dtype, shape, device) checks passed "
                  "against float64 references.", ""]
        fams: dict[str, list] = {}
        for c in checks:
            fams.setdefault(c["family"], []).append(c)
        lines += ["| family | device | checks | passed | worst rel. error / tolerance |", "|---|---|---|---|---|"]
        for f, cs in sorted(fams.items()):
            for d in sorted({c["device"] for c in cs}):
                sel = [c for c in cs if c["device"] == d]
                worst = max(sel, key=lambda c: (c["rel_err"] or 0) / (c["tol"] or 1))
                lines.append(f"| {f} | {d} | {len(sel)} | {sum(c['passed'] == 'True' for c in sel)} | "
                             f"{worst['rel_err']:.1e} / {worst['tol']:.0e} ({worst['op']} {worst['version']} "
                             f"{worst['dtype']}) |")
        bad = [c for c in checks if c["passed"] != "True"]
        if bad:
            lines += ["", "Failures:", "```"] + [f"{c['family']}.{c['op']} {c['version']} {c['dtype']} {c['shape']} "
                                                 f"{c['device']}: {c['problem']}" for c in bad] + ["```"]
        lines.append("")
    if rows and device == "cuda":
        lines += ["In the tables below, a row's `median us` is the median over repetitions of the larger of the GPU's "
                  "time (CUDA events) and the host's time to issue the call; `GPU us` is the median of the GPU's part "
                  "alone. Where `median us` is the larger, the host set the time.", ""]
    for fam in registry.families():
        frows = [r for r in rows if r["family"] == fam.name]
        if not frows:
            continue
        lines += [f"## {fam.name}: {fam.title}", ""]
        order = []
        for r in frows:
            if (r["op"], r["dtype"]) not in order:
                order.append((r["op"], r["dtype"]))
        for op, dt in order:
            sel = [r for r in frows if r["op"] == op and r["dtype"] == dt]
            lines += ["```", bench.summary_table(sel), "```", ""]
    if skipped:
        lines += ["## Skipped in the last run", ""] + [f"- {s}" for s in skipped] + [""]
    path = env.device_dir(name) / "SUMMARY.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines))
    return path


# ---- README's status table, generated from the rows ------------------------------------------------------------
def _is_baseline(r: dict) -> bool:
    try:
        return registry.get(r["family"]).op(r["op"]).version(r["version"]).baseline
    except (KeyError, AttributeError, StopIteration, ValueError):
        return r["version"].startswith("torch") or r["version"] in ("reference", "cublas", "cudnn")


def _sweep_labels(family: str, op: str, device: str) -> dict[str, int]:
    """The shape labels the op benches on this kind of device today, each with its place in the sweep (empty for an
    op the registry no longer has)."""
    try:
        return {registry.shape_label(s): i for i, s in enumerate(registry.get(family).op(op).shapes_for(device))}
    except (KeyError, AttributeError, StopIteration, ValueError, RuntimeError):
        return {}


def _version_names(family: str, op: str) -> set[str]:
    """The op's versions and baselines in the registry today (empty for an op it no longer has)."""
    try:
        return {v.name for v in registry.get(family).op(op).versions}
    except (KeyError, AttributeError, StopIteration, ValueError, RuntimeError):
        return set()


def headlines(rows: list[dict]) -> list[dict]:
    """Per (family, op, dtype, precision of our kernel), at the largest shape of the op's sweep, from the newest run
    that timed every version there (the most of them): our fastest kernel and the fastest baseline of the same
    precision, in each mode (eager, graph) — never a ratio across modes or precisions."""
    rows = [r for r in rows if r["median_us"] and r["mode"] != "wall"]
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["family"], r["op"], r["dtype"]), []).append(r)
    out = []
    for (fam, op, dt), rs in sorted(groups.items()):
        # The line's shape: the largest of the op's current sweep (registry) that has rows, so that a rerun of a
        # smaller shape (`lab compare --rerun`, an A/B) does not stand in for it and a shape no longer benched keeps
        # no old row up
        sweep = _sweep_labels(fam, op, rs[0].get("device") or "cuda")
        rs = ([r for r in rs if r["shape"] in sweep] or rs) if sweep else rs
        by_shape: dict[str, list[dict]] = {}
        for r in rs:
            by_shape.setdefault(r["shape"], []).append(r)
        # (equal sizes, e.g. kron's factorizations at one batch: the later in the sweep)
        shape = max(by_shape, key=lambda s: (max(r["size"] or 0 for r in by_shape[s]), sweep.get(s, -1), s))
        # per precision of our kernels there (strict fp32 and TF32 rungs are often timed in different runs): the run
        # whose rows of that precision cover the most of the op's current versions (a partial rerun covers a few),
        # the newest of those: one run's rows per line, never a mix of runs
        names = _version_names(fam, op)
        run_of = lambda r: r.get("run_id") or r["commit"]   # noqa: E731
        for prec in sorted({r["precision"] for r in by_shape[shape] if not _is_baseline(r)}):
            of_prec = [r for r in by_shape[shape] if r["precision"] == prec]
            cover: dict[str, tuple[int, str]] = {}
            for run in {run_of(r) for r in of_prec if not _is_baseline(r)}:
                mine = [r for r in of_prec if run_of(r) == run]
                cover[run] = (len({r["version"] for r in mine if not names or r["version"] in names}),
                              max(r["timestamp"] or "" for r in mine))
            best = max(cover, key=lambda run: cover[run])
            sel = results.latest([r for r in of_prec if run_of(r) == best])
            line = {"family": fam, "op": op, "dtype": dt, "precision": prec, "shape": shape, "modes": {}}
            for mode in ("events", "graph", "cpu"):
                ours = [r for r in sel if not _is_baseline(r) and r["precision"] == prec and r["mode"] == mode]
                base = [r for r in sel if _is_baseline(r) and r["precision"] == prec and r["mode"] == mode]
                if ours:
                    o = min(ours, key=lambda r: r["median_us"])
                    b = min(base, key=lambda r: r["median_us"]) if base else None
                    line["modes"][mode] = (o, b)
            if line["modes"]:
                out.append(line)
    return out


def readme_status(device_dir) -> str:
    """Markdown: the headline table of one device's results (what README's status section shows)."""
    rows = results.read(device_dir / results.TABLE)
    if not rows:
        return ""
    ceil = {}
    if (device_dir / "ceilings.json").exists():
        ceil = json.loads((device_dir / "ceilings.json").read_text())
    cl = [f"torch {k.split('| torch ')[-1]}: copy {c['copy_gbps']:.0f} GB/s; cuBLAS "
          + ", ".join(f"{p} {v:.1f}" for p, v in sorted(c.get("gemm_tflops", {}).items())) + " TFLOP/s"
          + (f"; FP32 FMA probe {c['fma_tflops']:.1f} TFLOP/s" if c.get("fma_tflops") else "")
          + f" (commit {c.get('stamp', {}).get('commit', '?')})" for k, c in sorted(ceil.items())]
    heads = headlines(rows)
    shown = sorted({r["commit"] for h in heads for pair in h["modes"].values() for r in pair if r and r["commit"]})
    lines = [f"**{rows[0]['device_name']}** — generated from `results/{device_dir.name}/results.csv` by "
             f"`python -m lab summary --readme` (newest row per case; the rows shown are of commit"
             f"{'s' if len(shown) > 1 else ''} {', '.join(shown)}). Per op and dtype, at the largest "
             "shape timed: our fastest kernel against the fastest baseline of the same precision, in the same mode "
             "(eager: CUDA events per call; graph: replayed from a CUDA graph).", ""]
    if cl:
        lines += ["Ceilings measured on it: " + "; ".join(cl) + ".", ""]
    lines += ["| op | dtype (precision) | shape | eager: ours · baseline · × | graph: ours · baseline · × | "
              "% of ceiling (ours) |", "|---|---|---|---|---|---|"]

    def cell(pair):
        if not pair:
            return "–"
        o, b = pair
        s = f"{o['version']} {o['median_us']:.4g} µs"
        if b:
            s += f" · {b['version']} {b['median_us']:.4g} µs · {b['median_us'] / o['median_us']:.2f}×"
        return s

    notes: set[str] = set()
    for h in heads:
        m = h["modes"]
        eager = m.get("events") or m.get("cpu")
        best = min((p[0] for p in m.values()), key=lambda r: r["median_us"])
        pct = best.get("pct_peak") or best.get("pct_copy_bw")
        what = "peak" if best.get("pct_peak") else "copy"
        prec = h["dtype"] + (f" ({h['precision']})" if h["precision"] != h["dtype"] else "")
        over = pct and pct > 100
        notes |= {what} if over else set()
        lines.append(f"| {h['family']}.{h['op']} | {prec} | {h['shape']} | {cell(eager)} | {cell(m.get('graph'))} | "
                     + (f"{pct:.1f}% of {what}" + (" †" if over else "") if pct else "–") + " |")
    if "copy" in notes:
        lines += ["", "† above the copy rate: the op's byte formula counts every byte it touches as a DRAM transfer, "
                      "and some come from L2 (an embedding lookup of Zipf-distributed tokens reads its hot rows from "
                      "L2; a kernel cannot beat the copy rate over the bytes it really moves)."]
    if "peak" in notes:
        lines += ["", "† above the measured GEMM ceiling (cuBLAS's best of two square sizes): within the run-to-run "
                      "spread of the GPU's clocks, or a shape the ceiling's sizes do not favour."]
    return "\n".join(lines) + "\n"


def write_readme_status(path=None) -> "pathlib.Path":
    """README's status table (between the status markers), one per device folder with rows."""
    path = path or env.ROOT / "README.md"
    text = path.read_text()
    a, b = "<!-- status:begin -->", "<!-- status:end -->"
    if a not in text or b not in text:
        raise ValueError(f"{path} has no {a} ... {b} markers")
    body = "\n".join(readme_status(d) for d in env.device_dirs() if (d / results.TABLE).exists())
    i, j = text.index(a) + len(a), text.index(b)
    path.write_text(text[:i] + "\n" + body + text[j:])
    return path
