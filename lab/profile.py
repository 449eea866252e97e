"""Where does the time go? The three ways the course material teaches, each a function, then the recorded tables.

1. CUDA events (`events`): the host clock lies for asynchronous CUDA (it times the launch, not the kernel); events
   are recorded on the stream and measure device time.
2. `torch.autograd.profiler` (`autograd_table`): per-operator CPU and CUDA time, as a key_averages table.
3. `torch.profiler` with a wait/warmup/active schedule (`profile`): skips the first iterations, then records a few;
   writes a key_averages table (sorted by CUDA time) under results/profiles/ and a Chrome trace under
   results/traces/ (open it in chrome://tracing or ui.perfetto.dev; traces are git-ignored, they are large).
4. Recorded kernel tables (`profile_kernels`, `kernel_rows`, `record`): the same profiled run, split by kernel (each
   kernel once: the GPU's own events), each kernel put in a category (`kernel_category`: ours, cublas, cudnn, copy,
   memset, elementwise, other; on a CPU machine the operators' self CPU time, 'cpu-op'), appended to
   results/<device>/profiles.csv. `lab.plot.plot_profile` draws the per-version figure from those rows only.
5. Nsight Compute (`ncu`): a version's kernels on one shape, in a child process under `ncu --csv`, one warm-up call
   and one profiled call between cudaProfilerStart/Stop; per kernel: duration, DRAM and L2 bandwidth, SM and tensor
   pipe throughput, achieved occupancy, registers, shared memory and the top three warp-stall reasons, appended to
   results/<device>/ncu.csv (`parse_ncu_csv` reads ncu's CSV: a pure function, tested on a fixture). Where ncu or a
   GPU is missing, `ncu_unavailable()` says why and nothing runs.
"""
from __future__ import annotations

import csv
import functools
import io
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterable

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, schedule

from . import build, env, registry, results


def host_timer_ms(fn: Callable[[], object], reps: int = 10) -> float:
    """What `time.perf_counter()` around a CUDA call measures: mostly the launch (no synchronize)."""
    fn()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) * 1e3 / reps


def events(fn: Callable[[], object], reps: int = 10, warmup: int = 5) -> list[float]:
    """Per-call device time in ms, from CUDA events around each call, after warm-up."""
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        torch.cuda.synchronize()
        out.append(s.elapsed_time(e))
    return out


def _sort_key(device: str) -> str:
    return "cuda_time_total" if device == "cuda" else "cpu_time_total"


def autograd_table(fn: Callable[[], object], device: str = "cuda", row_limit: int = 12, reps: int = 3) -> str:
    """torch.autograd.profiler: key_averages table sorted by CUDA time (CPU time on a CPU machine)."""
    fn()
    kwargs = {"use_device": "cuda"} if device == "cuda" else {}
    with torch.autograd.profiler.profile(**kwargs) as prof:
        for _ in range(reps):
            fn()
        if device == "cuda":
            torch.cuda.synchronize()
    return prof.key_averages().table(sort_by=_sort_key(device), row_limit=row_limit)


def profile_kernels(fn: Callable[[], object], name: str, device: str = "cuda", wait: int = 1, warmup: int = 1,
                    active: int = 3, row_limit: int = 15, save: bool = True, scope: bool = True
                    ) -> tuple[str, Path | None, list[dict]]:
    """`profile`, plus the profiled calls split by kernel (`kernel_stats`): (table, trace path, stats). On the CPU
    (scope=True) each call runs inside a CALL_SCOPE record_function, so the time it spends outside ATen operators
    (our C++ CPU versions: a binding is no ATen op) is a row of its own rather than the schedule step's self time."""
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    trace_dir = env.results_dir(device) / "traces"
    trace = trace_dir / f"{name}.json"
    captured: dict[str, object] = {}

    def ready(prof):
        captured["table"] = prof.key_averages().table(sort_by=_sort_key(device), row_limit=row_limit)
        captured["stats"] = kernel_stats(prof.events(), device, reps=active)
        if save:
            trace_dir.mkdir(parents=True, exist_ok=True)
            prof.export_chrome_trace(str(trace))

    with torch.profiler.profile(activities=acts, schedule=schedule(wait=wait, warmup=warmup, active=active, repeat=1),
                                on_trace_ready=ready) as p:
        for _ in range(wait + warmup + active):
            if device == "cuda":
                fn()
                torch.cuda.synchronize()
            elif scope:   # its self time: the call's own outside ATen (a binding's C++ loop)
                with torch.profiler.record_function(CALL_SCOPE):
                    fn()
            else:
                fn()
            p.step()
    table = str(captured.get("table", ""))
    if save:
        out = env.results_dir(device) / "profiles"
        out.mkdir(parents=True, exist_ok=True)
        (out / f"{name}.txt").write_text(f"# {name} on {env.device_name(device)}, torch {torch.__version__}, "
                                         f"schedule wait={wait} warmup={warmup} active={active}\n{table}\n")
    return table, (trace if save else None), list(captured.get("stats", []))


def profile(fn: Callable[[], object], name: str, device: str = "cuda", wait: int = 1, warmup: int = 1,
            active: int = 3, row_limit: int = 15, save: bool = True) -> tuple[str, Path | None]:
    """torch.profiler with a schedule; returns (table, trace path) and saves both under results/<device>/."""
    table, trace, _ = profile_kernels(fn, name, device, wait, warmup, active, row_limit, save, scope=False)
    return table, trace


def attribute_device_time(events, reps: int = 1) -> dict[str, float]:
    """Device time per operator, each kernel counted once, in us per call.

    torch.profiler lists a kernel twice: as a device event under its own name, and in the self device time of the
    operator that launched it (the innermost ATen op or record_function scope, linked by correlation id), so summing
    key_averages() double-counts. Here each device event (kernel, memcpy, memset) is counted once: under its operator
    where the profiler linked it to one, else under its own name (a launch from a binding outside any operator)."""
    device_total: dict[str, float] = {}
    for e in events:
        if getattr(e, "device_type", DeviceType.CPU) != DeviceType.CPU:
            device_total[e.name] = device_total.get(e.name, 0.0) + e.time_range.elapsed_us()
    out: dict[str, float] = {}
    linked: dict[str, float] = {}
    for e in events:
        if getattr(e, "device_type", DeviceType.CPU) != DeviceType.CPU or getattr(e, "is_async", False):
            continue
        for k in getattr(e, "kernels", []):
            out[e.name] = out.get(e.name, 0.0) + k.duration
            linked[k.name] = linked.get(k.name, 0.0) + k.duration
    for name, t in device_total.items():
        rest = t - linked.get(name, 0.0)
        if rest > 1e-9:
            out[name] = out.get(name, 0.0) + rest
    return dict(sorted(((k, v / reps) for k, v in out.items() if v > 0), key=lambda kv: -kv[1]))


def _profiled_events(fn: Callable[[], object], device: str, reps: int):
    fn()
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(reps):
            fn()
        if device == "cuda":
            torch.cuda.synchronize()
    return prof


def op_times(fn: Callable[[], object], device: str = "cuda", reps: int = 5) -> dict[str, float]:
    """Time per operator, in us per call: on the GPU the device time of the kernels each operator launched (each
    kernel counted once: attribute_device_time); on the CPU the operators' self CPU time."""
    prof = _profiled_events(fn, device, reps)
    if device == "cuda":
        return attribute_device_time(prof.events(), reps)
    out = {}
    for e in prof.key_averages():
        if e.self_cpu_time_total > 0:
            out[e.key] = e.self_cpu_time_total / reps
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def kernel_times(fn: Callable[[], object], reps: int = 5) -> dict[str, float]:
    """Device time per kernel name (kernels, memcpy, memset: the GPU's own events, each once), us per call."""
    out: dict[str, float] = {}
    for e in _profiled_events(fn, "cuda", reps).events():
        if e.device_type != DeviceType.CPU:
            out[e.name] = out.get(e.name, 0.0) + e.time_range.elapsed_us() / reps
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


# =================================================================================================================
# Recorded kernel tables: results/<device>/profiles.csv
# =================================================================================================================
PROFILES = "profiles.csv"
PROFILE_COLUMNS = ["family", "op", "version", "role", "shape", "dtype", "precision", "device", "device_name", "mode",
                   "kernel", "category", "us_per_call", "calls_per_call", "reps",
                   "torch", "cuda", "commit", "timestamp", "run_id"]
PROFILE_NUMERIC = {"us_per_call", "calls_per_call", "reps"}
CALL_SCOPE = "lab::call"        # (CPU) the scope around each profiled call
OUTSIDE_ATEN = "(outside ATen ops)"   # the scope's self time: Python, a binding's own C++ (our CPU versions)
# drawing order of a bar's segments, and the figure's legend
CATEGORIES = ("ours", "cublas", "cudnn", "elementwise", "copy", "memset", "other", "cpu-op")


def kernel_stats(events: Iterable, device: str, reps: int) -> list[dict]:
    """Per kernel name, per profiled call: {"kernel", "us_per_call", "calls_per_call"}, largest first.

    On the GPU the device events (kernels, memcpy, memset), each once: a kernel's duration is the GPU's own event, not
    the self device time of the operator that launched it too (attribute_device_time says why that double-counts).
    On the CPU (no device events) the operators' self CPU time, and how often each ran; the time of the call outside
    every ATen operator (the CALL_SCOPE's self time: Python, a binding's own loop) is the row OUTSIDE_ATEN."""
    us: dict[str, float] = {}
    n: dict[str, int] = {}
    for e in events:
        if device == "cuda":   # (a record_function scope's span on the GPU timeline is a user annotation: no kernel)
            if getattr(e, "device_type", DeviceType.CPU) == DeviceType.CPU or getattr(e, "is_user_annotation", False):
                continue
            t = e.time_range.elapsed_us()
        else:   # the schedule's own step scope is the loop around the calls, not a part of them
            if e.name.startswith("ProfilerStep") or getattr(e, "device_type", DeviceType.CPU) != DeviceType.CPU:
                continue
            t = e.self_cpu_time_total
        name = OUTSIDE_ATEN if e.name == CALL_SCOPE else e.name
        us[name] = us.get(name, 0.0) + t
        n[name] = n.get(name, 0) + 1
    out = [{"kernel": k, "us_per_call": us[k] / reps, "calls_per_call": n[k] / reps} for k in us]
    return sorted(out, key=lambda r: -r["us_per_call"])


def kernel_identifier(name: str) -> str:
    """The kernel's own name from a demangled one: 'void at::native::vectorized_elementwise_kernel<4, ...>(int, ...)'
    -> 'vectorized_elementwise_kernel' (template arguments, parameters and namespaces dropped)."""
    depth, kept = 0, []
    for ch in name:
        if ch in "<({[":
            depth += 1
        elif ch in ">)}]":
            depth = max(0, depth - 1)
        elif depth == 0:
            kept.append(ch)
    flat = "".join(kept).strip()
    flat = flat.split()[-1] if flat.split() else flat       # 'void foo' -> 'foo'
    return flat.split("::")[-1] or name


def short_kernel_name(name: str, width: int = 30) -> str:
    """A label for a figure: the kernel's identifier (the whole name of a copy or memset), cut to `width`."""
    s = name if name.startswith(("Memcpy", "Memset")) else kernel_identifier(name)
    return s if len(s) <= width else s[: width - 1] + "…"


_KERNEL_DECL = re.compile(r"__global__\s+(?:void\s+)?(?:__launch_bounds__\s*\([^)]*\)\s*)?(?:void\s+)?(\w+)\s*\(")


@functools.lru_cache(maxsize=None)
def our_kernels(root: Path) -> frozenset[str]:
    """The names of the kernels the lab's sources define (every `__global__` under `root`, the sources' cuda_src/): a
    kernel by one of these names, outside PyTorch's namespaces, is ours whatever it is called (gemv_v1 is not
    cuBLAS's gemv)."""
    root = Path(root)
    names: set[str] = set()
    for p in sorted(root.rglob("*")) if root.exists() else []:
        if p.suffix in (".cu", ".cuh", ".h"):
            names |= set(_KERNEL_DECL.findall(p.read_text(errors="replace")))
    return frozenset(names)


# Kernel-name rules (kineto's demangled names; ncu's are the same, or the bare function name)
_TORCH_NS = re.compile(r"\bat::|\bc10::|\bcub::|\bthrust::|\bat_cuda_detail::|\btorch::")
_CUDNN = re.compile(r"cudnn|CUDNN|RNN_|elemWiseRNN|_elementWise_|fprop|dgrad|wgrad|convolve|winograd")   # case matters
_CUBLAS = re.compile(r"cublas|xmma|nvjet|cutlass|gemm|gemv|^(?:void\s+)?(?:dot_kernel|splitKreduce|scal_kernel|"
                     r"axpy_kernel|asum_kernel|nrm2_kernel|reduce_1Block_kernel)|^(?:void\s+)?(?:sm\d+|ampere|volta|"
                     r"turing|hopper)_", re.I)


def kernel_category(name: str, ours_version: bool, ours: Iterable[str] | None = None) -> str:
    """ours / cublas / cudnn / copy / memset / elementwise / other, from the kernel's name and whether the version
    that launched it is ours (`ours`: our kernels' names, default: every __global__ under cuda_src/).

    The rules, in order: Memcpy* and PyTorch's copy kernels are 'copy', Memset* 'memset'; outside PyTorch's
    namespaces, a name the lab's sources define is 'ours' and cuDNN's and cuBLAS's (cuBLASLt's nvjet/xmma/cutlass)
    kernels go by their names; PyTorch's elementwise kernels (and Triton's pointwise ones) are 'elementwise'; any other
    PyTorch or Triton kernel (reductions, sorts, indexing) 'other'; a kernel no rule names is 'ours' under one of our
    versions (a helper kernel of a binding), else 'other'."""
    ours = our_kernels(env.CUDA_SRC) if ours is None else ours
    ident = kernel_identifier(name)
    torch_ns = bool(_TORCH_NS.search(name))
    if name.startswith("Memcpy") or "copy_kernel" in name or "CatArrayBatchedCopy" in name:
        return "copy"
    if name.startswith("Memset"):
        return "memset"
    if not torch_ns:
        if ident in ours:
            return "ours"
        if _CUDNN.search(name):
            return "cudnn"
        if _CUBLAS.search(name):
            return "cublas"
    if "elementwise" in ident.lower() or ident.startswith("triton_poi"):
        return "elementwise"
    if torch_ns or ident.startswith("triton_"):
        return "other"
    return "ours" if ours_version else "other"


def kernel_rows(stats: list[dict], key: dict, ours_version: bool, device: str, reps: int = 3,
                ours: Iterable[str] | None = None) -> list[dict]:
    """profiles.csv rows of one version's profiled run: key (family, op, version, shape, dtype, precision) + one row
    per kernel with its category (on a CPU: per operator, 'cpu-op') + the machine stamp."""
    st = results.stamp(device)
    role = "ours" if ours_version else "baseline"
    out = []
    for s in stats:
        cat = kernel_category(s["kernel"], ours_version, ours) if st["device"] == "cuda" else "cpu-op"
        out.append({**key, **st, "role": role, "mode": "eager", "kernel": s["kernel"], "category": cat,
                    "us_per_call": s["us_per_call"], "calls_per_call": s["calls_per_call"], "reps": reps})
    return out


def record(rows: list[dict]) -> Path | None:
    """Append profiles.csv rows to results/<their device>/profiles.csv."""
    return results.append(rows, columns=PROFILE_COLUMNS, name=PROFILES) if rows else None


def read_profiles(**where) -> list[dict]:
    """Every device's profiles.csv rows (filtered like results.read)."""
    return results.read(numeric=PROFILE_NUMERIC, name=PROFILES, **where)


# =================================================================================================================
# Nsight Compute: results/<device>/ncu.csv
# =================================================================================================================
NCU = "ncu.csv"
TENSOR_METRICS = (   # the first that this ncu knows is recorded: all tensor pipes, then Hopper's wgmma, then mma.sync
    "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active",
    "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active",
    "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
)
# the Warp State Statistics section's stall reasons: warps stalled for that reason per issue-active cycle
STALL_REASONS = ("barrier", "branch_resolving", "dispatch_stall", "drain", "gmma", "imc_miss", "lg_throttle",
                 "long_scoreboard", "math_pipe_throttle", "membar", "mio_throttle", "misc", "no_instruction",
                 "not_selected", "short_scoreboard", "sleeping", "tex_throttle", "wait")
STALL_METRIC = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio"
# instructions issued per active cycle of a warp scheduler (at most 1: a Hopper SM has four, each issuing one a cycle)
ISSUE_METRIC = "smsp__inst_issued.avg.per_cycle_active"
# FP32 arithmetic as executed (threads with the predicate on, summed over the kernel): an FFMA counts two FLOPs. The
# achieved FP32 rate is these over the kernel's duration: counted, not the formula's FLOPs (tensor-core work is not
# in it; tensor_pct is)
FP32_OPS = (("smsp__sass_thread_inst_executed_op_ffma_pred_on.sum", 2),
            ("smsp__sass_thread_inst_executed_op_fadd_pred_on.sum", 1),
            ("smsp__sass_thread_inst_executed_op_fmul_pred_on.sum", 1))
NCU_METRICS = (
    "gpu__time_duration.sum",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "dram__bytes_read.sum", "dram__bytes_write.sum",
    "lts__t_bytes.sum",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    *TENSOR_METRICS,
    "sm__warps_active.avg.pct_of_peak_sustained_active",
    ISSUE_METRIC, *(name for name, _ in FP32_OPS),
    "launch__registers_per_thread",
    "launch__shared_mem_per_block_static", "launch__shared_mem_per_block_dynamic",
    *(STALL_METRIC.format(r) for r in STALL_REASONS),
)
# the metrics that ncu reported on the H100 (tests/fixtures/ncu_h100_sgemm_warpstate_raw.csv, a recording): a metric
# listing that lacks one of these is misread, not a GPU without them
NCU_SEEN_ON_H100 = ("gpu__time_duration.sum", "launch__registers_per_thread", "launch__shared_mem_per_block_static",
                    "launch__shared_mem_per_block_dynamic", *(STALL_METRIC.format(r) for r in STALL_REASONS))
NCU_COLUMNS = ["family", "op", "version", "role", "shape", "dtype", "precision", "device", "device_name", "mode",
               "launch", "kernel", "category", "grid", "block", "duration_us", "dram_gbps", "dram_pct", "l2_gbps",
               "sm_pct", "tensor_pct", "tensor_metric", "occupancy_pct", "regs", "smem_static", "smem_dynamic",
               "stall1", "stall1_ratio", "stall2", "stall2_ratio", "stall3", "stall3_ratio",
               "ncu", "torch", "cuda", "commit", "timestamp", "run_id", "note",
               "issue_ipc", "fp32_tflops"]   # (added after the others: an older table's header is a prefix of this)
NCU_NUMERIC = {"launch", "duration_us", "dram_gbps", "dram_pct", "l2_gbps", "sm_pct", "tensor_pct", "occupancy_pct",
               "regs", "smem_static", "smem_dynamic", "stall1_ratio", "stall2_ratio", "stall3_ratio", "issue_ipc",
               "fp32_tflops"}


def ncu_path() -> str | None:
    """The ncu program: $LAB_NCU when set (a path that does not exist means none), else $CUDA_HOME/bin, then PATH."""
    if "LAB_NCU" in os.environ:
        p = os.environ["LAB_NCU"]
        return p if p and os.path.exists(p) else None
    return build.cuda_tool("ncu")


def ncu_unavailable() -> str | None:
    """Why ncu cannot run here (no ncu, no GPU), or None when it can."""
    if ncu_path() is None:
        return ("Nsight Compute (ncu) was not found (not in $CUDA_HOME/bin, not on PATH; $LAB_NCU names one): nothing "
                "to profile with ncu on this machine. Run `python -m lab profile FAMILY --ncu` where ncu and a GPU are")
    if not torch.cuda.is_available():
        return "no GPU visible (torch.cuda.is_available() is False): ncu profiles kernels on a GPU"
    return None


def ncu_command(family: str, op: str, version: str, dtype: str, shape: dict, python: str = sys.executable
                ) -> list[str]:
    """The child process ncu profiles: the lab's CLI runs `version` once (warm-up), then once more between
    cudaProfilerStart and cudaProfilerStop (so `--profile-from-start off` sees that call only)."""
    size = ",".join(f"{k}={v}" for k, v in shape.items())
    return [python, "-m", "lab", "profile", family, "--op", op, "--version", version, "--dtype", dtype,
            "--device", "cuda", "--ncu-child"] + (["--size", size] if size else [])


# ---- reading ncu --csv --------------------------------------------------------------------------------------------
_PREFIX = {"n": 1e-9, "u": 1e-6, "m": 1e-3, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}
# ncu's unit words (long and short spellings) -> the base unit they count in
_BASES = {"second": "second", "s": "second", "byte": "byte", "B": "byte", "hz": "hz", "Hz": "hz", "cycle": "cycle",
          "inst": "inst", "warp": "warp", "thread": "thread", "block": "block", "sector": "sector",
          "request": "request"}


def _unit_factor(unit: str) -> tuple[str, float]:
    """ncu's unit -> (base unit, factor): 'usecond' and 'us' -> ('second', 1e-6), 'Gbyte/second' -> ('byte/second',
    1e9), 'Kbyte/block' -> ('byte/block', 1e3), 'cycle/nsecond' -> ('cycle/second', 1e9); '%', 'register/thread' and
    the like stay as they are (factor 1)."""
    parts, factor = [], 1.0
    for i, u in enumerate((unit or "").strip().split("/")):
        f = 1.0
        for word in sorted(_BASES, key=len, reverse=True):
            if u == word:
                u = _BASES[word]
                break
            if u.endswith(word) and u[: -len(word)] in _PREFIX:
                f, u = _PREFIX[u[: -len(word)]], _BASES[word]
                break
        factor = factor * f if i == 0 else factor / f
        parts.append(u)
    return "/".join(parts), factor


def parse_number(s: str) -> float | None:
    """ncu's printed number: '1,234,567.5' (thousands separators) -> 1234567.5; 'n/a' or '' -> None."""
    s = (s or "").strip().strip('"')
    if not s or s.lower() in ("n/a", "nan", "-"):
        return None
    if re.fullmatch(r"-?\d{1,3}(,\d{3})+(\.\d+)?", s):
        s = s.replace(",", "")
    elif re.fullmatch(r"-?\d+,\d+", s):        # a decimal comma (another locale)
        s = s.replace(",", ".")
    try:
        return float(s)
    except ValueError:
        return None


def _csv_start(text: str) -> str:
    """ncu's CSV from its printed output: from the header ('"ID",...') on, without its ==PROF== / ==WARNING== lines
    or anything the profiled program printed before."""
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith('"ID"')), None)
    if start is None:
        return ""
    return "\n".join(ln for ln in lines[start:] if ln.startswith('"'))


def parse_ncu_csv(text: str) -> list[dict]:
    """ncu's --csv output (the details page's long format: one row per metric of each launch, columns "ID", ...,
    "Kernel Name", ..., "Block Size", "Grid Size", ..., "Metric Name", "Metric Unit", "Metric Value"; or the raw
    page's wide format: one row per launch, one column per metric, a units row under the header) -> one dict per
    kernel launch: {"launch", "kernel", "grid", "block", "metrics": {metric: value in base units}, "units": {...}}.
    Values in base units: seconds, bytes, bytes/second, % (thousands separators and 'n/a' handled)."""
    body = _csv_start(text)
    if not body:
        return []
    rows = list(csv.DictReader(io.StringIO(body)))
    launches: dict[str, dict] = {}

    def launch(r: dict) -> dict:
        lid = r.get("ID", "")
        if lid not in launches:
            launches[lid] = {"launch": int(lid) if lid.isdigit() else len(launches), "kernel": r.get("Kernel Name"),
                             "grid": _dim(r.get("Grid Size")), "block": _dim(r.get("Block Size")),
                             "metrics": {}, "units": {}}
        return launches[lid]

    def put(rec: dict, metric: str, unit: str, value: str) -> None:
        v = parse_number(value)
        base, f = _unit_factor(unit)
        rec["metrics"][metric] = v * f if v is not None else None
        rec["units"][metric] = base

    if rows and "Metric Name" in rows[0]:
        for r in rows:
            if r.get("Metric Name"):    # (newer ncu adds rule rows, whose metric columns are empty)
                put(launch(r), r["Metric Name"], r.get("Metric Unit") or "", r.get("Metric Value") or "")
    else:    # raw page: metric columns; its second row gives their units
        ident = {"ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Kernel Time", "Context", "Stream",
                 "Block Size", "Grid Size", "Device", "CC"}
        units = {}
        if rows and not (rows[0].get("ID") or "").strip():
            units, rows = rows[0], rows[1:]
        for r in rows:
            rec = launch(r)
            for k, v in r.items():
                if k not in ident and k and "__" in k:
                    put(rec, k, units.get(k, ""), v)
    return sorted(launches.values(), key=lambda d: d["launch"])


def _dim(s: str | None) -> str | None:
    """'(256, 1, 1)' -> '256x1x1'."""
    nums = re.findall(r"\d+", s or "")
    return "x".join(nums) if nums else None


def ncu_row(launch: dict) -> dict:
    """One ncu.csv row's measured columns from a parsed launch: duration, DRAM and L2 bandwidth (bytes moved over the
    duration), SM and tensor-pipe throughput (% of peak), achieved occupancy (active warps, % of the SM's maximum),
    registers per thread, shared memory per block, the three largest warp-stall reasons, instructions issued per
    scheduler cycle, and the FP32 FLOP/s the kernel executed (2 per FFMA, 1 per FADD or FMUL)."""
    m = launch["metrics"]
    sec = m.get("gpu__time_duration.sum")
    dram = [m.get("dram__bytes_read.sum"), m.get("dram__bytes_write.sum")]
    dram_bytes = sum(x for x in dram if x is not None) if any(x is not None for x in dram) else None
    l2 = m.get("lts__t_bytes.sum")
    tensor = next(((t, m[t]) for t in TENSOR_METRICS if m.get(t) is not None), (None, None))
    stalls = sorted(((r, m.get(STALL_METRIC.format(r))) for r in STALL_REASONS
                     if m.get(STALL_METRIC.format(r)) is not None), key=lambda kv: -kv[1])[:3]
    row = {"launch": launch["launch"], "kernel": launch["kernel"], "grid": launch["grid"], "block": launch["block"],
           "duration_us": sec * 1e6 if sec is not None else None,
           "dram_gbps": dram_bytes / sec / 1e9 if dram_bytes is not None and sec else None,
           "dram_pct": m.get("dram__throughput.avg.pct_of_peak_sustained_elapsed"),
           "l2_gbps": l2 / sec / 1e9 if l2 is not None and sec else None,
           "sm_pct": m.get("sm__throughput.avg.pct_of_peak_sustained_elapsed"),
           "tensor_pct": tensor[1], "tensor_metric": tensor[0].split(".")[0] if tensor[0] else None,
           "occupancy_pct": m.get("sm__warps_active.avg.pct_of_peak_sustained_active"),
           "regs": m.get("launch__registers_per_thread"),
           "smem_static": m.get("launch__shared_mem_per_block_static"),
           "smem_dynamic": m.get("launch__shared_mem_per_block_dynamic"),
           "issue_ipc": m.get(ISSUE_METRIC)}
    ops = [(w, m.get(name)) for name, w in FP32_OPS]
    row["fp32_tflops"] = (sum(w * n for w, n in ops if n is not None) / sec / 1e12
                          if sec and any(n is not None for _, n in ops) else None)
    for i in range(3):
        row[f"stall{i + 1}"], row[f"stall{i + 1}_ratio"] = stalls[i] if i < len(stalls) else (None, None)
    return row


# ---- running ncu ----------------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def ncu_version(tool: str) -> str:
    try:
        out = subprocess.run([tool, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    lines = [ln.strip() for ln in out.splitlines() if ln.strip()]
    return lines[-1] if lines else "unknown"


@functools.lru_cache(maxsize=None)
def ncu_known_metrics(tool: str) -> frozenset[str] | None:
    """The base metric names this ncu reports for this GPU (`ncu --query-metrics`), or None when the listing could
    not be read (then every metric is asked for, and ncu itself says which it does not know)."""
    try:
        out = subprocess.run([tool, "--query-metrics"], capture_output=True, text=True, timeout=300).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    names = frozenset(m.group(1) for m in re.finditer(r"^\s*([a-z0-9]+__[a-z0-9_]+)\b", out, re.M))
    return names if all(m.split(".")[0] in names for m in NCU_SEEN_ON_H100) else None


def _unknown_metrics(text: str) -> set[str]:
    """Metric names ncu said it does not know ('==ERROR== Failed to find metric X', '... metric X not found')."""
    found = set(re.findall(r"[Ff]ailed to find metric\s+'?([\w.]+)", text))
    found |= set(re.findall(r"[Mm]etric\s+'?([\w.]+)'?\s+(?:was )?not found", text))
    return found


def run_ncu(cmd: list[str], metrics: Iterable[str] = NCU_METRICS, report: Path | None = None,
            timeout: float = 600, say: Callable[[str], None] = print) -> tuple[str, list[str]]:
    """Profile `cmd` under ncu: `ncu --profile-from-start off --target-processes all --metrics ... -o report`, then
    `ncu --import report --csv --page details --print-units base --print-kernel-base demangled`. Returns (the CSV
    text, the metrics asked for).
    Metrics this ncu does not list for this GPU are left out (and said); a metric it still refuses is dropped and the
    run repeated once."""
    tool = ncu_path()
    if tool is None:
        raise RuntimeError(ncu_unavailable() or "ncu not found")
    metrics = list(dict.fromkeys(metrics))
    known = ncu_known_metrics(tool)
    if known is not None:
        gone = [m for m in metrics if m.split(".")[0] not in known]
        if gone:
            say(f"[lab] ncu {ncu_version(tool)} does not list these metrics for this GPU, left out: {', '.join(gone)}")
        metrics = [m for m in metrics if m not in gone]
    with tempfile.TemporaryDirectory() as tmp:
        rep = Path(report) if report else Path(tmp) / "ncu"
        rep.parent.mkdir(parents=True, exist_ok=True)
        for attempt in range(2):
            prof = [tool, "--profile-from-start", "off", "--target-processes", "all", "--metrics", ",".join(metrics),
                    "-f", "-o", str(rep)] + list(cmd)
            r = subprocess.run(prof, capture_output=True, text=True, timeout=timeout, cwd=env.ROOT)
            bad = _unknown_metrics(r.stdout + r.stderr) & set(metrics)
            if r.returncode == 0 or not bad or attempt:
                break
            say(f"[lab] ncu refused {', '.join(sorted(bad))}: profiling again without them")
            metrics = [m for m in metrics if m not in bad]
        rep_file = rep if rep.suffix == ".ncu-rep" else rep.with_name(rep.name + ".ncu-rep")
        if r.returncode != 0 or not rep_file.exists():
            tail = "\n".join((r.stdout + r.stderr).strip().splitlines()[-25:])
            raise RuntimeError(f"ncu failed (exit {r.returncode}) on: {shlex.join(cmd)}\n{tail}")
        for page in ("details", "raw"):   # the long format; the wide one if the details page had no metrics
            imp = subprocess.run([tool, "--import", str(rep_file), "--csv", "--page", page, "--print-units", "base",
                                  "--print-kernel-base", "demangled"], capture_output=True, text=True, timeout=timeout)
            if imp.returncode != 0:
                raise RuntimeError(f"ncu --import failed (exit {imp.returncode}): {imp.stderr.strip()[-2000:]}")
            if any(launch["metrics"] for launch in parse_ncu_csv(imp.stdout)):
                break
        return imp.stdout, metrics


def ncu(cmd: list[str] | str, key: dict | None = None, ours_version: bool = True, device: str = "cuda",
        record_rows: bool = True, metrics: Iterable[str] = NCU_METRICS, name: str | None = None,
        say: Callable[[str], None] = print) -> list[dict]:
    """Run `cmd` (a command: list or shell-quoted string; `ncu_command(...)` makes one for a lab version) under
    Nsight Compute and return one ncu.csv row per kernel launch it profiled; with `key` (family, op, version, shape,
    dtype, precision) and record_rows, append them to results/<device>/ncu.csv. The ncu report is kept as
    results/<device>/traces/ncu/<name>.ncu-rep (git-ignored; open it in ncu-ui). Where ncu or a GPU is missing: says
    why and returns []. A callable is not accepted: ncu profiles a process it starts, so the call must be a command."""
    why = ncu_unavailable()
    if why:
        say(f"[lab] ncu: {why}")
        return []
    if callable(cmd):
        raise TypeError("lab.profile.ncu profiles a command (ncu starts the process it profiles): pass a command, "
                        "e.g. lab.profile.ncu_command('basics', 'square', 'v2', 'float32', {'n': 1 << 24})")
    argv = shlex.split(cmd) if isinstance(cmd, str) else list(cmd)
    tool = ncu_path()
    report = None
    if name:
        report = env.results_dir(device) / "traces" / "ncu" / name
    text, asked = run_ncu(argv, metrics, report, say=say)
    st = results.stamp(device)
    key = dict(key or {})
    rows = []
    for launch in parse_ncu_csv(text):
        row = {**key, **st, **ncu_row(launch), "mode": "ncu", "ncu": ncu_version(tool),
               "role": "ours" if ours_version else "baseline",
               "category": kernel_category(launch["kernel"] or "", ours_version)}
        missing = [m for m in asked if m not in launch["metrics"]]
        if missing:
            row["note"] = f"not reported: {', '.join(missing)}"
        rows.append(row)
    if record_rows and rows:
        results.append(rows, columns=NCU_COLUMNS, name=NCU)
    return rows


def read_ncu(**where) -> list[dict]:
    """Every device's ncu.csv rows (filtered like results.read)."""
    return results.read(numeric=NCU_NUMERIC, name=NCU, **where)


def stall_text(r: dict) -> str:
    """An ncu.csv row's three largest warp-stall reasons, 'long_scoreboard 4.66, barrier 4.54, ...'."""
    return ", ".join(f"{r[f'stall{i}']} {r[f'stall{i}_ratio']:.2f}" for i in (1, 2, 3)
                     if r.get(f"stall{i}") and r.get(f"stall{i}_ratio") is not None)


def ncu_table(rows: list[dict]) -> str:
    """ncu.csv rows as a text table: per launch, time, bandwidths, throughputs, occupancy, resources, stalls."""
    def f(v, spec=".1f"):
        return "-" if v is None else format(v, spec)
    head = (f"{'version':<10} {'kernel':<32} {'cat':<11} {'us':>8} {'DRAM GB/s':>9} {'L2 GB/s':>9} {'SM%':>5} "
            f"{'TC%':>5} {'occ%':>5} {'IPC':>4} {'FP32 TF/s':>9} {'regs':>4} {'smem':>6}  "
            f"top stalls (warps per issue cycle)")
    lines = [head]
    for r in rows:
        stalls = stall_text(r)
        smem = (r.get("smem_static") or 0) + (r.get("smem_dynamic") or 0)
        lines.append(f"{r.get('version') or '':<10} {short_kernel_name(r['kernel'] or '?', 32):<32} "
                     f"{r.get('category') or '':<11} {f(r['duration_us'], '.2f'):>8} {f(r['dram_gbps'], '.0f'):>9} "
                     f"{f(r['l2_gbps'], '.0f'):>9} {f(r['sm_pct']):>5} {f(r['tensor_pct']):>5} "
                     f"{f(r['occupancy_pct']):>5} {f(r.get('issue_ipc'), '.2f'):>4} "
                     f"{f(r.get('fp32_tflops'), '.2f'):>9} {f(r['regs'], '.0f'):>4} {smem:>6.0f}  {stalls}")
    return "\n".join(lines)


# =================================================================================================================
# What bounds a version: its dominant kernel, read from the recorded metrics
# =================================================================================================================
BOUND_AT_PCT = 60.0   # a unit this busy (% of its peak) is what the kernel waits on; below it on every unit: latency


def kernel_bound(row: dict) -> str:
    """One ncu row's bound: 'memory' (DRAM throughput at or above BOUND_AT_PCT of peak), 'compute' (the SM's issue
    or the tensor pipe at or above it), else 'latency' (nothing near its peak: too few warps or bytes in flight, or
    a kernel too short to fill the chip). The busier unit wins where both pass."""
    dram, sm, tc = (row.get(k) or 0.0 for k in ("dram_pct", "sm_pct", "tensor_pct"))
    if max(dram, sm, tc) < BOUND_AT_PCT:
        return "latency"
    return "memory" if dram >= max(sm, tc) else "compute"


def kernel_totals(rows: list[dict], time_key: str, launches_key: str | None = None) -> list[dict]:
    """One version's rows grouped by kernel (the full demangled name: one identifier, every launch of it), longest
    total first. Each entry: kernel, launches (rows, one per launch in ncu.csv; or the sum of launches_key, for
    profiles.csv's per-kernel rows), total (sum of time_key), and the ncu percentages averaged over its
    launches weighted by their time, so a kernel launched 30 times (GRU v2's step kernel, cuDNN's) is one kernel, not
    its longest single launch."""
    groups: dict[str, list[dict]] = {}
    for r in rows:
        groups.setdefault(r.get("kernel") or "?", []).append(r)
    out = []
    for kernel, rs in groups.items():
        ts = [r.get(time_key) or 0.0 for r in rs]
        total = sum(ts)
        launches = round(sum(r.get(launches_key) or 0 for r in rs)) if launches_key else len(rs)
        entry = {"kernel": kernel, "launches": launches, "total": total, "commit": rs[0].get("commit")}
        for k in ("dram_pct", "sm_pct", "tensor_pct"):
            vals = [(r.get(k), t) for r, t in zip(rs, ts) if r.get(k) is not None]
            wsum = sum(t for _, t in vals)
            entry[k] = (sum(v * t for v, t in vals) / wsum if wsum else
                        (sum(v for v, _ in vals) / len(vals) if vals else None))
        out.append(entry)
    return sorted(out, key=lambda e: -e["total"])


def dominant_kernel_line(family: str, op: str, device_name: str | None = None, dtype: str | None = None,
                         shape: str | None = None) -> str:
    """Per version (newest ncu run of each), the kernel that takes most of its time, summed over all its launches,
    and what bounds it (its launches' ncu percentages weighted by time), one line each, from results/<device>/ncu.csv;
    where a version has no ncu rows, from profiles.csv (time share only, bound not measured). One device, dtype and
    shape (case_of over both tables: as given, else the newest row's), so a version profiled at another shape before
    does not answer for this one. Says so when neither table has rows."""
    ncu_all, prof_all = read_ncu(family=family, op=op), read_profiles(family=family, op=op)
    case = case_of(ncu_all + prof_all, device_name, dtype, shape)     # one case for both tables
    lines = []
    ncu_rows = newest_runs(ncu_all, *case)

    def head(version: str, top: dict, total: float) -> str:
        share = 100 * top["total"] / total if total else 0.0
        name = short_kernel_name(top["kernel"], 34)
        return (f"{version:<12} {name:<34} {top['launches']:3d}x {top['total']:9.2f} us "
                f"({share:3.0f}% of {total:.2f} us)")

    for version, rs in ncu_rows.items():
        kernels = kernel_totals(rs, "duration_us")
        top, total = kernels[0], sum(k["total"] for k in kernels)
        lines.append(f"{head(version, top, total)}  DRAM {top['dram_pct'] or 0:4.0f}%  SM {top['sm_pct'] or 0:4.0f}%  "
                     f"TC {top['tensor_pct'] or 0:4.0f}%  -> {kernel_bound(top)}-bound (ncu {top['commit']})")
    for version, rs in newest_runs(prof_all, *case).items():
        if version in ncu_rows:
            continue
        kernels = kernel_totals(rs, "us_per_call", "calls_per_call")
        top, total = kernels[0], sum(k["total"] for k in kernels)
        lines.append(f"{head(version, top, total)}  bound not measured (no ncu rows; python -m lab profile "
                     f"{family} --op {op} --ncu)")
    if not lines:
        return (f"{family}.{op}: no recorded profile rows (python -m lab profile {family} --op {op}, on a GPU "
                f"add --ncu)")
    return "\n".join(lines)


def _newest(rows: list[dict]) -> dict:
    return max(rows, key=lambda r: (r.get("timestamp") or "", r.get("run_id") or ""))


def case_of(rows: list[dict], device_name: str | None = None, dtype: str | None = None,
            shape: str | None = None) -> tuple[str | None, str | None, str | None]:
    """The (device name, dtype, shape) a figure or a line reads: each as given, else the newest row's among those
    that match what is already fixed."""
    want = {"device_name": device_name, "dtype": dtype, "shape": shape}
    for col in want:
        if want[col] is None and rows:
            want[col] = _newest(rows)[col]
        rows = [r for r in rows if r[col] == want[col]]
    return want["device_name"], want["dtype"], want["shape"]


def newest_runs(rows: list[dict], device_name: str | None = None, dtype: str | None = None,
                shape: str | None = None) -> dict[str, list[dict]]:
    """Rows of one case (case_of: one device, dtype and shape), then per version the rows of its newest run only (by
    timestamp, then run id): a figure's bar or a table's line is one run, never two mixed. {version: rows}."""
    dev, dt, sh = case_of(rows, device_name, dtype, shape)
    rows = [r for r in rows if (r["device_name"], r["dtype"], r["shape"]) == (dev, dt, sh)]
    last: dict[str, tuple] = {}
    for r in rows:
        k = (r.get("timestamp") or "", r.get("run_id") or "")
        if k >= last.get(r["version"], ("", "")):
            last[r["version"]] = k
    out: dict[str, list[dict]] = {}
    for r in rows:
        if (r.get("timestamp") or "", r.get("run_id") or "") == last[r["version"]]:
            out.setdefault(r["version"], []).append(r)
    return out


# =================================================================================================================
# Measured bytes against the formula's (issue 18: a roofline from measured bytes)
# =================================================================================================================
_SHAPE_ITEM = re.compile(r"([A-Za-z_]\w*)=(\([^)]*\)|\S+)")


def _shape_value(s: str):
    """'4096' -> 4096, '-1' -> -1, '0.5' -> 0.5, '(3, 5)' -> (3, 5); anything else ('zipf', '128x128') stays a str."""
    if s.startswith("(") and s.endswith(")"):
        return tuple(_shape_value(t.strip()) for t in s[1:-1].split(",") if t.strip())
    for cast in (int, float):
        try:
            return cast(s)
        except ValueError:
            pass
    return s


def parse_shape_label(label: str | None, like: Iterable[dict] = ()) -> dict:
    """registry.shape_label's inverse: 'tokens=4096 dim=1024 dist=zipf idx_shape=(3, 5)' -> {'tokens': 4096, 'dim':
    1024, 'dist': 'zipf', 'idx_shape': (3, 5)}; 'factors=128x128' stays a string. A label cannot tell kron's
    'factors=9' (a string, one factor) from a number: `like` (the op's own shapes) names the keys whose values are
    strings there, and those stay strings."""
    strings = {k for s in like for k, v in s.items() if isinstance(v, str)}
    return {k: v if k in strings else _shape_value(v) for k, v in _SHAPE_ITEM.findall(label or "")}


def op_shapes(o) -> list[dict]:
    """An Op's own shapes (check, bench, CPU bench): what parse_shape_label reads a label of it `like`."""
    return list(o.check_shapes) + list(o.bench_shapes) + list(o.cpu_bench_shapes or [])


def _formula(family: str, op: str, label: str | None, dtype: str | None) -> tuple[float | None, float | None, str]:
    """(formula bytes, formula FLOPs, the formula in words) of family.op at a shape label and dtype name; None where
    the op has no such formula, is not registered, or its formula cannot read this shape (an older label)."""
    try:
        o = registry.get(family).op(op)
    except KeyError:
        return None, None, ""
    shape = parse_shape_label(label, op_shapes(o))
    dt = getattr(torch, dtype or "", None)
    if not isinstance(dt, torch.dtype):
        return None, None, o.formula

    def at(fn):
        if fn is None:
            return None
        try:
            v = fn(shape, dt)
        except (KeyError, TypeError, ValueError, AttributeError):
            return None
        return float(v) if v is not None else None
    return at(o.nbytes), at(o.flops), o.formula


def measured_calls(family: str, op: str, device_name: str | None = None, dtype: str | None = None) -> list[dict]:
    """Per version, its profiled call as ncu recorded it (the newest ncu run of each version, its launches summed),
    on one device (default: the newest ncu row's) and dtype (default: the newest row's there), beside the op's formula:
    {"version", "role", "shape", "dtype", "precision", "launches", "time_us", "measured_bytes", "formula_bytes",
    "flops", "formula", "rows"}. measured_bytes = sum of dram_gbps * duration over the launches (DRAM bytes read +
    written, dram__bytes_read.sum + dram__bytes_write.sum), None where a launch lacks it; flops from the formula (ncu
    rows count no FLOPs). Ours in ladder order (v2 before v10), then the baselines. [] where there are no rows."""
    rows = read_ncu(family=family, op=op)
    if not rows:
        return []
    out = []
    for version, rs in newest_runs(rows, device_name, dtype).items():
        shape, dtype = rs[0]["shape"], rs[0]["dtype"]
        rs = sorted(rs, key=lambda r: r.get("launch") or 0)
        parts = [(r.get("dram_gbps"), r.get("duration_us")) for r in rs]
        measured = (sum(g * 1e9 * t * 1e-6 for g, t in parts)
                    if all(g is not None and t is not None for g, t in parts) else None)
        nbytes, flops, formula = _formula(family, op, shape, dtype)
        out.append({"version": version, "role": rs[0].get("role") or "ours", "shape": shape, "dtype": dtype,
                    "precision": rs[0].get("precision"), "launches": len(rs),
                    "time_us": sum(r.get("duration_us") or 0.0 for r in rs), "measured_bytes": measured,
                    "formula_bytes": nbytes, "flops": flops, "formula": formula, "rows": rs})
    digits = lambda v: [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", v)]   # noqa: E731
    return sorted(out, key=lambda c: (c["role"] == "baseline", digits(c["version"])))


def measured_bytes_table(family: str, op: str, device_name: str | None = None, dtype: str | None = None) -> str:
    """Per version (newest ncu run of each): time per call (its kernels' durations summed), the DRAM bytes ncu
    measured, the bytes the op's formula counts, and their ratio (above 1: the version moves more than it must; below:
    caches served part of what the formula counts), with the GB/s the measured bytes make."""
    calls = measured_calls(family, op, device_name, dtype)
    if not calls:
        return (f"{family}.{op}: no recorded ncu rows (python -m lab profile {family} --op {op} --ncu, on a GPU)")
    c0 = calls[0]["rows"][0]
    shapes = sorted({c["shape"] for c in calls})
    head = (f"{family}.{op} ({calls[0]['dtype']}) on {c0['device_name']}, ncu rows of "
            f"{', '.join(sorted({r['commit'] or '?' for c in calls for r in c['rows']}))}"
            + (f", at {shapes[0]}" if len(shapes) == 1 else ""))

    def f(v, spec):
        return "-" if v is None else format(v, spec)
    lines = [head, f"{'version':<12} {'kernels':>7} {'time us':>9} {'measured MB':>11} {'formula MB':>10} "
                   f"{'meas/formula':>12} {'GB/s meas':>9}" + ("  shape" if len(shapes) > 1 else "")]
    for c in calls:
        m, fb, t = c["measured_bytes"], c["formula_bytes"], c["time_us"]
        ratio = m / fb if m is not None and fb else None
        gbps = m / (t * 1e-6) / 1e9 if m is not None and t else None
        lines.append(f"{c['version']:<12} {c['launches']:>7} {t:>9.2f} {f(m and m / 1e6, '.3f'):>11} "
                     f"{f(fb and fb / 1e6, '.3f'):>10} {f(ratio, '.2f'):>12} {f(gbps, '.0f'):>9}"
                     + (f"  {c['shape']}" if len(shapes) > 1 else ""))
    return "\n".join(lines)
