"""How fast is it? Timing that a kernel engineer would trust, and the ceilings to read the numbers against.

GPU: CUDA events around each repetition, after warm-up; the L2 is flushed before each repetition (a write of twice
its size, outside the timed region) so every run reads its inputs from HBM; the median and the 20th/80th percentiles
of many repetitions. Optionally the function is captured once in a CUDA graph and the replays are timed: for
launch-bound code that removes the CPU launch overhead the eager numbers include.
CPU: `torch.utils.benchmark` (blocked_autorange), which handles threads and warm-up.

Ceilings (`ceilings()`): device-to-device copy bandwidth (bytes read + bytes written), cuBLAS matrix-product rate
per precision, and the FP32 FMA rate of a register-only kernel; measured once per GPU and torch version and cached in
`results/<device>/ceilings.json`. Every benchmark row carries its fraction of them.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.utils.benchmark as tbench

from . import build, env, results
from .registry import Op, Version, shape_label
from .verify import dtype_name


@dataclass
class Timing:
    times_us: list[float] = field(repr=False)
    mode: str                        # "events", "graph" or "cpu"

    def pct(self, q: float) -> float:
        s = sorted(self.times_us)
        i = (len(s) - 1) * q
        lo, hi = math.floor(i), math.ceil(i)
        return s[lo] + (s[hi] - s[lo]) * (i - lo)

    @property
    def median_us(self) -> float:
        return self.pct(0.5)

    @property
    def p20_us(self) -> float:
        return self.pct(0.2)

    @property
    def p80_us(self) -> float:
        return self.pct(0.8)

    @property
    def reps(self) -> int:
        return len(self.times_us)

    def __str__(self) -> str:
        return f"{self.median_us:.2f} us (p20 {self.p20_us:.2f}, p80 {self.p80_us:.2f}, n={self.reps}, {self.mode})"


_flush_buf: dict[int, torch.Tensor] = {}
_SLEEP_CYCLES = 20_000  # ~10 us at the H100's 1.98 GHz boost clock


FLUSH_MODES = ("write", "read")


def flush_l2(device: torch.device | None = None, mode: str | None = None) -> None:
    """Evict the L2 through a buffer twice its size (H100: 50 MB L2 -> 100 MB, ~40 us, untimed).

    mode 'write' (the default; $LAB_FLUSH overrides) fills the buffer, which leaves the L2 full of dirty lines: a
    timed kernel whose misses evict them pays their write-back to HBM. mode 'read' sums the buffer instead, so the
    dirty lines are written back during the flush and the timed kernel finds only clean ones."""
    mode = mode or os.environ.get("LAB_FLUSH", "write")
    if mode not in FLUSH_MODES:
        raise ValueError(f"L2 flush mode must be one of {FLUSH_MODES}, got {mode!r}")
    device = torch.device(device or "cuda")
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _flush_buf:
        l2 = getattr(torch.cuda.get_device_properties(idx), "L2_cache_size", 64 << 20) or (64 << 20)
        _flush_buf[idx] = torch.ones(2 * l2 // 4, dtype=torch.float32, device=f"cuda:{idx}")
    if mode == "write":
        _flush_buf[idx].fill_(idx + 1)
    else:
        _flush_buf[idx].sum()


def capture_graph(fn: Callable[[], object], warmup: int = 3) -> torch.cuda.CUDAGraph:
    """Capture fn() in a CUDA graph (warm-up runs on a side stream first, as capture requires)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g


def time_cuda(fn: Callable[[], object], *, graph: bool = False, flush: bool = True, warmup: int = 5,
              min_reps: int = 15, max_reps: int = 400, budget_ms: float = 300.0) -> Timing:
    """Median-of-many CUDA-event timing of fn() on the current stream."""
    torch.cuda.synchronize()
    for _ in range(warmup):                      # module load, lazy init, allocator warm-up, autotuning
        fn()
    run = capture_graph(fn).replay if graph else fn
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(3):
        run()
    e.record()
    torch.cuda.synchronize()
    est_ms = max(s.elapsed_time(e) / 3, 1e-3) + (0.05 if flush else 0.0)
    n = int(min(max_reps, max(min_reps, budget_ms / est_ms)))
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    for i in range(n):
        if flush:
            flush_l2()
            # keep the GPU busy ~10 us more, so the host has enqueued start, fn and end before the GPU reaches them:
            # a small kernel's time is then the GPU's, not the Python wrapper's launch latency
            torch.cuda._sleep(_SLEEP_CYCLES)
        starts[i].record()
        run()
        ends[i].record()
    torch.cuda.synchronize()
    return Timing([1000.0 * a.elapsed_time(b) for a, b in zip(starts, ends)], "graph" if graph else "events")


def time_cpu(fn: Callable[[], object], min_run_time: float = 0.2) -> Timing:
    """torch.utils.benchmark's blocked_autorange: per-block means, enough blocks for min_run_time seconds."""
    m = tbench.Timer(stmt="fn()", globals={"fn": fn}, num_threads=torch.get_num_threads()).blocked_autorange(
        min_run_time=min_run_time)
    return Timing([t * 1e6 for t in m.times], "cpu")


def time_fn(fn: Callable[[], object], device: torch.device | str, graph: bool = False, **kw) -> Timing:
    if torch.device(device).type == "cuda":
        return time_cuda(fn, graph=graph, **kw)
    return time_cpu(fn, **{k: v for k, v in kw.items() if k == "min_run_time"})


# --------------------------------------------------------------------------------------------------------------
# Ceilings
# --------------------------------------------------------------------------------------------------------------
def _ceilings_path(device_name: str):
    return env.device_dir(device_name) / "ceilings.json"


def ceilings(device: torch.device | str | None = None, refresh: bool = False, verbose: bool = True) -> dict:
    """Measured ceilings of this device, cached per (device name, torch version) in results/<device>/ceilings.json
    (a CPU's by its model name: a committed entry of another machine never stands in for this one's).

    {"copy_gbps": ..., "gemm_tflops": {"float32": ..., "tf32": ..., "bfloat16": ..., "float16": ...},
     "fma_tflops": ... (GPU only), "stamp": {...}}
    """
    device = torch.device(device or env.default_device())
    key = f"{env.device_name(device)} | torch {torch.__version__}"
    path = _ceilings_path(env.device_name(device))
    data = json.loads(path.read_text()) if path.exists() else {}
    wanted = {"float64", "float32", "tf32", "bfloat16", "float16"} if device.type == "cuda" else {"float64", "float32"}
    if key in data and not refresh and wanted <= set(data[key].get("gemm_tflops", {})):
        return data[key]  # (an entry missing a precision measured since is measured again)
    if verbose:
        print(f"[lab] measuring ceilings of {env.device_name(device)} (once; cached in {path.name}) ...", flush=True)
    c = _measure_ceilings(device)
    c["stamp"] = results.stamp(device)
    data = json.loads(path.read_text()) if path.exists() else {}
    data[key] = c
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)
    return c


def ceilings_cached(device_name: str, torch_version: str) -> dict | None:
    """Ceilings recorded for a device and torch version, without measuring (None if never measured)."""
    path = _ceilings_path(device_name)
    data = json.loads(path.read_text()) if path.exists() else {}
    return data.get(f"{device_name} | torch {torch_version}")


def _measure_ceilings(device: torch.device) -> dict:
    gen = torch.Generator(device=device).manual_seed(0)
    cuda = device.type == "cuda"
    # copy: 1 GiB (GPU) / 256 MiB (CPU) of random floats, far past any cache; bytes = read + write
    n = (256 << 20) if cuda else (64 << 20)
    src = torch.randn(n, device=device, generator=gen)
    dst = torch.empty_like(src)
    t = time_fn(lambda: dst.copy_(src), device)
    out = {"copy_gbps": 2 * src.numel() * 4 / (t.median_us * 1e-6) / 1e9}
    del src, dst
    gemm = {}
    size = 8192 if cuda else 1024
    precisions = ["float64", "float32", "tf32", "bfloat16", "float16"] if cuda else ["float64", "float32"]
    for p in precisions:
        dt = torch.float32 if p in ("float32", "tf32") else getattr(torch, p)
        a = torch.randn(size, size, device=device, generator=gen).to(dt)
        b = torch.randn(size, size, device=device, generator=gen).to(dt)
        old = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = p == "tf32"
        try:
            t = time_fn(lambda: torch.mm(a, b), device, flush=False) if cuda else time_fn(lambda: torch.mm(a, b),
                                                                                          device)
        finally:
            torch.backends.cuda.matmul.allow_tf32 = old
        gemm[p] = 2 * size ** 3 / (t.median_us * 1e-6) / 1e12
    out["gemm_tflops"] = gemm
    out["gemm_size"] = size
    if cuda:
        out["fma_tflops"] = fma_peak_tflops(device)
    return out


def fma_peak_tflops(device="cuda", iters: int = 4096) -> float:
    """Measured FP32 FMA rate (TFLOP/s) of a register-only kernel (cuda_src/harness/fma_peak.cu): the ceiling for
    FMA-bound code. 8 blocks of 256 threads per SM, 8 independent chains per thread."""
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    blocks, threads = sms * 8, 256
    out = torch.empty(blocks * threads, device=device)
    ext = build.load("harness", verbose=False)
    t = time_cuda(lambda: ext.fma_peak(out, blocks, threads, iters), flush=False)
    flops = blocks * threads * iters * 16 * 8 * 2
    return flops / (t.median_us * 1e-6) / 1e12


def peak_for(ceil: dict, dtype: torch.dtype, precision: str | None, kind: str | None = "gemm") -> float | None:
    """The compute ceiling a version is held against: cuBLAS at its precision (TF32 versions against the TF32
    rate) for kind 'gemm', the FP32 FMA probe for 'fma' (SIMT kernels; none for float64), none for memory-bound ops."""
    if kind == "fma":  # an FP32 probe: no ceiling for float64 arithmetic (the H100's FP64 FMA rate is not measured)
        return ceil.get("fma_tflops") if dtype != torch.float64 else None
    if kind == "gemm":
        return ceil.get("gemm_tflops", {}).get(precision or dtype_name(dtype))
    return None


# --------------------------------------------------------------------------------------------------------------
# Benchmarking an op
# --------------------------------------------------------------------------------------------------------------
def _timed_call(v: Version, inputs: tuple) -> Callable[[], object]:
    if v.takes_out:
        out = v.fn(*inputs)               # allocate once; the timed calls write into it
        return lambda: v.fn(*inputs, out=out)
    return lambda: v.fn(*inputs)


def precision_of(v: Version, dtype: torch.dtype) -> str:
    """What a version computes in: its declared precision ("tf32") or its dtype's name."""
    return v.precision or dtype_name(dtype)


def reference_baseline(op: Op, device, dtype: torch.dtype, precision: str) -> Version | None:
    """The baseline a `precision` row of `op` is compared with: op.baseline when it computes in that precision, else
    the first baseline version that does (linear's TF32 rungs against `torch.tf32`, not strict-fp32 cuBLAS); None
    when no baseline computes in it (no ratio is better than one against another precision)."""
    cands = [v for v in op.versions_for(device, dtype) if v.baseline and precision_of(v, dtype) == precision]
    named = [v for v in cands if v.name == op.baseline]
    return (named or cands or [None])[0]


def assign_speedups(rows: list[dict]) -> list[dict]:
    """speedup = the reference baseline's median / the row's median, within one (dtype, shape, mode, precision):
    graph rows against the baseline replayed from a graph, eager against eager, TF32 against TF32. A row without
    such a baseline row gets None. Each row's `baseline` names the baseline and the mode ("torch.tf32 (graph)").
    Rows must carry `_ref` (the reference baseline's name for their precision, or None)."""
    base = {(r["dtype"], r["shape"], r["mode"], r["precision"]): r["median_us"] for r in rows
            if r.get("_ref") and r["version"] == r["_ref"]}
    for r in rows:
        ref = r.pop("_ref", None)
        b = base.get((r["dtype"], r["shape"], r["mode"], r["precision"])) if ref else None
        r["baseline"] = f"{ref} ({r['mode']})" if ref else None
        r["speedup"] = b / r["median_us"] if b else None
    return rows


def bench_op(op: Op, device: torch.device | str, dtypes=None, versions=None, shapes=None, graph: bool | None = None,
             record: bool = True, progress: bool = True, note: str = "") -> list[dict]:
    """Time every (version, dtype, shape) of `op` on `device`, with the baselines its ratios need timed beside it in
    the same modes; returns (and records) rows. Speedups: see assign_speedups."""
    device = torch.device(device)
    ceil = ceilings(device)
    rows: list[dict] = []
    shapes = shapes or op.shapes_for(device)
    dtypes = [d for d in (dtypes or op.dtypes) if d in op.dtypes]
    todo = [(d, s, v) for d in dtypes for s in shapes for v in op.versions_for(device, d, versions)]

    def graphed(v: Version) -> bool:
        return device.type == "cuda" and (v.graph if graph is None else graph)

    # Each precision's reference baseline, timed in every mode a version of that precision is timed in.
    refs: dict[tuple, Version | None] = {}
    force_graph: set[tuple] = set()   # (dtype, ref name): the baseline also replayed from a graph
    for d, _, v in list(todo):
        prec = precision_of(v, d)
        if (d, prec) not in refs:
            refs[(d, prec)] = reference_baseline(op, device, d, prec)
        ref = refs[(d, prec)]
        if ref is None:
            continue
        if not any(x is ref and xd == d for xd, _, x in todo):
            todo += [(d, s, ref) for s in shapes]
        if graphed(v) and not graphed(ref):
            force_graph.add((d, ref.name))
    todo.sort(key=lambda t: (dtypes.index(t[0]), shapes.index(t[1]), not t[2].baseline))
    inputs_cache: dict[tuple, tuple] = {}
    for i, (dtype, shape, v) in enumerate(todo):
        key = (dtype, shape_label(shape))
        if key not in inputs_cache:
            inputs_cache.clear()
            if device.type == "cuda":
                torch.cuda.empty_cache()
            inputs_cache[key] = op.make_inputs(shape, dtype, device, torch.Generator().manual_seed(1234))
        inputs = inputs_cache[key]
        forced = (dtype, v.name) in force_graph
        modes = [False] + ([True] if graphed(v) or forced else [])
        for use_graph in modes:
            try:
                t = time_fn(_timed_call(v, inputs), device, graph=use_graph)
            except Exception as e:  # noqa: BLE001 — a baseline replayed only for the ratios: say so, go on
                if not (use_graph and forced):
                    raise
                print(f"[lab] {op.family}.{op.name} {v.name}: no graph replay ({type(e).__name__}: {e}); graph rows "
                      f"of {dtype_name(dtype)} get no speedup", flush=True)
                continue
            nb = op.nbytes(shape, dtype) if op.nbytes else None
            fl = op.flops(shape, dtype) if op.flops else None
            sec = t.median_us * 1e-6
            gbps = nb / sec / 1e9 if nb else None
            tflops = fl / sec / 1e12 if fl else None
            peak = peak_for(ceil, dtype, v.precision, op.compute_ceiling)
            row = {
                "family": op.family, "op": op.name, "version": v.name, "shape": shape_label(shape),
                "size": shape.get(op.size_key) if op.size_key else None, "dtype": dtype_name(dtype),
                "precision": precision_of(v, dtype), "mode": t.mode,
                "median_us": t.median_us, "p20_us": t.p20_us, "p80_us": t.p80_us, "reps": t.reps,
                "gbps": gbps, "tflops": tflops,
                "pct_copy_bw": 100 * gbps / ceil["copy_gbps"] if gbps else None,
                "pct_peak": 100 * tflops / peak if tflops and peak else None,
                "baseline": None, "speedup": None, "_ref": getattr(refs.get((dtype, precision_of(v, dtype))),
                                                                    "name", None),
                "note": note, **results.stamp(device),
            }
            rows.append(row)
            if progress:
                extra = f"  {gbps:7.1f} GB/s" if gbps else ""
                extra += f"  {tflops:6.2f} TFLOP/s" if tflops else ""
                print(f"[lab] ({i + 1}/{len(todo)}) {op.family}.{op.name} {v.name:<14} {dtype_name(dtype):<8} "
                      f"{shape_label(shape):<24} {t.median_us:10.2f} us ({t.mode}){extra}", flush=True)
    assign_speedups(rows)
    if record and rows:
        results.append(rows)
    return rows


def compare_table(rows: list[dict], title: str = "") -> str:
    """A torch.utils.benchmark.Compare table: shapes as rows, versions (and graph replays) as columns."""
    from torch.utils.benchmark.utils.common import Measurement, TaskSpec
    ms = []
    for r in rows:
        col = r["version"] + (" (graph)" if r["mode"] == "graph" else "")
        spec = TaskSpec(stmt=f"{r['op']}", setup="", label=title or f"{r['family']}.{r['op']} {r['dtype']} "
                        f"on {r['device_name']}", sub_label=r["shape"], description=col,
                        env=r["dtype"], num_threads=1)
        # Compare shows the median of raw times; the row carries the median, so one raw time per row suffices
        ms.append(Measurement(number_per_run=1, raw_times=[r["median_us"] * 1e-6], task_spec=spec))
    cmp = tbench.Compare(ms)
    cmp.trim_significant_figures()
    return str(cmp)


def summary_table(rows: list[dict]) -> str:
    """Plain-text table of the rows with rate columns (what Compare cannot show)."""
    lines = [f"{'op':<14} {'version':<16} {'dtype':<8} {'shape':<26} {'median us':>10} {'GB/s':>8} {'%copy':>6} "
             f"{'TFLOP/s':>8} {'%peak':>6} {'speedup':>8}"]
    for r in rows:
        col = r["version"] + (" (graph)" if r["mode"] == "graph" else "")
        f = lambda x, fmt: (fmt % x) if x is not None else "-"
        lines.append(f"{r['op']:<14} {col:<16} {r['dtype']:<8} {r['shape']:<26} {r['median_us']:>10.2f} "
                     f"{f(r['gbps'], '%8.1f'):>8} {f(r['pct_copy_bw'], '%5.1f'):>6} {f(r['tflops'], '%8.2f'):>8} "
                     f"{f(r['pct_peak'], '%5.1f'):>6} {f(r['speedup'], '%7.2fx'):>8}")
    return "\n".join(lines)
