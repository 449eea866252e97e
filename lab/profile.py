"""Where does the time go? The three ways the course material teaches, each a function.

1. CUDA events (`events`): the host clock lies for asynchronous CUDA (it times the launch, not the kernel); events
   are recorded on the stream and measure device time.
2. `torch.autograd.profiler` (`autograd_table`): per-operator CPU and CUDA time, as a key_averages table.
3. `torch.profiler` with a wait/warmup/active schedule (`profile`): skips the first iterations, then records a few;
   writes a key_averages table (sorted by CUDA time) under results/profiles/ and a Chrome trace under
   results/traces/ (open it in chrome://tracing or ui.perfetto.dev; traces are git-ignored, they are large).
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, schedule

from . import env


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


def profile(fn: Callable[[], object], name: str, device: str = "cuda", wait: int = 1, warmup: int = 1,
            active: int = 3, row_limit: int = 15, save: bool = True) -> tuple[str, Path | None]:
    """torch.profiler with a schedule; returns (table, trace path) and saves both under results/<device>/."""
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    trace_dir = env.results_dir(device) / "traces"
    trace = trace_dir / f"{name}.json"
    captured: dict[str, str] = {}

    def ready(prof):
        captured["table"] = prof.key_averages().table(sort_by=_sort_key(device), row_limit=row_limit)
        if save:
            trace_dir.mkdir(parents=True, exist_ok=True)
            prof.export_chrome_trace(str(trace))

    with torch.profiler.profile(activities=acts, schedule=schedule(wait=wait, warmup=warmup, active=active, repeat=1),
                                on_trace_ready=ready) as p:
        for _ in range(wait + warmup + active):
            fn()
            if device == "cuda":
                torch.cuda.synchronize()
            p.step()
    table = captured.get("table", "")
    if save:
        out = env.results_dir(device) / "profiles"
        out.mkdir(parents=True, exist_ok=True)
        (out / f"{name}.txt").write_text(f"# {name} on {env.device_name(device)}, torch {torch.__version__}, "
                                         f"schedule wait={wait} warmup={warmup} active={active}\n{table}\n")
    return table, (trace if save else None)


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
