"""How long does it take? Timing that a kernel engineer would trust.

GPU: CUDA events around each repetition, after warm-up; the L2 is flushed before each repetition (a write of twice
its size, outside the timed region) so every run reads its inputs from HBM; the median and the 20th/80th percentiles
of many repetitions. A repetition's time is the larger of the GPU's time for the call and the host's time to issue
it, what a loop of calls runs at (time_cuda says how each is measured). Optionally the function is captured once in
a CUDA graph and the replays are timed: for launch-bound code that removes the CPU launch overhead the eager numbers
include.
CPU: `torch.utils.benchmark` (blocked_autorange), which handles threads and warm-up.

The bottom layer of the harness: it imports no other module of the lab (ceilings and bench build on it).
"""
from __future__ import annotations

import contextlib
import functools
import math
import os
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.utils.benchmark as tbench


# Contexts entered around every timing below, registered by the layers above (this module imports none of the lab):
# lab.build registers build.frozen, so a lab wrapper timed here does not pay its per-call source-file check (a stat
# of every source, ~40 us of host time a call on the H100's host: basics.square read 50 us at n=4096 against torch's
# 12 at de761d0, and kron.tune ranked its configurations by it at batch 32 in 8457d41's notebook 05).
TIMED_CONTEXTS: list[Callable[[], contextlib.AbstractContextManager]] = []


def _under_timed_contexts(f):
    @functools.wraps(f)
    def timed(*args, **kw):
        with contextlib.ExitStack() as stack:
            for make in TIMED_CONTEXTS:
                stack.enter_context(make())
            return f(*args, **kw)
    return timed


@dataclass
class Timing:
    times_us: list[float] = field(repr=False)
    mode: str                        # "events", "graph" or "cpu"
    gpu_us: list[float] | None = field(default=None, repr=False)    # GPU: each repetition's two parts (time_cuda)
    host_us: list[float] | None = field(default=None, repr=False)

    @property
    def host_bound(self) -> float:
        """The share of repetitions whose time is the host's (its enqueue slower than the GPU's work)."""
        if not self.gpu_us or not self.host_us:
            return 0.0
        return sum(h > g for g, h in zip(self.gpu_us, self.host_us)) / len(self.gpu_us)

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
HEAD_START_MIN_US = 50.0      # see time_cuda: 40 us was enough on the H100 for the smallest call
HEAD_START_MAX_US = 20_000.0  # a for-loop over 1000s of tensors issues for ~11 ms
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


@_under_timed_contexts
def time_cuda(fn: Callable[[], object], *, graph: bool = False, flush: bool = True, warmup: int = 5,
              min_reps: int = 15, max_reps: int = 400, budget_ms: float = 300.0,
              head_start_us: float | None = None) -> Timing:
    """Median-of-many timing of fn() on the current stream: each repetition's time is the larger of the GPU's time for
    the call (CUDA events) and the host's time to issue it (perf_counter around the call, no sync). A loop of calls
    runs at the slower of the two: a GEMM at its kernels' time, a tiny add or a for-loop over 1000 tensors at the
    host's, and a graph replay at its kernels' time or the replay's launch, whichever is longer.

    The events time the GPU's work alone: before each repetition the GPU gets a head start (a busy kernel,
    torch.cuda._sleep) long enough that the host has enqueued the start event, the call and the end event before the
    GPU gets past it; the host's part is measured in the same repetition, while the GPU sleeps. A call that waits for
    the GPU (waits_for_the_gpu) is timed from an idle GPU instead, host and GPU in series (_time_synchronizing).
    The head start is twice the host's time for one whole repetition (the sleep's launch, two event records, the
    call), at least HEAD_START_MIN_US; head_start_us overrides it (.ci/timing_probe.py sweeps it). Sized by the
    call's host time alone (b08ab4a) it was too short: on the H100 a 1.1 us add timed 11-16 us; with 0/10/20 us of
    head start it read 26/24/21 us, with 40 us and above 3.5-4.2 us (the events then timed the harness's own Python,
    not the add)."""
    torch.cuda.synchronize()
    for _ in range(warmup):                      # module load, lazy init, allocator warm-up, autotuning
        fn()
    run = capture_graph(fn).replay if graph else fn
    torch.cuda.synchronize()
    if waits_for_the_gpu(run):
        return _time_synchronizing(run, flush, min_reps, max_reps, budget_ms)
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    whole = []
    for _ in range(5):
        t0 = time.perf_counter()
        torch.cuda._sleep(1)
        s.record()
        run()
        e.record()
        whole.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    if head_start_us is None:
        head_start_us = min(HEAD_START_MAX_US, max(HEAD_START_MIN_US, 2e6 * statistics.median(whole)))
    s.record()
    for _ in range(3):
        run()
    e.record()
    torch.cuda.synchronize()
    est_ms = max(s.elapsed_time(e) / 3, 1e-3) + (0.05 if flush else 0.0) + head_start_us / 1000
    n = int(min(max_reps, max(min_reps, budget_ms / est_ms)))
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    host = []
    for i in range(n):
        # The host waits for the previous repetition to end: the head start makes the GPU slower per repetition than
        # the host, so unchecked the host runs ahead until the launch queue is full and then blocks inside some
        # launch, in the call as often as not (seen on the H100: an add's p80 read as the 300 us of the head start)
        if i:
            ends[i - 1].synchronize()
        if flush:
            flush_l2()
        torch.cuda._sleep(int(head_start_us * _CYCLES_PER_US))   # flushed or warm alike
        starts[i].record()
        t0 = time.perf_counter()
        run()
        host.append(1e6 * (time.perf_counter() - t0))
        ends[i].record()
    torch.cuda.synchronize()
    gpu = [1000.0 * a.elapsed_time(b) for a, b in zip(starts, ends)]
    return Timing([max(g, h) for g, h in zip(gpu, host)], "graph" if graph else "events", gpu_us=gpu, host_us=host)


def waits_for_the_gpu(run: Callable[[], object]) -> bool:
    """Does a call block its host until the GPU catches up (a .item(), a copy to the host, an explicit sync: e.g. a
    range check of indices that reports on the host)? Its host time with the GPU busy on a long sleep exceeds its
    host time with the GPU idle by about the sleep. A call of more launches than the launch queue holds (a for-loop
    over 2000 tensors) blocks too, once the queue is full: it is timed in series as well, which for such a host-bound
    call is its host time and the GPU's tail."""
    idle = []
    for _ in range(3):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        run()
        idle.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    nap_us = max(2000.0, 3e6 * min(idle))
    torch.cuda._sleep(int(nap_us * _CYCLES_PER_US))
    t0 = time.perf_counter()
    run()
    busy = time.perf_counter() - t0
    torch.cuda.synchronize()
    return (busy - min(idle)) * 1e6 > 0.5 * nap_us


def _time_synchronizing(run, flush: bool, min_reps: int, max_reps: int, budget_ms: float) -> Timing:
    """A call that waits for the GPU costs its host time and its GPU time in series, and a head start would be
    counted in its host part: each repetition starts on an idle GPU (synchronized after the flush), so the events
    span the host's issue, the wait and the GPU's work, as in a user's loop."""
    t0 = time.perf_counter()
    for _ in range(3):
        run()
    torch.cuda.synchronize()
    est_ms = 1e3 * (time.perf_counter() - t0) / 3 + (0.05 if flush else 0.0)
    n = int(min(max_reps, max(min_reps, budget_ms / est_ms)))
    times = []
    for _ in range(n):
        if flush:
            flush_l2()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        a.record()
        run()
        b.record()
        b.synchronize()
        times.append(1000.0 * a.elapsed_time(b))
    return Timing(times, "events")


@_under_timed_contexts
def time_cpu(fn: Callable[[], object], min_run_time: float = 0.2) -> Timing:
    """torch.utils.benchmark's blocked_autorange: per-block means, enough blocks for min_run_time seconds."""
    m = tbench.Timer(stmt="fn()", globals={"fn": fn}, num_threads=torch.get_num_threads()).blocked_autorange(
        min_run_time=min_run_time)
    return Timing([t * 1e6 for t in m.times], "cpu")


def time_fn(fn: Callable[[], object], device: torch.device | str, graph: bool = False, **kw) -> Timing:
    if torch.device(device).type == "cuda":
        return time_cuda(fn, graph=graph, **kw)
    return time_cpu(fn, **{k: v for k, v in kw.items() if k == "min_run_time"})
