"""python -m lab {list,build,check,bench,profile,plot,report} — the lab from the command line.

  list                     families, ops, versions, and what runs on this machine
  build [FAMILY ...]       compile (CUDA too when a GPU or TORCH_CUDA_ARCH_LIST is present)
  check [FAMILY ...]       verify every version against the float64 PyTorch reference
  bench [FAMILY ...]       time versions and baselines; append to results/<device>/results.csv
  profile FAMILY           torch.profiler tables and Chrome traces of each version of each op; its kernels (each
                           once, by category) into results/<device>/profiles.csv and a figure drawn from them;
                           --ncu: each version's kernels under Nsight Compute into results/<device>/ncu.csv
  plot                     redraw results/<device>/plots/ of this machine's devices (--device NAME, --all), and
                           results/index.html: every device's results on one self-contained page
  report [FAMILY ...]      the main job: build, check, bench, profile, plot every family the machine can run
  summary [--readme]       this machine's results/<device>/SUMMARY.md (--readme: README's status table)
  compare [--new C]        did anything get slower? a commit's rows against the earlier rows of the same measurement
  watch FAMILY             on every save: rebuild what changed, check and time the versions it touches
  buildtime [FAMILY ...]   the edit-and-rerun benchmark: cold/warm builds and one-line edits, into
                           results/<device>/build_times.csv (a scratch copy of the sources, an empty cache);
                           --phases: each target's compile alone, phase by phase (nvcc --time, g++ -ftime-report)

Everything a run records goes to results/<device>/ (the GPU's name, or the CPU's model, as a folder name): a run on
one machine never rewrites another machine's rows, plots, ceilings or summary.

check and bench take --isolate: each version runs in a worker process with a --timeout, so a kernel that faults
or hangs is reported as that version's result instead of ending the run.
"""
from __future__ import annotations

import argparse
import sys
import time

import torch

from . import bench, build, buildtime, compare, env, page, plot, profile, registry, report, results, steps, watcher
from .verify import dtype_name

DTYPES = {"f": torch.float32, "float32": torch.float32, "d": torch.float64, "float64": torch.float64,
          "h": torch.float16, "float16": torch.float16, "bf16": torch.bfloat16, "bfloat16": torch.bfloat16}


def _families(names: list[str]) -> list[registry.Family]:
    return [registry.get(n) for n in names] if names else registry.families()


def _devices(args) -> list[torch.device]:
    if args.device == "all":
        return [torch.device("cpu")] + ([torch.device("cuda")] if env.has_gpu() else [])
    if args.device == "cuda" and not env.has_gpu():
        sys.exit("no GPU is visible (torch.cuda.is_available() is False); use --device cpu")
    return [torch.device(args.device or env.default_device())]


def _dtypes(args):
    if not args.dtype:
        return None
    try:
        return [DTYPES[d] for d in args.dtype.split(",")]
    except KeyError as e:
        sys.exit(f"unknown dtype {e.args[0]!r}; choose from {', '.join(DTYPES)}")


def _shapes(args, op):
    """--size n=1000,M=64 ... (repeatable) overrides the op's shapes (integers, or strings such as kron's
    factors=8x16x32); unknown keys are an error."""
    if not args.size:
        return None
    keys = set(op.check_shapes[0]) if op.check_shapes else set()
    ints = {k for k, v in (op.check_shapes[0] if op.check_shapes else {}).items()
            if isinstance(v, int) and not isinstance(v, bool)}
    out = []
    for spec in args.size:
        d = {}
        for kv in spec.split(","):
            k, _, v = kv.partition("=")
            if k not in keys:
                sys.exit(f"--size: {op.family}.{op.name} has shape keys {sorted(keys)}, got {k!r}")
            if k in ints and not v.strip().isdigit():
                sys.exit(f"--size: {op.family}.{op.name}'s {k} is a count: a non-negative integer, got {v!r}")
            d[k] = int(v) if k in ints else v   # kron's factors=8x16x32 stays a string
        out.append({**op.bench_shapes[0], **d} if op.bench_shapes else d)
    return out


def _ops(fam, args):
    return [fam.op(args.op)] if args.op else fam.ops


def _check_version_names(args) -> None:
    """A --version that no op in scope has is a typo, not an empty run: refuse it, listing the versions there are (a
    version some ops lack is fine: those ops run the others)."""
    names = getattr(args, "version", None)
    if not names:
        return
    fams = [registry.get(args.family)] if getattr(args, "family", None) else _families(args.families)
    known = list(dict.fromkeys(v.name for f in fams for op in _ops(f, args) for v in op.versions))
    unknown = [n for n in names if n not in known]
    if unknown:
        scope = ", ".join(f.name for f in fams) + (f" --op {args.op}" if getattr(args, "op", None) else "")
        sys.exit(f"--version: {', '.join(map(repr, unknown))} is not a version of {scope}; its versions: "
                 f"{', '.join(known)}")


def cmd_list(args) -> int:
    gpu = env.has_gpu()
    print(f"machine: {env.device_name(env.default_device())}, torch {torch.__version__}, "
          f"CUDA {torch.version.cuda or 'none'}, GPU {'yes' if gpu else 'no'}\n")
    for fam in _families(args.families):
        print(f"{fam.name}: {fam.title}")
        for op in fam.ops:
            vs = []
            for v in op.versions:
                runnable = v.device in ("any", "cpu") or gpu
                vs.append(v.name + ("" if runnable else "*"))
            print(f"  {op.name:<16} {' '.join(vs)}")
        for name in fam.extras:
            print(f"  extra: {name}")
    if not gpu:
        print("\n* needs a GPU: skipped on this machine")
    return 0


def cmd_build(args) -> int:
    flavor = "cuda" if (env.has_gpu() or args.cuda) else "cpu"
    names = args.families or build.families_on_disk()
    t0 = time.perf_counter()
    res = build.build_all(names, flavor)
    bad = {f: r for f, r in res.items() if isinstance(r, build.BuildError)}
    for f, e in bad.items():
        print(f"\n{e}\n", file=sys.stderr)
    print(f"[lab] {len(names) - len(bad)}/{len(names)} families built ({flavor}) in {time.perf_counter() - t0:.1f} s")
    if flavor == "cpu":
        skipped = [build._rel(p) for f in names for p in build.skipped_cuda_sources(f, "cpu")]
        if skipped:
            print(f"[lab] not compiled (no GPU visible): {len(skipped)} CUDA source(s): {', '.join(skipped)}\n"
                  "      compile them without a GPU with: TORCH_CUDA_ARCH_LIST=9.0 python -m lab build --cuda "
                  + " ".join(args.families))
    return 1 if bad else 0


def cmd_check(args) -> int:
    failed = total = 0
    for dev in _devices(args):
        for fam in _families(args.families):
            print(f"[lab] check {fam.name} on {dev.type}", flush=True)
            for op in _ops(fam, args):
                rs = steps.check(op, dev, _dtypes(args), args.version, _shapes(args, op), seeds=range(args.seeds),
                                 isolated=args.isolate, timeout=args.timeout, lean=args.lean, progress=args.verbose)
                if args.isolate and not args.verbose:
                    for r in rs:
                        if not r.passed:
                            print("  " + r.line(), flush=True)
                total += len(rs)
                failed += sum(not r.passed for r in rs)
                if not args.verbose:
                    ok = sum(r.passed for r in rs)
                    worst = max(rs, key=lambda r: r.rel_err / r.tol, default=None)
                    w = f"; worst {worst.version} {worst.dtype} {worst.shape}: rel {worst.rel_err:.1e} " \
                        f"(tol {worst.tol:.0e})" if worst else ""
                    print(f"  {op.name:<16} {ok}/{len(rs)} passed{w}", flush=True)
    print(f"[lab] check: {total - failed}/{total} passed")
    return 1 if failed else 0


def cmd_bench(args) -> int:
    dev = _devices(args)[0]
    broken = []
    for fam in _families(args.families):
        if fam.needs_gpu and dev.type != "cuda":
            print(f"[lab] skip {fam.name}: its benchmarks need a GPU")
            continue
        for op in ([] if args.extra and not args.op else _ops(fam, args)):   # --extra alone: only those
            rows = steps.benchmark(op, dev, _dtypes(args), args.version, _shapes(args, op), record=not args.dry,
                               validate=not args.no_check, isolated=args.isolate, timeout=args.timeout)
            if rows:
                for dt in sorted({r["dtype"] for r in rows}):
                    sel = [r for r in rows if r["dtype"] == dt]
                    print(bench.compare_table(sel))
                    print(bench.summary_table(sel) + "\n")
            elif not (args.extra and not args.op):
                named = f" of {', '.join(args.version)}" if args.version else ""
                print(f"[lab] {fam.name}.{op.name}: no version{named} runs on {dev.type}"
                      + (" (the CUDA versions need a GPU)" if dev.type != "cuda" else "") + ": nothing timed")
        if not args.op:
            rows, failed = steps.extras(fam, dev, record=not args.dry, only=args.extra)
            broken += failed
            if rows:
                print(bench.summary_table(rows) + "\n")
    return 1 if broken else 0


def cmd_profile(args) -> int:
    dev = _devices(args)[0]
    if args.ncu_child:   # the process lab.profile.ncu runs under ncu: one version, one dtype, one shape
        fam = registry.get(args.families[0])
        op = fam.op(args.op)
        steps.ncu_target(op, dev, (_dtypes(args) or op.dtypes)[0], args.version[0],
                         (_shapes(args, op) or [steps.profile_shape(op, dev)])[0])
        return 0
    if args.ncu:
        why = profile.ncu_unavailable()
        if why:
            print(f"[lab] profile --ncu: {why}")
            return 0
    failed = []
    for fam in _families(args.families):
        for op in _ops(fam, args):
            shapes = _shapes(args, op)
            shape = shapes[len(shapes) // 2] if shapes else None
            versions = args.version
            if args.ours:
                if args.version:
                    raise SystemExit("lab profile: --ours and --version both name the versions; give one of them")
                versions = steps.ours_and_baseline(op)
            if args.ncu:
                rows, bad = steps.ncu_op(fam, op, dev, _dtypes(args), versions, shape)
                failed += bad
                if rows:
                    print(profile.ncu_table(rows))
                continue
            for title, table, trace in steps.profile_op(fam, op, dev, _dtypes(args), versions, shape):
                print(f"== {title}\n{table}")
                print(f"   trace: {trace}")
            for dt in _dtypes(args) or op.dtypes[:1]:
                fig = plot.plot_profile(fam.name, op.name, env.device_name(dev), dtype_name(dt),
                                        registry.shape_label(shape or steps.profile_shape(op, dev)))
                if fig:
                    print(f"[lab] wrote {fig.relative_to(env.ROOT) if fig.is_relative_to(env.ROOT) else fig}")
    if args.ncu:
        print(f"[lab] ncu rows in {results.table_path(env.device_name(dev), profile.NCU)}")
    return 1 if failed else 0


def cmd_plot(args) -> int:
    have = sorted({r["device_name"] for r in results.read()})
    if args.device and args.device not in have:
        raise SystemExit(f"no rows for device {args.device!r}; devices with rows: {have}")
    paths = plot.plot_all(args.device, devices=have if args.all else None, progress=True)
    index = page.write()
    if index:
        print(f"[lab] wrote {index} (every device's results, one page)")
    for p in paths:
        print(p.relative_to(env.ROOT) if p.is_relative_to(env.ROOT) else p)
    print(f"[lab] {len(paths)} figures")
    return 0


def cmd_watch(args) -> int:
    watcher.watch(args.family, op=args.op, versions=args.version, device=args.device, isolate=not args.no_isolate,
                timeout=args.timeout)
    return 0


def cmd_buildtime(args) -> int:
    if args.readme:
        print(f"[lab] wrote {buildtime.write_readme()}")
        for dev in ([args.device] if args.device else plot.this_machine()):
            fig = buildtime.plot(device_name=dev)   # this machine's figure (--device NAME: that device's)
            if fig:
                print(f"[lab] wrote {fig}")
        return 0
    flavor = "cuda" if (env.has_gpu() or args.cuda) else "cpu"
    if args.phases:
        buildtime.phases(args.families or None, flavor=flavor, record=not args.dry)
        return 0
    rows = buildtime.run(args.families or None, flavor=flavor, record=not args.dry)
    print(buildtime.table(rows))
    if rows and not args.dry:
        print(f"[lab] wrote {buildtime.plot(device_name=rows[0]['device_name'])}")
    return 0


def cmd_summary(args) -> int:
    if args.readme:
        print(f"[lab] wrote {report.write_readme_status()}")
        return 0
    print(f"[lab] wrote {report.write_summary()}")
    return 0


def cmd_report(args) -> int:
    """The main job. Builds everything first (in parallel), then per family: check, bench, plot."""
    return report.run(args)


class _OneOp(argparse.Action):
    """--op takes one op: a second --op is an error, not a silent replacement of the first (a run meant for two ops
    would check or time only the last one)."""

    def __call__(self, parser, namespace, value, option_string=None):
        if getattr(namespace, self.dest, None) is not None:
            parser.error(f"--op given twice ({getattr(namespace, self.dest)}, {value}): one op per run, or leave "
                         "--op out for all of the family's ops")
        setattr(namespace, self.dest, value)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m lab", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)

    def isolate_args(sp, timeout):
        sp.add_argument("--isolate", action="store_true", help="run each version in a worker process: a crash or "
                        "hang is that version's result, not the end of the run")
        sp.add_argument("--timeout", type=float, default=timeout, help=f"seconds per version with --isolate "
                        f"(default {timeout})")

    def common(sp, device_default=None):
        sp.add_argument("families", nargs="*", help="family names (default: all)")
        sp.add_argument("--op", action=_OneOp, help="one op of the family (default: all)")
        sp.add_argument("--version", action="append", help="only these versions (repeatable)")
        sp.add_argument("--dtype", help="comma-separated: f,d,h,bf16 or float32,...")
        sp.add_argument("--size", action="append", help="shape override, e.g. n=1000 or M=64,N=64,K=64")
        sp.add_argument("--device", choices=["cpu", "cuda", "all"], default=device_default)

    sp = sub.add_parser("list", help="families, ops, versions")
    sp.add_argument("families", nargs="*")
    sp = sub.add_parser("build", help="compile families")
    sp.add_argument("families", nargs="*")
    sp.add_argument("--cuda", action="store_true", help="build CUDA sources without a GPU (needs TORCH_CUDA_ARCH_LIST)")
    sp = sub.add_parser("check", help="verify against the references")
    common(sp, "all")
    sp.add_argument("--seeds", type=int, default=3)
    sp.add_argument("--lean", action="store_true", help="float64 references on the CPU, no baseline run or "
                    "checked (unless named by --version): only our versions' kernels launch on the GPU "
                    "(for compute-sanitizer)")
    sp.add_argument("-v", "--verbose", action="store_true")
    isolate_args(sp, 60)
    sp = sub.add_parser("bench", help="time versions and baselines")
    common(sp)
    isolate_args(sp, 300)
    sp.add_argument("--extra", action="append", help="only these extra benchmarks (without --op: no op sweeps)")
    sp.add_argument("--dry", action="store_true", help="do not append to results/<device>/results.csv")
    sp.add_argument("--no-check", action="store_true",
                    help="time without checking each version first (by default a version wrong on the check "
                         "shapes is reported and not timed)")
    sp = sub.add_parser("profile", help="profiler tables, traces, kernel tables and figures; --ncu: Nsight Compute")
    common(sp)
    sp.add_argument("--ncu", action="store_true", help="instead: each version's kernels under Nsight Compute (one "
                    "call, one shape) into results/<device>/ncu.csv; says so and exits 0 where ncu or a GPU is missing")
    sp.add_argument("--ours", action="store_true", help="only our versions (vN) and the op's baseline (the one its "
                    "ratios are against), not every baseline (optim's for-loop Adam launches a few kernels per tensor, "
                    "each replayed under ncu)")
    sp.add_argument("--ncu-child", action="store_true", help=argparse.SUPPRESS)   # what --ncu runs under ncu
    sp = sub.add_parser("plot", help="redraw this machine's figures from results/<device>/results.csv")
    sp.add_argument("--device", help="the rows of this device name instead (e.g. 'NVIDIA H100 80GB HBM3')")
    sp.add_argument("--all", action="store_true", help="every device that has rows (rewrites their figures)")
    sp = sub.add_parser("summary", help="write this machine's results/<device>/SUMMARY.md from its rows")
    sp.add_argument("--readme", action="store_true", help="instead: README's status table, from every device's rows")
    sp = sub.add_parser("compare", help="a commit's rows against the earlier rows of the same measurements: what got "
                                        "slower, and why where the rows say (exit 1 if a version of ours got slower "
                                        "and nothing explains it)")
    sp.add_argument("--new", help="the commit whose rows are compared (default: the newest rows' commit)")
    sp.add_argument("--base", help="compare only with this commit's rows (default: each row's newest earlier one)")
    sp.add_argument("--tolerance", type=float, default=0.05, help="slower = median above base by more than this "
                    "fraction, with the p20-p80 bands apart (default 0.05)")
    sp.add_argument("--top", type=int, default=20, help="lines to print")
    sp.add_argument("--rerun", action="store_true", help="also print the `lab bench` commands that time the "
                    "unexplained rows again (run them alone on the base's kind of machine, then compare again)")
    sp = sub.add_parser("report", help="build, check, bench, profile and plot everything this machine can run")
    sp.add_argument("families", nargs="*")
    sp.add_argument("--quick", action="store_true", help="fewer shapes (smoke run)")
    sp.add_argument("--no-bench", action="store_true")
    sp.add_argument("--no-plot", action="store_true", help="record rows, draw no figures (`lab plot` draws them later, "
                    "e.g. after merging a lent GPU's rows)")
    sp = sub.add_parser("watch", help="rebuild, check and time on every save (Ctrl-C stops)")
    sp.add_argument("family")
    sp.add_argument("--op", action=_OneOp, help="one op of the family (default: all)")
    sp.add_argument("--version", action="append", help="only these versions (repeatable)")
    sp.add_argument("--device", choices=["cpu", "cuda"], default=None)
    sp.add_argument("--no-isolate", action="store_true", help="check and time in this process (no worker)")
    sp.add_argument("--timeout", type=float, default=60.0, help="seconds per version (default 60)")
    sp = sub.add_parser("buildtime", help="measure the edit-and-rerun loop into results/<device>/build_times.csv")
    sp.add_argument("families", nargs="*")
    sp.add_argument("--cuda", action="store_true", help="the CUDA flavor without a GPU (needs TORCH_CUDA_ARCH_LIST)")
    sp.add_argument("--dry", action="store_true", help="do not append to results/<device>/build_times.csv")
    sp.add_argument("--readme", action="store_true",
                    help="only regenerate README's build-time table (and this machine's build_times.png) from the CSVs")
    sp.add_argument("--device", help="with --readme: redraw the figure of this device name")
    sp.add_argument("--phases", action="store_true",
                    help="instead: each target's compile re-run alone with the compiler's phase timers "
                         "(nvcc --time, g++ -ftime-report), into results/<device>/build_phases.csv")
    args = p.parse_args(argv)
    handler = {"list": cmd_list, "build": cmd_build, "check": cmd_check, "bench": cmd_bench,
               "profile": cmd_profile, "plot": cmd_plot, "report": cmd_report, "watch": cmd_watch,
               "summary": cmd_summary, "compare": compare.main,
               "buildtime": cmd_buildtime}[args.cmd]
    try:
        if args.cmd in ("check", "bench", "profile", "watch"):
            _check_version_names(args)
        return handler(args)
    except build.BuildError as e:
        print(f"\n{e}", file=sys.stderr)
        return 2
    except KeyError as e:
        print(f"error: {e.args[0]}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
