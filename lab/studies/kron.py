"""python -m lab.kron [--dtype {f,d,bf16}] batch_size factor [factor ...] {check,profile,bench,tune}

kron's study: the original study's driver, on the lab's spine (the layer itself: lab/kernels/kron.py; the command
`python -m lab.kron` runs main() here through lab/kron.py). Factors are listed as
f_1 … f_K: `32 128 64` is a batch of 32 through W_2 ⊗ W_1 with W_1 128×128 (the fastest axis) and W_2 64×64.

  check     two stacked layers, forward and backward, with every implementation: the norm of each output (y), input
            gradient (g) and factor gradients (gW), then each pair's agreement, `torch_y == v1_y: True (3.1e-08)`, where
            the number is the relative error ||a - b|| / ||b|| and True means within the lab's tolerance for the dtype
  profile   --implementation NAME: torch.profiler table of one forward + backward of the two layers, and a Chrome
            trace under results/traces/ (open in chrome://tracing or ui.perfetto.dev)
  bench     the state size, the arithmetic intensity, and a torch.utils.benchmark.Compare table, one column per
            implementation, forward and forward + backward, in microseconds (CUDA events, L2 flushed per run)
  tune      (CUDA) time the default version's candidates for the dtype at this batch and factors, and record the
            fastest in the tuning table the default reads (lab.kernels.kron.tune_default); prints what it chose
  The tensor-core versions v3-v5 multiply in TF32 on float32 (torch.bmm.tf32 is their baseline) and in bf16 with
  --dtype bf16, forward and backward (cuda_src/kron/backward_tc.cu); --dtype bf16 runs the versions that take bfloat16
  (v3-v5, the torch baselines).

Implementations: the family's PyTorch baselines (the one that builds the N×N matrix only for N <= 16384), then its
kernels: cpu (C++) and the CUDA versions (lab.kernels.kron.TORCH_VERSIONS and KERNELS).
"""
from __future__ import annotations

import argparse
import contextlib
import math
import statistics
import sys
import time

import torch
from torch.utils.benchmark.utils.common import Measurement, TaskSpec

from .. import build, env, profile, verify
from ..kernels import kron as K
from ..timing import time_cuda, time_fn

FULL_MAX_N = 16384  # the full matrix is 4·N² bytes (1 GiB at N = 16384)


def implementations(device: torch.device, n: int, for_timing: bool = False) -> list[str]:
    """The baselines (the full-matrix one only up to FULL_MAX_N), then the kernels that run on `device` (and the C++
    version beside the CUDA ones when checking)."""
    out = [v for v in K.TORCH_VERSIONS if (n <= FULL_MAX_N or K.PYTORCH[v] is not K.kron_full)
           and (device.type == "cuda" or v != "torch.bmm.tf32")]
    if device.type == "cuda":
        out += _cuda_kernels() + ([] if for_timing else ["cpu"])
    else:
        out += ["cpu"]
    return out


def _cuda_kernels() -> list[str]:
    """The CUDA versions (every one has a backward)."""
    return [v for v in K.KERNELS if v != "cpu"]


def _takes(v: str, dtype) -> bool:
    """Whether implementation v takes tensors of `dtype` (the forward op's registry entry says)."""
    return K.OPS[0].version(v).supports(dtype)


def _layers(batch: int, sizes: tuple[int, ...], dtype, device, seed: int = 0):
    """x, dL/dy and the factors of two stacked layers (the same factorisation)."""
    g = torch.Generator().manual_seed(seed)
    shape = {"batch": batch, "factors": K.factors_label(sizes)}
    x, gy, *a = K.make_train_inputs(shape, dtype, device, g)
    _, *b = K.make_forward_inputs(shape, dtype, device, g)
    return x, gy, a, b


def two_layers(version: str, x, gy, a, b):
    """y = layer_b(layer_a(x)) and its gradients: (y, dL/dx, [dL/dW for a's factors, then b's])."""
    with torch.enable_grad(), K.train_precision(version):
        xr = x.detach().requires_grad_()
        ar = [w.detach().requires_grad_() for w in a]
        br = [w.detach().requires_grad_() for w in b]
        y = K.kron(K.kron(xr, ar, version), br, version)
        grads = torch.autograd.grad(y, [xr, *ar, *br], gy)
    return y.detach(), grads[0], list(grads[1:])


@contextlib.contextmanager
def autograd_on_the_calling_thread():
    """Autograd's CUDA backward on the caller's thread instead of the engine's device thread, for the duration
    (torch.autograd.set_multithreading_enabled(False): a process-wide switch, restored to what it was on exit)."""
    was = torch.autograd.is_multithreading_enabled()
    torch.autograd.set_multithreading_enabled(False)
    try:
        yield
    finally:
        torch.autograd.set_multithreading_enabled(was)


def autograd_floor(device="cuda", reps: int = 200) -> dict:
    """What autograd's engine costs the host for a backward of one tiny op (y = x * 2, 1024 floats): medians of
    `reps` calls of torch.autograd.grad, on the engine's device thread (the default) and on the calling thread
    (autograd_on_the_calling_thread). Keys: device_thread_us, calling_thread_us."""
    dev = torch.device(device)
    x = torch.randn(1024, device=dev, requires_grad=True)
    g = torch.ones(1024, device=dev)

    def timed() -> float:
        ts = []
        for i in range(reps + 10):
            y = x * 2
            torch.cuda.synchronize(dev)
            t0 = time.perf_counter()
            torch.autograd.grad(y, [x], g)
            if i >= 10:
                ts.append(1e6 * (time.perf_counter() - t0))
        return statistics.median(ts)
    device_thread = timed()
    with autograd_on_the_calling_thread():
        calling_thread = timed()
    return {"device_thread_us": device_thread, "calling_thread_us": calling_thread}


def eager_against_graph(version: str, dtype=torch.float32, batch: int = 1024, sizes="128x128", device="cuda",
                        budget_ms: float = 80.0, reps: int = 60) -> dict:
    """One training step of the layer (forward + backward through autograd, lab.kernels.kron._train: what
    KronLinear runs), timed eager and replayed from a CUDA graph, and what the eager step's host time is made of.

    Keys: eager_us and graph_us (lab.timing medians: a repetition is the larger of its GPU and host parts), ratio =
    eager / graph; eager_gpu_us, eager_host_us (the eager step's two parts); single_thread_us (eager, with autograd's
    backward on the calling thread: autograd_on_the_calling_thread); forward_host_us and grad_host_us (host time of
    the kron() call and of torch.autograd.grad, medians of `reps` steps issued while the GPU sleeps, so that
    neither waits for it). A part that was not measured is nan."""
    dev = torch.device(device)
    g = torch.Generator().manual_seed(0)
    x, gy, *ws = K.make_train_inputs({"batch": batch, "factors": K.factors_label(K.parse_factors(sizes))}, dtype,
                                     dev, g)
    step = K._train(version)
    call = lambda: step(x, gy, *ws)  # noqa: E731
    eager = time_cuda(call, budget_ms=budget_ms)
    graph = time_cuda(call, graph=True, budget_ms=budget_ms)
    with autograd_on_the_calling_thread():
        single = time_cuda(call, budget_ms=budget_ms)
    fwd, grad = [], []
    with build.frozen(), torch.enable_grad(), K.train_precision(version):
        for i in range(reps + 5):
            torch.cuda.synchronize()
            torch.cuda._sleep(3_000_000)   # ~1.5 ms of GPU work ahead of the step: nothing below waits for the GPU
            xr = x.detach().requires_grad_()
            fr = [w.detach().requires_grad_() for w in ws]
            t0 = time.perf_counter()
            y = K.kron(xr, fr, version)
            t1 = time.perf_counter()
            torch.autograd.grad(y, [xr, *fr], gy)
            t2 = time.perf_counter()
            if i >= 5:
                fwd.append(1e6 * (t1 - t0))
                grad.append(1e6 * (t2 - t1))
    torch.cuda.synchronize()
    # nan where a part is unknown: a step that blocks its host is timed host and GPU in series (lab.timing), no parts
    med = lambda v: statistics.median(v) if v else math.nan  # noqa: E731
    return {"version": version, "dtype": verify.dtype_name(dtype), "batch": batch, "eager_us": eager.median_us,
            "graph_us": graph.median_us, "ratio": eager.median_us / graph.median_us,
            "eager_gpu_us": med(eager.gpu_us), "eager_host_us": med(eager.host_us),
            "single_thread_us": single.median_us, "forward_host_us": med(fwd), "grad_host_us": med(grad)}


def cmd_check(args, sizes, dtype, device) -> int:
    n = math.prod(sizes)
    x, gy, a, b = _layers(args.batch_size, sizes, dtype, device)
    res, prec = {}, {}
    for v in implementations(device, n):
        if not _takes(v, dtype):
            continue
        if v in K.TENSOR_CORE or v == "torch.bmm.tf32":  # TF32 products on float32
            prec[v] = "tf32" if dtype == torch.float32 else None
        inputs = (x, gy, a, b) if v != "cpu" else (x.cpu(), gy.cpu(), [w.cpu() for w in a], [w.cpu() for w in b])
        y, g, gw = two_layers(v, *inputs)
        res[v] = {"y": y.double().cpu(), "g": g.double().cpu(), "gW": torch.cat([t.flatten() for t in gw]).double().cpu()}
    for v, r in res.items():
        for key, t in r.items():
            print(f"||{v}_{key}|| = {torch.linalg.vector_norm(t).item()!r}")
    names = list(res)
    bad = 0
    for i, v in enumerate(names):
        for w in names[i + 1:]:
            # a pair is held to the looser of its two precisions (TF32 against fp32: TF32's)
            tol = max(verify.tolerance(dtype, prec.get(v)), verify.tolerance(dtype, prec.get(w)))
            for key in ("y", "g", "gW"):
                if key not in res[v] or key not in res[w]:
                    continue
                c = verify.compare(res[w][key], res[v][key])
                ok = c.rel_err <= tol
                bad += not ok
                print(f"{v}_{key} == {w}_{key}: {ok} ({c.rel_err:.1e})")
    tf32 = (f", {verify.tolerance(dtype, 'tf32'):.0e} where one side multiplies in TF32"
            if "tf32" in prec.values() else "")
    print(f"(relative error ||a - b|| / ||b||; True: <= {verify.tolerance(dtype):.0e}, the lab's "
          f"{verify.dtype_name(dtype)} tolerance{tf32})")
    return 1 if bad else 0


def cmd_profile(args, sizes, dtype, device) -> int:
    default = "cpu" if device.type != "cuda" else "v5" if dtype == torch.bfloat16 else "v2"
    v = args.implementation or default
    if v not in implementations(device, math.prod(sizes)) or (v == "cpu" and device.type == "cuda"):
        sys.exit(f"--implementation {v} does not run here; choose from "
                 f"{', '.join(implementations(device, math.prod(sizes), for_timing=True))}")
    if not _takes(v, dtype):
        sys.exit(f"--implementation {v} does not take {verify.dtype_name(dtype)}")
    x, gy, a, b = _layers(args.batch_size, sizes, dtype, device)
    name = f"kron_{v}_{args.batch_size}x{K.factors_label(sizes)}_{verify.dtype_name(dtype)}_{device.type}"
    table, trace = profile.profile(lambda: two_layers(v, x, gy, a, b), name, device.type)
    print(table)
    print(f"trace: {trace}")
    return 0


def cmd_bench(args, sizes, dtype, device) -> int:
    n = math.prod(sizes)
    print(f"state size : {n}")
    print(f"AI         : {K.intensity(args.batch_size, sizes, dtype):.1e} FLOP/byte (forward: 2·B·N·Σf FLOP over "
          f"(2·B·N + Σf²)·{K.elem_size(dtype)} bytes)")
    x, gy, a, b = _layers(args.batch_size, sizes, dtype, device)
    flops = 2.0 * args.batch_size * n * sum(sizes)
    label = " x ".join(str(s) for s in (args.batch_size, *sizes))
    ms = []
    for v in implementations(device, n, for_timing=True):
        if not _takes(v, dtype):
            continue
        for what, fn in (("forward", lambda v=v: K.kron(x, a, v)),
                         ("forward + backward", lambda v=v: two_layers(v, x, gy, a, b))):
            t = time_fn(fn, device)
            spec = TaskSpec(stmt=what, setup="", label=f"kron {verify.dtype_name(dtype)} on {env.device_name(device)}",
                            sub_label=f"{label} {what} ({flops * (1 if what == 'forward' else 6):.3e} FLOP)",
                            description=v, num_threads=1)
            ms.append(Measurement(number_per_run=1, raw_times=[t.median_us * 1e-6], task_spec=spec))
    cmp = torch.utils.benchmark.Compare(ms)
    cmp.trim_significant_figures()
    print(cmp)
    return 0


def cmd_tune(args, sizes, dtype, device) -> int:
    if device.type != "cuda":
        sys.exit("tune times CUDA versions: it needs a GPU")
    rows = K.tune_default([args.batch_size], sizes, dtype, device)
    for r in rows:
        print(f"{r['version']:>4} {r['median_us']:9.1f} us{'  <- default' if r['chosen'] else ''}")
    x, _, a, _ = _layers(args.batch_size, sizes, dtype, device)
    print(f"(table: {K.tune_path()}; the default for {verify.dtype_name(dtype)} {K.factors_label(sizes)} near batch "
          f"{args.batch_size} is now {K.default_version(x, a)})")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m lab.kron", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dtype", choices=["f", "d", "bf16"], default="f", help="f: float32, d: float64, bf16: bfloat16")
    p.add_argument("--device", choices=["cpu", "cuda"], default=None, help="default: cuda when a GPU is visible")
    p.add_argument("batch_size", type=int)
    p.add_argument("factor", type=int, nargs="+")
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("check", help="norms and pairwise agreement of every implementation")
    sp = sub.add_parser("profile", help="profiler table and Chrome trace of one implementation")
    sp.add_argument("--implementation", help=", ".join(K.TORCH_VERSIONS + K.KERNELS))
    sub.add_parser("bench", help="state size, arithmetic intensity, Compare table")
    sub.add_parser("tune", help="time the default's candidates here and record the fastest (CUDA)")
    args = p.parse_args(argv)
    dtype = {"f": torch.float32, "d": torch.float64, "bf16": torch.bfloat16}[args.dtype]
    device = torch.device(args.device or env.default_device())
    if device.type == "cuda" and not env.has_gpu():
        sys.exit("no GPU is visible (torch.cuda.is_available() is False); use --device cpu")
    if args.batch_size < 1:
        sys.exit(f"batch_size must be >= 1, got {args.batch_size}")
    try:
        sizes = K.parse_factors(args.factor)
    except ValueError as e:   # 0 or a negative factor: the message, not a traceback
        sys.exit(str(e))
    cmds = {"check": cmd_check, "profile": cmd_profile, "bench": cmd_bench, "tune": cmd_tune}
    return cmds[args.cmd](args, sizes, dtype, device)


if __name__ == "__main__":
    sys.exit(main())
