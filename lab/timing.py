"""How long does it take? Timing that a kernel engineer would trust.

GPU: CUDA events around each repetition, after warm-up; the L2 is flushed before each repetition (a write of twice
its size, outside the timed region) so every run reads its inputs from HBM; the median and the 20th/80th percentiles
of many repetitions. Optionally the function is captured once in a CUDA graph and the replays are timed: for
launch-bound code that removes the CPU launch overhead the eager numbers include.
CPU: `torch.utils.benchmark` (blocked_autorange), which handles threads and warm-up.

The bottom layer of the harness: it imports no other module of the lab (ceilings and bench build on it).
"""
from __future__ import annotations

import math
import os
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.utils.benchmark as tbench


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
_CYCLES_PER_US = 2_000  # torch.cuda._sleep spins clock cycles: ~1 us at the H100's 1.98 GHz boost clock (longer when
                        # the clock is lower: a longer head start, never a shorter one)


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
              min_reps: int = 15, max_reps: int = 400, budget_ms: float = 300.0,
              head_start_us: float | None = None) -> Timing:
    """Median-of-many CUDA-event timing of fn() on the current stream. head_start_us: the busy kernel put before each
    timed call (None: sized by the host's enqueue time, below; .ci/timing_probe.py sweeps it)."""
    torch.cuda.synchronize()
    for _ in range(warmup):                      # module load, lazy init, allocator warm-up, autotuning
        fn()
    run = capture_graph(fn).replay if graph else fn
    torch.cuda.synchronize()
    # the host's time to enqueue one call (Python wrapper, checks, launches; no sync): the GPU gets a head start of
    # a busy kernel at least this long before each timed call, so the host has enqueued start, fn and end before the
    # GPU reaches them and the events time the GPU's work, not the launch latency (the fixed 10 us it was before is
    # shorter than the host path of a Python wrapper with checks, or of F.linear on a busy host)
    host = []
    for _ in range(5):
        t0 = time.perf_counter()
        run()
        host.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    if head_start_us is None:
        head_start_us = min(2000.0, 10.0 + 1.5e6 * statistics.median(host))
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(3):
        run()
    e.record()
    torch.cuda.synchronize()
    est_ms = max(s.elapsed_time(e) / 3, 1e-3) + (0.05 if flush else 0.0) + head_start_us / 1000
    n = int(min(max_reps, max(min_reps, budget_ms / est_ms)))
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    for i in range(n):
        if flush:
            flush_l2()
        torch.cuda._sleep(int(head_start_us * _CYCLES_PER_US))   # flushed or warm alike (see head_start_us)
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
