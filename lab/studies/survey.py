"""How PyTorch reaches the GPU: a survey of the seq2seq model's operators, kernels, launch configurations, CUDA runtime
calls and dispatcher layers (issue 16, part 1; notebooks/08_how_pytorch_reaches_the_gpu.ipynb). A study of the seq2seq model (lab/models/seq2seq.py);
its figures attach to the gru family, so `python -m lab plot` redraws them from survey.csv.

Everything here is read from torch.profiler's Chrome trace (`prof.export_chrome_trace`), whose events are kineto's
(field names as libkineto writes them: src/CuptiActivity.cpp, include/MetadataFieldCatalog.h, src/output_json.cpp):

    cpu_op           an ATen operator on the host; args["External id"] names it, args["Input Dims"] its input shapes
    user_annotation  a record_function scope: here LABEL around each profiled call (its window on the host clock)
    kernel           a kernel on the GPU. args: "External id" (the innermost operator or scope open on the host when it
                     was launched), "correlation" (the id of its launch call), "grid", "block", "registers per thread",
                     "shared memory" (static + dynamic, bytes), "blocks per SM", "warps per SM",
                     "est. achieved occupancy %"
    gpu_memcpy, gpu_memset   copies and fills on the GPU ("correlation", "bytes")
    cuda_runtime     a CUDA runtime call on the host (cudaLaunchKernel, cudaMemcpyAsync, cudaStreamSynchronize,
                     cudaGraphLaunch, cudaEventRecord, cudaMalloc, ...; "correlation", "cbid"). kineto drops
                     cudaGetDevice, cudaSetDevice, cudaGetLastError and cudaEventCreate[WithFlags]/cudaEventDestroy as
                     noise (CuptiActivityProfiler.cpp, CuptiCbidRegistry.cpp): those are never counted here
    cuda_driver      a driver call; kineto keeps only kernel launches (cuLaunchKernel, cuLaunchKernelEx: how cuBLAS and
                     cuDNN launch their kernels)

What is measured (every function returns rows for results/<device>/survey.csv; `record(rows)` appends them):

    survey_phase      one profiled call of a phase (a forward, a decoder step, a greedy decode, eager or replayed from
                      a CUDA graph), four views of it: op_kernels (each kernel under the operator that launched it and
                      that operator's outermost caller, with its launch configuration and device time), op_host (the
                      operators' self host time), api (runtime/driver calls: count and host time), call (host time
                      of the call, device busy time, GPU idle time between its first and last kernel) and sync (host
                      waits and the GPU idle gap each one leaves)
    survey            the seq2seq phases, reference and lab model, at the decoder's batch sizes
    wall_times        wall-clock time of a call, synchronised, without the profiler (greedy decode with and without
                      the per-step stop check: what a sync on the critical path costs)
    dispatch_ladder   host time (and device time) per call from an empty Python call up to F.linear, under autograd,
                      no_grad, inference_mode and as a CUDA graph replay: the layers' costs by difference
    dispatch_tree     one F.linear call as the profiler nests it: operators, runtime calls, the kernel
    predicted_launches  grid and block that PyTorch's source computes for cat and index_select at the model's shapes,
                      to hold against the measured ones
    gemv_compare      fc_out at batch 1: F.linear (cuBLAS) against the lab's GEMV, kernels and times

All of it runs on a machine without a GPU too: the CPU trace has operators only (no kernels, no runtime calls), and the
functions say so. Host times read from a profiled run include the profiler's own overhead; the ladder and
`wall_times` time without it.
"""
from __future__ import annotations

import contextlib
import json
import math
import re
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity

from .. import build, env, registry, results
from ..kernels import gru as kgru
from ..kernels import linear as klin
from ..models.seq2seq import Config, LabSeq2Seq, Seq2Seq, build_model, random_src
from ..plot import save_figure   # (lab.plot picks matplotlib's backend: Agg outside a notebook)
from ..timing import capture_graph, flush_l2, time_cuda

SURVEY = "survey.csv"
COLUMNS = ["section", "model", "phase", "batch", "top_op", "op", "kernel", "api", "category", "depth", "calls",
           "host_us", "device_us", "span_us", "idle_us", "elements", "grid", "block", "stream", "regs", "smem",
           "blocks_per_sm", "warps_per_sm", "occupancy_pct", "note",
           "device", "device_name", "torch", "cuda", "commit", "timestamp", "run_id"]
NUMERIC = {"batch", "depth", "calls", "host_us", "device_us", "span_us", "idle_us", "elements", "stream", "regs",
           "smem",
           "blocks_per_sm", "warps_per_sm", "occupancy_pct"}
LABEL = "survey::call"           # the record_function scope around each profiled call
DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
API_CATS = ("cuda_runtime", "cuda_driver")
NO_OP = "(no aten op)"           # a launch outside every ATen operator: a lab binding's, or a graph replay's
KERNELS = "(kernels)"            # the api view's row of device events per call
CPU_NOTE = ("no GPU: the CPU trace has operators only (no kernels, no launch configurations, no CUDA runtime calls); "
            "the tables below show host time")


# =================================================================================================================
# The trace
# =================================================================================================================
def profile_trace(fn: Callable[[], object], device, reps: int = 3, warmup: int = 2,
                  setup: Callable[[], object] | None = None) -> dict:
    """torch.profiler over `reps` calls of fn, each inside a record_function(LABEL) scope; returns the Chrome trace
    (dict). The GPU is synchronised before and after each call, outside the scope, so a call's runtime calls are the
    ones inside its window and no call overlaps the next. setup() runs before each call, outside the window."""
    cuda = torch.device(device).type == "cuda"
    for _ in range(warmup):
        if setup is not None:
            setup()
        fn()
    if cuda:
        torch.cuda.synchronize()
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with torch.profiler.profile(activities=acts, record_shapes=True) as prof:
        for _ in range(reps):
            if setup is not None:
                setup()
            if cuda:
                torch.cuda.synchronize()
            with torch.profiler.record_function(LABEL):
                fn()
            if cuda:
                torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "trace.json"
        prof.export_chrome_trace(str(path))
        trace = json.loads(path.read_text())
    trace["survey_reps"] = reps
    return trace


def _end(e: dict) -> float:
    return e["ts"] + e.get("dur", 0.0)


def _args(e: dict) -> dict:
    return e.get("args") or {}


@dataclass
class Trace:
    """A Chrome trace split by kind; each event keeps its dict, annotated with '_top' (its outermost enclosing
    operator's name, for cpu_ops), '_parent' (index of the enclosing cpu_op or -1) and '_win' (the index of the
    profiled call it belongs to, or None)."""
    reps: int
    windows: list[dict]                      # the LABEL scopes, in time order
    ops: list[dict]                          # cpu_op
    device: list[dict]                       # kernel, gpu_memcpy, gpu_memset
    api: list[dict]                          # cuda_runtime, cuda_driver
    by_ext: dict = field(default_factory=dict)    # External id -> cpu_op or user_annotation
    api_by_corr: dict = field(default_factory=dict)

    def window_of(self, ts: float) -> int | None:
        for i, w in enumerate(self.windows):
            if w["ts"] <= ts <= _end(w):
                return i
        return None

    def launcher(self, d: dict) -> dict | None:
        """The cpu_op (or scope) that launched device event d: its External id, else its launch call's."""
        e = self.by_ext.get(_args(d).get("External id"))
        if e is None:
            rt = self.api_by_corr.get(_args(d).get("correlation"))
            if rt is not None:
                e = self.by_ext.get(_args(rt).get("External id"))
        return e

    def launch_call(self, d: dict) -> dict | None:
        return self.api_by_corr.get(_args(d).get("correlation"))

    def device_window(self, d: dict) -> int | None:
        """The profiled call that launched device event d (by its launch call's time, else its operator's)."""
        rt = self.launch_call(d)
        if rt is not None:
            return rt["_win"]
        op = self.launcher(d)
        return op.get("_win") if op is not None else None


def parse(trace: dict, reps: int | None = None) -> Trace:
    """Split a Chrome trace (dict with 'traceEvents') into a Trace; `reps` defaults to the trace's 'survey_reps', else
    the number of LABEL windows."""
    evs = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "ts" in e]
    windows = sorted((e for e in evs if e.get("cat") == "user_annotation" and e.get("name") == LABEL),
                     key=lambda e: e["ts"])
    tr = Trace(reps=reps or trace.get("survey_reps") or max(len(windows), 1), windows=windows,
               ops=[e for e in evs if e.get("cat") == "cpu_op"],
               device=[e for e in evs if e.get("cat") in DEVICE_CATS],
               api=[e for e in evs if e.get("cat") in API_CATS])
    for e in evs:
        if e.get("cat") in ("cpu_op", "user_annotation") and "External id" in _args(e):
            tr.by_ext[_args(e)["External id"]] = e
    for e in tr.api:
        tr.api_by_corr[_args(e).get("correlation")] = e
    for e in tr.ops + tr.api:
        e["_win"] = tr.window_of(e["ts"])
    # nesting of the operators, per host thread: a sweep over start times keeps the stack of open operators
    by_tid: dict = {}
    for i, e in enumerate(tr.ops):
        by_tid.setdefault(e.get("tid"), []).append(i)
    for idx in by_tid.values():
        idx.sort(key=lambda i: (tr.ops[i]["ts"], -tr.ops[i].get("dur", 0.0)))
        stack: list[int] = []
        for i in idx:
            e = tr.ops[i]
            while stack and _end(tr.ops[stack[-1]]) <= e["ts"]:
                stack.pop()
            e["_parent"] = stack[-1] if stack else -1
            e["_top"] = tr.ops[stack[0]]["name"] if stack else e["name"]
            stack.append(i)
    return tr


# =================================================================================================================
# Names, shapes, launch configurations
# =================================================================================================================
_GENERIC = ("vectorized_elementwise_kernel", "elementwise_kernel", "unrolled_elementwise_kernel",
            "elementwise_kernel_with_index", "reduce_kernel")
_WRAPPERS = {"AUnaryFunctor", "BUnaryFunctor", "BinaryFunctor", "func_wrapper_t", "ReduceOp", "gpu_kernel_impl_nocast",
             "gpu_kernel_impl"}


def _skip_template(n: str, i: int) -> int:
    """Index just past the template argument list that opens at n[i] == '<'."""
    depth = 0
    for j in range(i, len(n)):
        depth += {"<": 1, ">": -1}.get(n[j], 0)
        if depth == 0:
            return j + 1
    return len(n)


def short_name(name: str) -> str:
    """A kernel's name without 'void', its return type, namespaces, template arguments and parameters. ATen's generic
    elementwise and reduction kernels keep their functor ('vectorized_elementwise_kernel[CUDAFunctor_add]'), a
    generic last component keeps its namespace ('gemvx::kernel'), cuBLAS's xmma GEMMs keep their tile size
    ('sm80_xmma_gemm..tilesize64x64x8', '..split_k' when split along K)."""
    n = name.replace("(anonymous namespace)::", "").strip()
    n = n[5:] if n.startswith("void ") else n
    if n.startswith("std::enable_if<"):                       # a SFINAE return type: skip it
        j = _skip_template(n, n.index("<"))
        n = n[j:].removeprefix("::type").strip()
    cut = min([i for i in (n.find("<"), n.find("(")) if i > 0] or [len(n)])
    parts = n[:cut].strip().split("::")
    base = parts[-1] or n
    if base in ("kernel", "Kernel") and len(parts) > 1:
        base = f"{parts[-2]}::{base}"
    m = re.search(r"tilesize\d+x\d+x\d+", base)
    if m and "gemm" in base:
        base = base[:base.index("gemm") + 4] + ".." + m.group(0) + ("..split_k" if "split_k" in base else "")
    if base in _GENERIC and "<" in n:
        names = re.findall(r"at::native::(?:\w+::)*?(\w+)", n[cut:])
        good = [x for x in names if x not in _WRAPPERS and (x.endswith(("Functor", "_kernel_cuda", "Ops"))
                                                             or x.startswith("CUDAFunctor"))]
        if good or names:
            base += f"[{(good or names)[0]}]"
    return base


def _dim3(v) -> str | None:
    if isinstance(v, (list, tuple)) and v:
        return "x".join(str(int(x)) for x in v)
    return None


def parse_dim3(s) -> tuple[int, ...] | None:
    """'128x2x1' (as survey.csv stores grid and block) -> (128, 2, 1)."""
    if not s:
        return None
    return tuple(int(x) for x in str(s).split("x"))


def _numel(shape) -> int:
    return math.prod(int(x) for x in shape) if shape else 1


def output_elements(op: str, dims) -> int | None:
    """Elements of the operator's output, from its input shapes (the profiler's 'Input Dims'), for the operators
    whose kernels the survey explains; None for others."""
    try:
        if op in ("aten::addmm",):                         # (bias, mat1 (M, K), mat2 (K, N))
            return int(dims[1][0]) * int(dims[2][1])
        if op in ("aten::mm",):                            # (mat1 (M, K), mat2 (K, N))
            return int(dims[0][0]) * int(dims[1][1])
        if op == "aten::gather":                           # (self, dim, index): the output has index's shape
            return _numel(dims[2])
        if op == "aten::cat":                              # (list of tensors, dim)
            return sum(_numel(s) for s in dims[0])
        if op == "aten::index_select":                     # (self (V, E...), dim, index (n,))
            return _numel(dims[2]) * _numel(dims[0][1:])
        if op == "aten::_cudnn_rnn":                       # (input (T, B, I), weights, stride, buf, hx (L, B, H), ...)
            return int(dims[0][0]) * int(dims[0][1]) * int(dims[4][-1])
    except (IndexError, TypeError, ValueError):
        return None
    return None


# =================================================================================================================
# One phase, four views
# =================================================================================================================
def _row(section: str, model: str, phase: str, batch: int, stamp: dict, **kw) -> dict:
    return {"section": section, "model": model, "phase": phase, "batch": batch, **kw, **stamp}


def kernel_rows(tr: Trace, model: str, phase: str, batch: int, stamp: dict) -> list[dict]:
    """op_kernels: each device event of the profiled calls under (outermost operator, launching operator), grouped
    by kernel and launch configuration; launches and device time per call."""
    agg: dict[tuple, dict] = {}
    for d in tr.device:
        if tr.device_window(d) is None:
            continue
        op = tr.launcher(d)
        if op is None or op.get("cat") != "cpu_op":
            top = name = NO_OP
            elements = None
        else:
            top, name = op["_top"], op["name"]
            elements = output_elements(name, _args(op).get("Input Dims"))
        a = _args(d)
        key = (top, name, d["name"], _dim3(a.get("grid")), _dim3(a.get("block")), a.get("registers per thread"),
               a.get("shared memory"), a.get("stream"))
        g = agg.setdefault(key, {"n": 0, "dur": 0.0, "elements": [], "cat": d.get("cat"), "a": a})
        g["n"] += 1
        g["dur"] += d.get("dur", 0.0)
        if elements is not None:
            g["elements"].append(elements)
    rows = []
    for (top, name, kname, grid, block, regs, smem, stream), g in agg.items():
        a = g["a"]
        rows.append(_row("op_kernels", model, phase, batch, stamp, top_op=top, op=name, kernel=kname,
                         category=g["cat"], calls=g["n"] / tr.reps, device_us=g["dur"] / tr.reps,
                         elements=statistics.mean(g["elements"]) if g["elements"] else None, grid=grid, block=block,
                         stream=stream, regs=regs, smem=smem, blocks_per_sm=a.get("blocks per SM"),
                         warps_per_sm=a.get("warps per SM"), occupancy_pct=a.get("est. achieved occupancy %")))
    total = {}
    for r in rows:
        total[r["top_op"]] = total.get(r["top_op"], 0.0) + r["device_us"]
    return sorted(rows, key=lambda r: (-total[r["top_op"]], r["top_op"], -r["device_us"]))


def host_rows(tr: Trace, model: str, phase: str, batch: int, stamp: dict) -> list[dict]:
    """op_host: each operator's self host time (its duration less its child operators') per call, under its
    outermost operator."""
    self_us = [e.get("dur", 0.0) for e in tr.ops]
    for e in tr.ops:
        if e.get("_parent", -1) >= 0:
            self_us[e["_parent"]] -= e.get("dur", 0.0)
    agg: dict[tuple, list] = {}
    for e, s in zip(tr.ops, self_us):
        if e.get("_win") is None:
            continue
        g = agg.setdefault((e["_top"], e["name"]), [0, 0.0])
        g[0] += 1
        g[1] += s
    rows = [_row("op_host", model, phase, batch, stamp, top_op=top, op=name, calls=n / tr.reps, host_us=t / tr.reps)
            for (top, name), (n, t) in agg.items()]
    total = {}
    for r in rows:
        total[r["top_op"]] = total.get(r["top_op"], 0.0) + r["host_us"]
    return sorted(rows, key=lambda r: (-total[r["top_op"]], r["top_op"], -r["host_us"]))


def api_rows(tr: Trace, model: str, phase: str, batch: int, stamp: dict) -> list[dict]:
    """api: runtime and driver calls inside the profiled calls' windows, count and host time per call, under the
    outermost operator that made them (NO_OP for calls outside every operator); plus one row (api = KERNELS) with
    the device events per call."""
    agg: dict[tuple, list] = {}
    for e in tr.api:
        if e.get("_win") is None:
            continue
        op = tr.by_ext.get(_args(e).get("External id"))
        top = op["_top"] if op is not None and op.get("cat") == "cpu_op" else NO_OP
        g = agg.setdefault((e["name"], e["cat"], top), [0, 0.0])
        g[0] += 1
        g[1] += e.get("dur", 0.0)
    rows = [_row("api", model, phase, batch, stamp, api=name, category=cat, top_op=top, calls=n / tr.reps,
                 host_us=t / tr.reps)
            for (name, cat, top), (n, t) in sorted(agg.items(), key=lambda kv: -kv[1][0])]
    dev = [d for d in tr.device if tr.device_window(d) is not None]
    if dev:
        rows.append(_row("api", model, phase, batch, stamp, api=KERNELS, category="device", calls=len(dev) / tr.reps,
                         device_us=sum(d.get("dur", 0.0) for d in dev) / tr.reps))
    return rows


def _busy(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of intervals."""
    total, cur_s, cur_e = 0.0, None, None
    for s, e in sorted(intervals):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total


SYNC_APIS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy")


def call_rows(tr: Trace, model: str, phase: str, batch: int, stamp: dict, note: str | None = None) -> list[dict]:
    """call: per profiled call, the host window, the device busy time (union of its device events), the span from its
    first device event's start to its last one's end and the GPU idle time inside that span (span - busy: launch
    gaps and sync bubbles), all averaged over the calls; and sync: the host waits inside the calls (count, host time)
    with the GPU idle gap each leaves (from the wait's end to the next device event's start)."""
    host, busy, span, idle, ndev = [], [], [], [], []
    for i, w in enumerate(tr.windows):
        dev = [(d["ts"], _end(d)) for d in tr.device if tr.device_window(d) == i]
        host.append(w.get("dur", 0.0))
        ndev.append(len(dev))
        if dev:
            b = _busy(dev)
            s = max(e for _, e in dev) - min(s for s, _ in dev)
            busy.append(b)
            span.append(s)
            idle.append(s - b)
    mean = lambda xs: statistics.mean(xs) if xs else None  # noqa: E731
    rows = [_row("call", model, phase, batch, stamp, calls=mean(ndev), host_us=mean(host), device_us=mean(busy),
                 span_us=mean(span), idle_us=mean(idle), note=note)]
    starts = sorted((d["ts"], tr.device_window(d)) for d in tr.device)
    syncs = [e for e in tr.api if e.get("_win") is not None and e["name"] in SYNC_APIS]
    gaps = []
    for e in syncs:
        # the GPU's next work after the wait: counted only if the same call launched it (a call's last sync, with
        # nothing after it, leaves no gap inside the call)
        nxt = next(((s, w) for s, w in starts if s >= _end(e)), None)
        if nxt is not None and nxt[1] == e["_win"]:
            gaps.append(nxt[0] - _end(e))
    rows.append(_row("sync", model, phase, batch, stamp, api=", ".join(sorted({e["name"] for e in syncs})) or None,
                     calls=len(syncs) / tr.reps, host_us=sum(e.get("dur", 0.0) for e in syncs) / tr.reps,
                     idle_us=sum(gaps) / tr.reps if syncs else None))
    return rows


def survey_phase(model: str, phase: str, fn: Callable[[], object], device, batch: int, reps: int = 3,
                 setup: Callable[[], object] | None = None, note: str | None = None) -> list[dict]:
    """Profile `reps` calls of fn and return their op_kernels, op_host, api, call and sync rows."""
    dev = torch.device(device)
    stamp = results.stamp(dev)
    for _ in range(2):                                    # warm-up outside the count: first calls fill the cache
        if setup is not None:
            setup()
        fn()
    seg0 = torch.cuda.memory_stats(dev).get("segment.all.allocated", 0) if dev.type == "cuda" else 0
    tr = parse(profile_trace(fn, dev, reps=reps, warmup=0, setup=setup))
    if dev.type == "cuda":
        segs = (torch.cuda.memory_stats(dev).get("segment.all.allocated", 0) - seg0) / reps
        note = "; ".join(x for x in (note, f"caching allocator: {segs:g} new segments (cudaMalloc) per call, "
                                            f"torch.cuda.memory_stats") if x)
    return (kernel_rows(tr, model, phase, batch, stamp) + host_rows(tr, model, phase, batch, stamp)
            + api_rows(tr, model, phase, batch, stamp) + call_rows(tr, model, phase, batch, stamp, note))


# =================================================================================================================
# The seq2seq phases
# =================================================================================================================
def greedy_with_stop_check(model: Seq2Seq, src: torch.Tensor, eos: int | None = None) -> torch.Tensor:
    """Seq2Seq.greedy plus the usual early exit: after each step, stop once every sentence has produced <eos>.
    `bool(done.all())` on a CUDA tensor copies one byte to the host and waits for the GPU (aten::is_nonzero ->
    aten::item -> aten::_local_scalar_dense: cudaMemcpyAsync + cudaStreamSynchronize), so the host cannot queue step
    t+1 before step t has finished. eos defaults to an id outside the vocabulary: the loop never exits early and does
    the same work as greedy(); the difference between the two is the sync alone. Returns tokens (steps, batch)."""
    cfg = model.cfg
    eos = cfg.tgt_vocab if eos is None else eos
    context = model.context(src)                                            # (1, batch, H)
    hidden = context
    tok = torch.full((src.shape[1],), cfg.sos, dtype=torch.long, device=src.device)
    done = torch.zeros(src.shape[1], dtype=torch.bool, device=src.device)
    toks = []
    for _ in range(cfg.max_len):
        logits, hidden = model.decoder(tok, hidden, context)
        tok = logits.argmax(1)
        toks.append(tok)
        done |= tok == eos
        if bool(done.all()):                                                # the host waits here, every step
            break
    return torch.stack(toks)


@dataclass
class Phase:
    model: str                  # "reference" or "lab"
    phase: str
    batch: int
    fn: Callable[[], object]
    setup: Callable[[], object] | None = None
    note: str | None = None


def phases(model: Seq2Seq, labm: LabSeq2Seq, device, batch: int, step_batches=(1,)) -> list[Phase]:
    """What the survey profiles: a teacher-forced forward, the encoder alone, one decoder step (eager, replayed from a CUDA graph, and
    between two CUDA events as the lab's timer records it), and a greedy decode (with and without a stop check), for
    the reference model and the lab model; the decoder step also at each of step_batches; on the GPU a forward
    after torch.cuda.empty_cache() (the caching allocator calls cudaMalloc again)."""
    dev = torch.device(device)
    cuda = dev.type == "cuda"
    cfg = model.cfg
    out: list[Phase] = []
    src = random_src(cfg, batch, dev)
    g = torch.Generator().manual_seed(1)
    trg = torch.randint(0, cfg.tgt_vocab, (cfg.max_len, batch), generator=g).to(dev)   # (max_len, batch)
    out += [Phase("reference", "forward", batch, lambda: model(src, trg)),
            Phase("lab", "forward", batch, lambda: labm.forward(src, trg)),
            Phase("reference", "encoder", batch, lambda: model.encoder(src)),
            Phase("lab", "encoder", batch, lambda: labm.encode(src))]
    if cuda:
        out.append(Phase("reference", "forward, cold allocator", batch, lambda: model(src, trg),
                         setup=torch.cuda.empty_cache, note="torch.cuda.empty_cache() before each call"))
    for b in sorted(set(step_batches) | {batch}):
        tokens = torch.randint(0, cfg.tgt_vocab, (b,), generator=g).to(dev)
        hidden = (torch.randn(1, b, cfg.hidden, generator=g) * 0.5).to(dev)         # (1, b, H)
        context = (torch.randn(1, b, cfg.hidden, generator=g) * 0.5).to(dev)
        st = labm.start(context[0])
        st.h.copy_(hidden[0])
        ref_step = (lambda t=tokens, h=hidden, c=context: model.decoder(t, h, c))
        lab_step = (lambda s=st, t=tokens: labm.step(s, tokens=t))
        out += [Phase("reference", "decoder step", b, ref_step), Phase("lab", "decoder step", b, lab_step)]
        if cuda:
            out += [Phase("reference", "decoder step, graph replay", b, capture_graph(ref_step).replay),
                    Phase("lab", "decoder step, graph replay", b, capture_graph(lab_step).replay)]
            if b == batch:
                ev = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                out.append(Phase("reference", "decoder step, between CUDA events", b,
                                 lambda f=ref_step: (ev[0].record(), f(), ev[1].record()),
                                 note="as lab.timing.time_cuda records a repetition"))
    out += [Phase("reference", "greedy decode", batch, lambda: model.greedy(src)),
            Phase("reference", "greedy decode, stop check", batch, lambda: greedy_with_stop_check(model, src),
                  note="bool(done.all()) after every step; eos never produced, so the same steps as greedy decode"),
            Phase("lab", "greedy decode", batch, lambda: labm.greedy(src))]
    return out


def survey(device, batch: int | None = None, step_batches=(1,), cfg: Config = Config(), reps: int = 3,
           record_rows: bool = True, model: Seq2Seq | None = None) -> list[dict]:
    """Every phase of `phases`, profiled (survey_phase), fp32 without TF32, under no_grad. batch defaults to 128 on
    the GPU, 2 on the CPU. Appends the rows to results/<device>/survey.csv unless record_rows is False."""
    dev = torch.device(device)
    batch = batch or (128 if dev.type == "cuda" else 2)
    if dev.type != "cuda":
        print(f"[lab] {CPU_NOTE}", flush=True)
    model = model or build_model(cfg, dev)
    rows: list[dict] = []
    with torch.no_grad(), kgru.precision(tf32=False):
        labm = LabSeq2Seq.from_model(model)
        for p in phases(model, labm, dev, batch, step_batches):
            rows += survey_phase(p.model, p.phase, p.fn, dev, p.batch, reps=reps, setup=p.setup, note=p.note)
    if record_rows:
        record(rows)
    return rows


@build.frozen()   # its own host-time loops and profiled calls go through the wrappers: no file check there
def wall_times(device, batch: int | None = None, cfg: Config = Config(), reps: int = 30,
               record_rows: bool = True, model: Seq2Seq | None = None) -> list[dict]:
    """Wall-clock time of a greedy decode, call to GPU idle (perf_counter around the call and a synchronize), median
    of reps, no profiler: the reference, the reference with the per-step stop check, and the lab model, taken in
    turns (one call of each per round) so that a drift of clocks or load touches all three alike."""
    dev = torch.device(device)
    batch = batch or (128 if dev.type == "cuda" else 2)
    model = model or build_model(cfg, dev)
    src = random_src(cfg, batch, dev)
    stamp = results.stamp(dev)
    rows = []
    with torch.no_grad(), kgru.precision(tf32=False):
        labm = LabSeq2Seq.from_model(model)
        fns = {("reference", "greedy decode"): lambda: model.greedy(src),
               ("reference", "greedy decode, stop check"): lambda: greedy_with_stop_check(model, src),
               ("lab", "greedy decode"): lambda: labm.greedy(src)}
        times: dict[tuple, list[float]] = {k: [] for k in fns}
        for k, fn in fns.items():
            _host_times(fn, dev, 3, sync_each=True)                      # warm-up
        for _ in range(reps):
            for k, fn in fns.items():
                times[k] += _host_times(fn, dev, 1, sync_each=True, warmup=0)
        for (m, ph), ts in times.items():
            rows.append(_row("wall", m, ph, batch, stamp, host_us=statistics.median(ts),
                             note=f"median of {reps}, in turns, synchronised, no profiler"))
    if record_rows:
        record(rows)
    return rows


# =================================================================================================================
# The dispatcher: one call from Python to the kernel
# =================================================================================================================
def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _host_times(fn: Callable[[], object], dev: torch.device, reps: int, sync_each: bool = False,
                sync_every: int = 64, warmup: int = 10) -> list[float]:
    """Host time of each call in us (perf_counter_ns around fn()). sync_each: the GPU is waited for inside each timed
    call (wall time); otherwise every sync_every calls outside the timing, so the launch queue never fills."""
    for _ in range(warmup):
        fn()
    _sync(dev)
    out = []
    for i in range(reps):
        if not sync_each and i % sync_every == 0:
            _sync(dev)
        t0 = time.perf_counter_ns()
        fn()
        if sync_each:
            _sync(dev)
        out.append((time.perf_counter_ns() - t0) / 1e3)
    _sync(dev)
    return out


@dataclass
class Rung:
    name: str
    fn: Callable[[], object]
    mode: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext
    what: str = ""


def ladder_rungs(device, batch: int = 1, cfg: Config = Config()) -> list[Rung]:
    """From an empty Python call to F.linear at the decoder's fc_out shape ((batch, E + 2H) x (vocab, E + 2H)^T),
    each rung adding layers; on the GPU also the tiny op and F.linear replayed from a CUDA graph."""
    dev = torch.device(device)
    K, N = cfg.dec_emb + 2 * cfg.hidden, cfg.tgt_vocab
    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch, K, generator=g).to(dev)                          # (batch, E + 2H)
    w = (torch.randn(N, K, generator=g) * K ** -0.5).to(dev)                # (vocab, E + 2H), as nn.Linear stores it
    b = torch.randn(N, generator=g).to(dev)
    wt = w.t()                                                              # the view linear makes, made once
    wg, bg = w.clone().requires_grad_(), b.clone().requires_grad_()
    one, two = torch.ones(1, device=dev), torch.ones(1, device=dev)
    rungs = [
        Rung("python call", lambda: None, what="the interpreter's call of an empty lambda"),
        Rung("torch.empty(0)", lambda: torch.empty(0, device=dev), torch.inference_mode,
             "binding, dispatcher, a tensor of 0 bytes: no kernel"),
        Rung("tiny add", lambda: torch.add(one, two), torch.inference_mode,
             "+ TensorIterator, a cached allocation, one elementwise kernel (1 element)"),
        Rung("torch.addmm", lambda: torch.addmm(b, x, wt), torch.inference_mode,
             "the matrix product alone: addmm's dispatch and cuBLAS"),
        Rung("F.linear, inference_mode", lambda: F.linear(x, w, b), torch.inference_mode,
             "+ linear's decomposition (aten::linear -> aten::t + aten::addmm)"),
        Rung("F.linear, no_grad", lambda: F.linear(x, w, b), torch.no_grad,
             "+ the Autograd dispatch keys (skipped under inference_mode)"),
        Rung("F.linear, recording autograd", lambda: F.linear(x, wg, bg), torch.enable_grad,
             "+ an AddmmBackward0 node recorded for every call"),
    ]
    if dev.type == "cuda":
        with torch.inference_mode():
            g_add = capture_graph(lambda: torch.add(one, two))
            g_lin = capture_graph(lambda: F.linear(x, w, b))
        rungs.insert(3, Rung("tiny add, graph replay", g_add.replay, what="one cudaGraphLaunch instead"))
        rungs.append(Rung("F.linear, graph replay", g_lin.replay, what="the same kernels from one cudaGraphLaunch"))
    return rungs


@build.frozen()   # its own host-time loops and profiled calls go through the wrappers: no file check there
def dispatch_ladder(device, batch: int = 1, cfg: Config = Config(), reps: int = 2000, record_rows: bool = True
                    ) -> list[dict]:
    """Per rung: host time per call (median of reps, perf_counter, no profiler), device time (GPU: CUDA events,
    lab.timing.time_cuda, L2 flushed; for rungs that launch kernels), and from one profiled run the kernels and
    runtime calls per call."""
    dev = torch.device(device)
    stamp = results.stamp(dev)
    if dev.type == "cuda":
        flush_l2(dev)     # the flush buffer made here, outside inference_mode (an inference tensor can't be refilled)
    rows = []
    for r in ladder_rungs(dev, batch, cfg):
        with r.mode():
            host = statistics.median(_host_times(r.fn, dev, reps))
            tr = parse(profile_trace(r.fn, dev, reps=10))
            kernels = [d for d in tr.device if tr.device_window(d) is not None]
            dev_us = time_cuda(r.fn, flush=True).median_us if dev.type == "cuda" and kernels else None
        calls: dict[str, int] = {}
        for e in tr.api:
            if e.get("_win") is not None:
                calls[e["name"]] = calls.get(e["name"], 0) + 1
        ops = sorted({e["name"] for e in tr.ops if e.get("_win") is not None})
        rows.append(_row("ladder", "-", r.name, batch, stamp, host_us=host, device_us=dev_us,
                         calls=len(kernels) / tr.reps,
                         kernel="; ".join(sorted({short_name(d["name"]) for d in kernels})) or None,
                         api="; ".join(f"{k} x{v / tr.reps:g}" for k, v in sorted(calls.items())) or None,
                         op="; ".join(ops) or None, note=r.what))
    if record_rows:
        record(rows)
    return rows


def dispatch_tree(device, batch: int = 1, cfg: Config = Config(), record_rows: bool = True) -> list[dict]:
    """One F.linear call at fc_out's shape, under no_grad, as the profiler nests it (the last of three profiled
    calls): operators and runtime/driver calls in host order with their depth and host time, each launch followed by
    the device events it started (device time, launch configuration)."""
    dev = torch.device(device)
    stamp = results.stamp(dev)
    rung = next(r for r in ladder_rungs(dev, batch, cfg) if r.name == "F.linear, no_grad")
    with rung.mode():
        tr = parse(profile_trace(rung.fn, dev, reps=3))
    last = len(tr.windows) - 1
    host = sorted((e for e in tr.ops + tr.api if e.get("_win") == last), key=lambda e: (e["ts"], -e.get("dur", 0)))
    launched: dict = {}
    for d in tr.device:
        rt = tr.launch_call(d)
        if rt is not None:
            launched.setdefault(id(rt), []).append(d)
    rows, stack = [], []
    for e in host:
        while stack and _end(stack[-1]) <= e["ts"]:
            stack.pop()
        rows.append(_row("tree", "-", "F.linear, no_grad", batch, stamp, depth=len(stack), op=e["name"],
                         category=e["cat"], host_us=e.get("dur", 0.0)))
        for d in launched.get(id(e), []):
            a = _args(d)
            rows.append(_row("tree", "-", "F.linear, no_grad", batch, stamp, depth=len(stack) + 1, op=d["name"],
                             kernel=d["name"], category=d["cat"], device_us=d.get("dur", 0.0),
                             grid=_dim3(a.get("grid")), block=_dim3(a.get("block")),
                             regs=a.get("registers per thread"), smem=a.get("shared memory")))
        stack.append(e)
    if record_rows:
        record(rows)
    return rows


# =================================================================================================================
# Launch configurations PyTorch's sources compute, and the lab's GEMV beside cuBLAS
# =================================================================================================================
def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def cat_launch(shapes: list[tuple[int, ...]], sm_count: int, elem_bytes: int = 4) -> tuple[tuple, tuple]:
    """aten/src/ATen/native/cuda/Shape.cu, parallel_cat, contiguous 16-byte-aligned inputs (getCatGridContig): 128
    threads a block, each thread one 16-byte vector per grid-stride step; grid.x = min(ceil(ceil(max_elements /
    (16 / elem_bytes)) / 128), 32 x SMs), grid.y = the number of inputs (blockIdx.y picks the input tensor)."""
    per_thread = 16 // elem_bytes
    blocks = min(_ceil(_ceil(max(_numel(s) for s in shapes), per_thread), 128), 32 * sm_count)
    return (blocks, len(shapes), 1), (128, 1, 1)


def gather_launch(num_indices: int, row_bytes: int, max_grid_y: int = 65535) -> tuple[tuple, tuple]:
    """aten/src/ATen/native/cuda/IndexKernelUtils.cu, vectorized_gather_kernel_launch<16> (the fast path of gather in
    ScatterGatherKernel.cu: rows gathered along dim 0, contiguous, 16-byte aligned): one block per index
    (blockIdx.x picks the row to copy), each thread one 16-byte vector of it; block = min(256, ceil(row_bytes / 16)
    rounded up to a warp), grid = (num_indices, min(ceil(row_bytes / (256 x 16)), max grid y), 1)."""
    threads = _ceil(_ceil(row_bytes, 16), 32) * 32
    return (num_indices, min(_ceil(row_bytes, 256 * 16), max_grid_y), 1), (min(256, threads), 1, 1)


def index_select_small_launch(row: int, sm_count: int) -> tuple[tuple, tuple]:
    """aten/src/ATen/native/cuda/Indexing.cu, index_select_out_cuda_impl with at most 16 indices:
    indexSelectSmallIndex, grid min(ceil(row / 128), 8 x SMs), block min(row, 128): each thread owns elements of a
    row and walks all the indices, copying its elements of each selected row (the index list is read once per
    thread, not once per element)."""
    return (min(_ceil(row, 128), 8 * sm_count), 1, 1), (min(row, 128), 1, 1)


def predicted_launches(cfg: Config, batch: int, sm_count: int) -> list[dict]:
    """The reference model's cat and embedding launches as PyTorch's sources compute them, per phase: {phase, batch,
    what, op, kernel, grid, block}. The embedding (float32 rows) is index_select's own kernel up to 16 indices
    (index_select_small_launch) and gather's vectorized kernel beyond (gather_launch), as torch 2.11 runs it."""
    E, H, V = cfg.dec_emb, cfg.hidden, cfg.tgt_vocab
    out = []

    def add(phase, b, what, op, kernel, grid, block):
        out.append({"phase": phase, "batch": b, "what": what, "op": op, "kernel": kernel,
                    "grid": "x".join(map(str, grid)), "block": "x".join(map(str, block))})

    for b in sorted({1, batch}):
        if b <= 16:
            add("decoder step", b, "embedding of the step's tokens", "aten::index_select", "indexSelectSmallIndex",
                *index_select_small_launch(E, sm_count))
        else:
            add("decoder step", b, "embedding of the step's tokens", "aten::gather", "vectorized_gather_kernel",
                *gather_launch(b, 4 * E))
        add("decoder step", b, "cat(embedded, context), dim 2", "aten::cat", "CatArrayBatchedCopy",
            *cat_launch([(1, b, E), (1, b, H)], sm_count))
        add("decoder step", b, "cat(embedded, hidden, context), dim 1", "aten::cat", "CatArrayBatchedCopy",
            *cat_launch([(b, E), (b, H), (b, H)], sm_count))
    add("forward", batch, "encoder embedding of the source", "aten::gather", "vectorized_gather_kernel",
        *gather_launch(cfg.src_len * batch, 4 * cfg.enc_emb))
    add("forward", batch, f"stack of the {cfg.max_len} steps' logits", "aten::cat", "CatArrayBatchedCopy",
        *cat_launch([(1, batch, V)] * cfg.max_len, sm_count))
    return out


def check_predictions(pred: list[dict], rows: list[dict]) -> list[dict]:
    """Each prediction with the measured launch configurations of the same operator, phase and batch (reference
    model) and whether one of them matches grid and block."""
    out = []
    for p in pred:
        meas = [r for r in rows if r["section"] == "op_kernels" and r["model"] == "reference"
                and r["phase"] == p["phase"] and int(r["batch"]) == p["batch"] and r["op"] == p["op"]
                and p["kernel"] in (r["kernel"] or "")]
        seen = sorted({(r["grid"], r["block"]) for r in meas})
        out.append({**p, "measured": ", ".join(f"{g} / {b}" for g, b in seen) or "-",
                    "match": any(g == p["grid"] and b == p["block"] for g, b in seen)})
    return out


@build.frozen()   # its own host-time loops and profiled calls go through the wrappers: no file check there
def gemv_compare(device, batch: int = 1, cfg: Config = Config(), record_rows: bool = True) -> list[dict]:
    """fc_out at `batch` rows: F.linear (cuBLAS: at one row the cublasLt bias path is refused and the bias is copied
    into the output before a GEMV with beta = 1) against the lab's default version for this shape (lab.kernels.
    linear: the GEMV at a few rows). Per model: the kernels (op_kernels rows) and a device time (CUDA events, L2
    flushed, section 'gemv'). GPU only."""
    dev = torch.device(device)
    if dev.type != "cuda":
        print("[lab] gemv_compare: GPU only (the lab's GEMV is a CUDA kernel)", flush=True)
        return []
    stamp = results.stamp(dev)
    K, N = cfg.dec_emb + 2 * cfg.hidden, cfg.tgt_vocab
    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch, K, generator=g).to(dev)
    w = (torch.randn(N, K, generator=g) * K ** -0.5).to(dev)
    b = torch.randn(N, generator=g).to(dev)
    flush_l2(dev)         # the flush buffer made here, outside inference_mode (an inference tensor can't be refilled)
    rows = []
    with torch.inference_mode(), kgru.precision(tf32=False):
        for name, fn in (("cuBLAS (F.linear)", lambda: F.linear(x, w, b)),
                         ("lab GEMV", lambda: klin.linear(x, w, b))):
            tr = parse(profile_trace(fn, dev, reps=5))
            rows += kernel_rows(tr, name, "fc_out", batch, stamp)
            rows.append(_row("gemv", name, "fc_out", batch, stamp, device_us=time_cuda(fn, flush=True).median_us,
                             note="CUDA events, L2 flushed (weights from HBM)"))
    if record_rows:
        record(rows)
    return rows


# =================================================================================================================
# The table: record, read back, print
# =================================================================================================================
def record(rows: list[dict]) -> Path | None:
    """Append rows to results/<their device>/survey.csv."""
    return results.append(rows, columns=COLUMNS, name=SURVEY) if rows else None


def load(device_name: str | None = None, latest: bool = True) -> list[dict]:
    """Rows of results/<device>/survey.csv (default: this machine's default device); latest: for each (section,
    model, phase, batch), only the rows of the newest run that recorded it."""
    path = results.table_path(device_name or env.device_name(env.default_device()), SURVEY)
    rows = results.read(path, numeric=NUMERIC)
    if not latest:
        return rows
    newest: dict[tuple, tuple] = {}
    for r in rows:
        k = (r["section"], r["model"], r["phase"], r["batch"])
        v = (r["timestamp"] or "", r["run_id"] or "")
        newest[k] = max(newest.get(k, v), v)
    return [r for r in rows if (r["timestamp"] or "", r["run_id"] or "") ==
            newest[(r["section"], r["model"], r["phase"], r["batch"])]]


def _select(rows, section, **where) -> list[dict]:
    return [r for r in rows if r["section"] == section and all(
        (r.get(k) == v) or (k == "batch" and r.get(k) is not None and int(r[k]) == int(v)) for k, v in where.items())]


def _fmt(v, spec: str = ".1f") -> str:
    if v is None or v == "":
        return "-"
    if isinstance(v, float):
        return format(v, spec) if not float(v).is_integer() or spec != "g" else str(int(v))
    return str(v)


def _clip(s, n: int) -> str:
    s = str(s)
    return s if len(s) <= n else s[: n - 1] + "…"


def format_host(rows: list[dict], model: str, phase: str, batch: int, per_top: int = 5) -> str:
    """The operators' self host time per call, under their outermost operator (the `per_top` largest of each)."""
    host = _select(rows, "op_host", model=model, phase=phase, batch=batch)
    if not host:
        return f"{model} / {phase} / batch {batch}: no rows"
    lines = [f"{model} / {phase} / batch {batch}: self host time per call (profiled)",
             f"{'outermost operator':<24} {'operator':<28} {'calls':>7} {'self host us':>13}"]
    shown: dict[str, int] = {}
    for r in host:
        shown[r["top_op"]] = shown.get(r["top_op"], 0) + 1
        if shown[r["top_op"]] <= per_top:
            lines.append(f"{_clip(r['top_op'], 24):<24} {_clip(r['op'], 28):<28} {_fmt(r['calls'], 'g'):>7} "
                         f"{_fmt(r['host_us']):>13}")
    more = sum(max(0, n - per_top) for n in shown.values())
    if more:
        lines.append(f"({more} smaller rows not shown; all of them are in survey.csv)")
    return "\n".join(lines)


def format_kernels(rows: list[dict], model: str, phase: str, batch: int, width: int = 46,
                   top_op: str | None = None) -> str:
    """The operator -> kernel table of one phase: outermost operator, launching operator, kernel (short name),
    launches and device time per call, grid, block, registers per thread, shared memory, occupancy, elements per
    thread (the launching operator's output elements / threads launched). top_op: that outermost operator's rows
    only. Without kernels (a CPU run): the operators' self host time instead, said so."""
    rs = _select(rows, "op_kernels", model=model, phase=phase, batch=batch, **({"top_op": top_op} if top_op else {}))
    if not rs:
        return f"{CPU_NOTE}\n" + format_host(rows, model, phase, batch)
    lines = [f"{model} / {phase} / batch {batch}: per call",
             f"{'outermost op':<16} {'launching op':<20} {'kernel':<{width}} {'n':>5} {'us':>9} {'grid':>12} "
             f"{'block':>10} {'regs':>5} {'smem':>7} {'occ%':>5} {'el/thr':>7} {'strm':>4}"]
    for r in rs:
        el = None
        g, b = parse_dim3(r["grid"]), parse_dim3(r["block"])
        if r["elements"] and g and b:
            el = r["elements"] / (math.prod(g) * math.prod(b))
        lines.append(f"{_clip(r['top_op'], 16):<16} {_clip(r['op'], 20):<20} "
                     f"{_clip(short_name(r['kernel']), width):<{width}} {_fmt(r['calls'], 'g'):>5} "
                     f"{_fmt(r['device_us']):>9} {_fmt(r['grid']):>12} {_fmt(r['block']):>10} "
                     f"{_fmt(r['regs'], 'g'):>5} {_fmt(r['smem'], 'g'):>7} {_fmt(r['occupancy_pct'], 'g'):>5} "
                     f"{_fmt(el, '.2f'):>7} {_fmt(r['stream'], 'g'):>4}")
    tot = sum(r["device_us"] or 0 for r in rs)
    lines.append(f"{'':<16} {'total':<20} {'':<{width}} {_fmt(sum(r['calls'] for r in rs), 'g'):>5} {tot:>9.1f}")
    return "\n".join(lines)


def _api_totals(api: list[dict]) -> list[dict]:
    """api rows summed over their outermost operators: one row per API, most calls first."""
    tot: dict[str, dict] = {}
    for a in api:
        t = tot.setdefault(a["api"], {"api": a["api"], "calls": 0.0, "host_us": 0.0, "device_us": 0.0})
        for k in ("calls", "host_us", "device_us"):
            t[k] += a.get(k) or 0.0
    return sorted(tot.values(), key=lambda t: (t["api"] == KERNELS, -t["calls"]))


def format_api_by_op(rows: list[dict], model: str, phase: str, batch: int) -> str:
    """Which operator makes which runtime/driver calls in one phase: count and host time per call."""
    api = [a for a in _select(rows, "api", model=model, phase=phase, batch=batch) if a["api"] != KERNELS]
    if not api:
        return f"{model} / {phase} / batch {batch}: no CUDA runtime calls recorded"
    lines = [f"{model} / {phase} / batch {batch}: runtime and driver calls per call, by outermost operator",
             f"{'outermost operator':<24} {'call':<44} {'count':>8} {'host us':>9}"]
    for a in sorted(api, key=lambda a: (a["top_op"] or "", -a["calls"])):
        lines.append(f"{_clip(a['top_op'], 24):<24} {_clip(a['api'], 44):<44} {_fmt(a['calls'], 'g'):>8} "
                     f"{_fmt(a['host_us']):>9}")
    return "\n".join(lines)


def format_api(rows: list[dict], batch: int | None = None) -> str:
    """Runtime and driver calls per call of each phase (count, host us), kernels per call, and the call's host
    window, device busy time and GPU idle time."""
    calls = [r for r in rows if r["section"] == "call" and (batch is None or int(r["batch"]) == batch)]
    if not calls:
        return "no call rows"
    lines = []
    for c in calls:
        key = dict(model=c["model"], phase=c["phase"], batch=c["batch"])
        api = _api_totals(_select(rows, "api", **key))
        lines.append(f"{c['model']} / {c['phase']} / batch {int(c['batch'])}: host window {_fmt(c['host_us'])} us, "
                     f"device busy {_fmt(c['device_us'])} us, GPU idle between its kernels {_fmt(c['idle_us'])} us"
                     + (f"  [{c['note']}]" if c.get("note") else ""))
        if not api:
            lines.append("    (no CUDA runtime calls recorded)")
        for a in api:
            t = a["device_us"] if a["api"] == KERNELS else a["host_us"]
            lines.append(f"    {a['api']:<44} {_fmt(a['calls'], 'g'):>8} per call  "
                         f"{_fmt(t, '.1f'):>9} us {'on the GPU' if a['api'] == KERNELS else 'on the host'}")
    return "\n".join(lines)


def format_sync(rows: list[dict]) -> str:
    """Host waits per call (which API, count, host time) and the GPU idle gap they leave, next to the wall times, for
    the phases that wait or decode greedily; then the stop check's wall-time difference and, per greedy decode, the
    ratio of the host window to the device busy time."""
    lines = [f"{'model / phase':<44} {'batch':>5} {'waits':>6} {'host wait us':>13} {'GPU idle after us':>18} "
             f"{'wall us':>10}"]
    for s in _select(rows, "sync"):
        if not s["calls"] and "greedy" not in s["phase"]:
            continue                                      # no wait and no wall time: nothing to show
        w = _select(rows, "wall", model=s["model"], phase=s["phase"], batch=s["batch"])
        lines.append(f"{_clip(s['model'] + ' / ' + s['phase'], 44):<44} {int(s['batch']):>5} "
                     f"{_fmt(s['calls'], 'g'):>6} {_fmt(s['host_us']):>13} {_fmt(s['idle_us']):>18} "
                     f"{_fmt(w[0]['host_us'] if w else None):>10}" + (f"  {s['api']}" if s["api"] else ""))
    wall = {(r["model"], r["phase"], int(r["batch"])): r["host_us"] for r in _select(rows, "wall")}
    for (m, ph, b), t in wall.items():
        base = wall.get((m, ph.split(",")[0], b))
        if ph.endswith("stop check") and base:
            lines.append(f"\n{m} / {ph} / batch {b}: wall time {t - base:+.1f} us against {ph.split(',')[0]} "
                         f"({(t - base) / max(1, _n_steps(rows, m, ph, b)):+.2f} us per wait)")
    for c in _select(rows, "call"):
        if "greedy" in c["phase"] and c["device_us"]:
            lines.append(f"{c['model']} / {c['phase']} / batch {int(c['batch'])}: host window / device busy = "
                         f"{c['host_us'] / c['device_us']:.1f} (profiled; above 1: the host is the bottleneck)")
    return "\n".join(lines)


def _n_steps(rows: list[dict], model: str, phase: str, batch: int) -> float:
    s = _select(rows, "sync", model=model, phase=phase, batch=batch)
    return s[0]["calls"] if s and s[0]["calls"] else 0


LADDER_DELTAS = [
    ("binding + dispatcher + a tensor", "torch.empty(0)", "python call"),
    ("TensorIterator, allocation, one launch", "tiny add", "torch.empty(0)"),
    ("one launch from a graph instead", "tiny add, graph replay", "tiny add"),
    ("cuBLAS's heuristics and launch vs an elementwise launch", "torch.addmm", "tiny add"),
    ("linear's decomposition (aten::t, one more dispatch)", "F.linear, inference_mode", "torch.addmm"),
    ("the Autograd keys under no_grad", "F.linear, no_grad", "F.linear, inference_mode"),
    ("recording the autograd graph", "F.linear, recording autograd", "F.linear, no_grad"),
    ("graph replay vs eager F.linear", "F.linear, graph replay", "F.linear, no_grad"),
]


def format_ladder(rows: list[dict]) -> str:
    """The ladder's rungs (host and device time per call, kernels, runtime calls) and the layer costs as differences
    of host time between rungs."""
    rs = _select(rows, "ladder")
    if not rs:
        return "no ladder rows"
    lines = [f"{'rung':<30} {'host us':>9} {'device us':>10} {'kernels':>8}  runtime calls / kernel"]
    for r in rs:
        lines.append(f"{r['phase']:<30} {_fmt(r['host_us'], '.2f'):>9} {_fmt(r['device_us'], '.2f'):>10} "
                     f"{_fmt(r['calls'], 'g'):>8}  {r['api'] or '-'} / {r['kernel'] or '-'}")
    host = {r["phase"]: r["host_us"] for r in rs}
    lines.append("\nlayer cost = host time of one rung minus the rung below it:")
    for what, hi, lo in LADDER_DELTAS:
        if hi in host and lo in host:
            lines.append(f"  {what:<58} {host[hi] - host[lo]:+9.2f} us   ({hi} - {lo})")
    return "\n".join(lines)


def format_tree(rows: list[dict]) -> str:
    """The dispatch tree, indented by depth: host events with host time, device events with device time and
    launch configuration."""
    rs = _select(rows, "tree")
    lines = []
    for r in rs:
        pad = "  " * int(r["depth"] or 0)
        if r["category"] in DEVICE_CATS:
            lines.append(f"{pad}-> [GPU] {_clip(short_name(r['op']), 60)}  {_fmt(r['device_us'], '.2f')} us  "
                         f"grid {_fmt(r['grid'])} block {_fmt(r['block'])} regs {_fmt(r['regs'], 'g')} "
                         f"smem {_fmt(r['smem'], 'g')}")
        else:
            lines.append(f"{pad}{r['op']}  [{r['category']}]  {_fmt(r['host_us'], '.2f')} us")
    return "\n".join(lines) or "no tree rows"


def format_tiles(rows: list[dict], model: str, phase: str, batch: int) -> str:
    """The GEMM kernels whose names carry a tile size (cuBLAS's xmma kernels): tile, grid, blocks, the outputs the
    blocks cover (blocks x tile rows x tile columns), and for addmm/mm the operator's output elements and the
    ratio: 1 (rounded up to whole tiles) when each block owns an output tile, more when several blocks share a tile
    (the grid's z)."""
    lines = [f"{model} / {phase} / batch {batch}: GEMM tiles",
             f"{'outermost / launching op':<32} {'kernel':<40} {'n':>4} {'grid':>10} {'blocks':>7} "
             f"{'covered':>9} {'op outputs':>11} {'ratio':>6}"]
    for r in _select(rows, "op_kernels", model=model, phase=phase, batch=batch):
        m = re.search(r"tilesize(\d+)x(\d+)x\d+", r["kernel"] or "")
        g = parse_dim3(r["grid"])
        if not m or not g:
            continue
        blocks = math.prod(g)
        covered = blocks * int(m.group(1)) * int(m.group(2))
        outs = r["elements"] if r["op"] in ("aten::addmm", "aten::mm") else None
        lines.append(f"{_clip(r['top_op'] + ' / ' + r['op'], 32):<32} {_clip(short_name(r['kernel']), 40):<40} "
                     f"{_fmt(r['calls'], 'g'):>4} {r['grid']:>10} {blocks:>7} {covered:>9} {_fmt(outs, 'g'):>11} "
                     f"{_fmt(covered / outs if outs else None, '.2f'):>6}")
    return "\n".join(lines) if len(lines) > 2 else f"{model} / {phase} / batch {batch}: no tiled GEMM kernels"


def format_predictions(checked: list[dict]) -> str:
    lines = [f"{'phase':<14} {'batch':>5} {'what':<38} {'kernel':<22} {'predicted grid / block':>24}  "
             f"measured  match"]
    for p in checked:
        lines.append(f"{p['phase']:<14} {p['batch']:>5} {_clip(p['what'], 38):<38} {p['kernel']:<22} "
                     f"{p['grid'] + ' / ' + p['block']:>24}  {p['measured']}  {p['match']}")
    return "\n".join(lines)


def launch_pattern(rows: list[dict], model: str, phase: str, batch: int, top_op: str, steps: int) -> str:
    """How often each kernel under top_op launches per call, read against the number of time steps: once per call,
    once per step, or another count."""
    rs = _select(rows, "op_kernels", model=model, phase=phase, batch=batch, top_op=top_op)
    if not rs:
        return f"{model} / {phase} / batch {batch} / {top_op}: no kernels recorded"
    lines = [f"{model} / {phase} / batch {batch}: kernels under {top_op}, {steps} time steps"]
    for r in rs:
        n = r["calls"]
        how = "once per step" if abs(n - steps) < 1e-9 else "once per call" if abs(n - 1) < 1e-9 else f"{n:g} times"
        lines.append(f"  {_clip(short_name(r['kernel']), 60):<60} {how:<14} grid {_fmt(r['grid'])} block "
                     f"{_fmt(r['block'])} stream {_fmt(r['stream'], 'g')}")
    return "\n".join(lines)


# =================================================================================================================
# Figures, drawn from the recorded rows
# =================================================================================================================
def _empty_figure(rows: list[dict], text: str, name: str) -> Path:
    """A figure that says why there is nothing to draw (rows of a machine without a GPU)."""
    fig, ax = plt.subplots(figsize=(9, 1.6))
    ax.axis("off")
    ax.text(0.5, 0.5, "\n".join(text[i:i + 100] for i in range(0, len(text), 100)), ha="center", va="center",
            fontsize=9)
    dev = rows[0]["device_name"] if rows else None
    return save_figure(fig, name, device_name=dev)


def _stamp_text(rows: list[dict]) -> str:
    r = max(rows, key=lambda r: r["timestamp"] or "")
    return f"{r['device_name']} · torch {r['torch']} · CUDA {r['cuda']} · commit {r['commit']} · {r['timestamp']}"


def plot_operator_kernels(rows: list[dict] | None = None, phase: str = "forward", batch: int | None = None,
                          models=("reference", "lab"), top: int = 8, legend: int = 10,
                          name: str | None = None) -> Path:
    """Time per call of each outermost operator, stacked by kernel (device time, the op_kernels rows; on a machine
    without a GPU: self host time stacked by operator, the op_host rows), one panel per model: the `top` largest
    operators, the `legend` largest kernels of each panel named, the rest grey. Saved under results/<device>/plots/."""
    rows = load() if rows is None else rows
    sel = [r for r in rows if r["phase"] == phase and r["section"] in ("op_kernels", "op_host")
           and (batch is None or int(r["batch"]) == batch)]
    name = name or f"survey_ops_{re.sub(r'[^a-z0-9]+', '_', phase)}"
    if not sel:
        return _empty_figure(rows, f"no operator rows for phase {phase!r}", name)
    gpu = any(r["section"] == "op_kernels" for r in sel)
    section, value, part = ("op_kernels", "device_us", "kernel") if gpu else ("op_host", "host_us", "op")
    models = [m for m in models if any(r["model"] == m and r["section"] == section for r in sel)]
    fig, axes = plt.subplots(len(models), 1, figsize=(14, 2.2 + 0.45 * top * len(models)), squeeze=False)
    cmap = plt.get_cmap("tab20")
    colors: dict[str, tuple] = {}
    for ax, m in zip(axes[:, 0], models):
        rs = [r for r in sel if r["model"] == m and r["section"] == section]
        tot: dict[str, float] = {}
        for r in rs:
            tot[r["top_op"]] = tot.get(r["top_op"], 0.0) + (r[value] or 0.0)
        ops = sorted(tot, key=lambda k: -tot[k])[:top][::-1]
        left = {o: 0.0 for o in ops}
        name_of = (lambda r: short_name(r[part])) if part == "kernel" else (lambda r: r[part])  # noqa: E731
        by_label: dict[str, float] = {}
        for r in rs:
            by_label[name_of(r)] = by_label.get(name_of(r), 0.0) + (r[value] or 0.0)
        shown = set(sorted(by_label, key=lambda k: -by_label[k])[:legend])
        for r in sorted(rs, key=lambda r: -(r[value] or 0.0)):
            if r["top_op"] not in left:
                continue
            label = name_of(r) if name_of(r) in shown else "other"
            if label not in colors:
                colors[label] = cmap(len(colors) % 20) if label != "other" else (0.75, 0.75, 0.75, 1.0)
            ax.barh(r["top_op"], r[value] or 0.0, left=left[r["top_op"]], color=colors[label], edgecolor="white",
                    linewidth=0.5, label=label)
            left[r["top_op"]] += r[value] or 0.0
        b = int(rs[0]["batch"])
        ax.set_title(f"{m} model, {phase}, batch {b}: {sum(tot.values()):.0f} us per call "
                     f"({'device time of the kernels' if gpu else 'self host time of the operators'})", fontsize=9)
        ax.set_xlabel("us per call", fontsize=8)
        ax.tick_params(axis="y", labelsize=8)
        handles, labels = ax.get_legend_handles_labels()
        uniq = dict(zip(labels, handles))
        ax.legend(uniq.values(), [_clip(k, 44) for k in uniq], fontsize=7, loc="upper left",
                  bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    fig.suptitle(f"time per operator, stacked by {'kernel' if gpu else 'operator (no GPU)'}", fontsize=11)
    fig.text(0.01, 0.005, _stamp_text(sel), fontsize=7, color="0.35")
    fig.tight_layout(rect=(0, 0.02, 1, 1))
    return save_figure(fig, name, device_name=sel[0]["device_name"])


def plot_api_calls(rows: list[dict] | None = None, batch: int | None = None, top: int = 8,
                   name: str = "survey_runtime_calls") -> Path:
    """Runtime/driver calls per call of each phase, stacked by API (left), and the host time they take (right);
    kernels per call marked. On a machine without a GPU there are no such calls: the figure says so."""
    rows = load() if rows is None else rows
    api = [r for r in rows if r["section"] == "api" and r["api"] != KERNELS
           and (batch is None or int(r["batch"]) == batch)]
    if not api:
        return _empty_figure(rows, "no CUDA runtime calls recorded: " + CPU_NOTE.split(": ", 1)[-1], name)
    keys = []
    for r in api:
        k = (r["model"], r["phase"], int(r["batch"]))
        if k not in keys:
            keys.append(k)
    count: dict[str, float] = {}
    for r in api:
        count[r["api"]] = count.get(r["api"], 0.0) + r["calls"]
    names = sorted(count, key=lambda k: -count[k])[:top]
    for k in keys:                  # and each phase's costliest call on the host (a graph's cudaGraphLaunch, say)
        rs = [r for r in api if (r["model"], r["phase"], int(r["batch"])) == k]
        worst = max(rs, key=lambda r: r["host_us"] or 0.0)["api"]
        if worst not in names:
            names.append(worst)
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(15, 1.8 + 0.38 * len(keys)), sharey=True)
    labels = [f"{m} / {p} / b{b}" for m, p, b in keys][::-1]
    y = list(range(len(keys)))
    cmap = plt.get_cmap("tab10")
    for ax, value in ((a1, "calls"), (a2, "host_us")):
        left = [0.0] * len(keys)
        for i, n in enumerate(names + ["other"]):
            vals = []
            for k in keys[::-1]:
                rs = [r for r in api if (r["model"], r["phase"], int(r["batch"])) == k
                      and ((r["api"] == n) if n != "other" else r["api"] not in names)]
                vals.append(sum(r[value] or 0.0 for r in rs))
            ax.barh(y, vals, left=left, color=cmap(i % 10) if n != "other" else "0.7", label=n)
            left = [a + b for a, b in zip(left, vals)]
        if value == "calls":
            kern = []
            for k in keys[::-1]:
                kr = [r for r in rows if r["section"] == "api" and r["api"] == KERNELS
                      and (r["model"], r["phase"], int(r["batch"])) == k]
                kern.append(kr[0]["calls"] if kr else 0)
            ax.scatter(kern, y, marker="|", s=200, color="k", zorder=3, label="kernels on the GPU per call")
    a1.set_yticks(y, labels, fontsize=7)
    a1.set_xlabel("runtime/driver calls per call (stacked by API)", fontsize=8)
    a2.set_xlabel("host time in those calls per call, us (profiled)", fontsize=8)
    a2.legend(*a1.get_legend_handles_labels(), fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0),
              borderaxespad=0)
    fig.suptitle("what each phase asks of the CUDA runtime", fontsize=11)
    fig.text(0.01, 0.005, _stamp_text(api), fontsize=7, color="0.35")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    return save_figure(fig, name, device_name=api[0]["device_name"])


def plot_ladder(rows: list[dict] | None = None, name: str = "survey_dispatch_ladder") -> Path:
    """Host time (and device time, where measured) per call of each rung of the dispatch ladder."""
    rows = load() if rows is None else rows
    rs = _select(rows, "ladder")
    if not rs:
        return _empty_figure(rows, "no ladder rows", name)
    fig, ax = plt.subplots(figsize=(9, 1.2 + 0.35 * len(rs)))
    y = list(range(len(rs)))[::-1]
    ax.barh([v + 0.2 for v in y], [r["host_us"] or 0 for r in rs], height=0.4, color="C0", label="host, per call")
    ax.barh([v - 0.2 for v in y], [r["device_us"] or 0 for r in rs], height=0.4, color="C1",
            label="device (CUDA events, L2 flushed)")
    ax.set_yticks(y, [r["phase"] for r in rs], fontsize=8)
    ax.set_xlabel("us per call (median)", fontsize=8)
    ax.legend(fontsize=7)
    ax.set_title(f"from Python to the kernel: F.linear at fc_out's shape, batch {int(rs[0]['batch'])}", fontsize=10)
    fig.text(0.01, 0.005, _stamp_text(rs), fontsize=7, color="0.35")
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    return save_figure(fig, name, device_name=rs[0]["device_name"])


def redraw(device_name: str | None = None) -> Path | None:
    """Every survey figure of a device from its recorded rows (`lab plot` calls it through the gru family); None
    where the device has no survey rows."""
    rows = load(device_name)
    if not rows:
        return None
    first = plot_operator_kernels(rows, "forward")
    batches = sorted({int(r["batch"]) for r in rows if r["phase"] == "decoder step"})
    if batches:   # notebook 08 draws the step at its largest batch
        plot_operator_kernels(rows, "decoder step", batches[-1], name="survey_ops_decoder_step")
    plot_api_calls(rows)
    plot_ladder(rows)
    return first


registry.attach_plots(kgru.FAMILY, [lambda device_name: redraw(device_name)])
