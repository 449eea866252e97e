"""What could it reach? The ceilings every benchmark row is read against, measured on the machine itself.

Device-to-device copy bandwidth (bytes read + bytes written), cuBLAS matrix-product rate per precision, and the FP32
FMA rate of a register-only kernel (the harness's own, cuda_src/harness/fma_peak.cu); measured once per GPU and
torch version and cached in `results/<device>/ceilings.json`. Every benchmark row carries its fraction of them.

Above lab.timing (it times the probes with it), below lab.bench (which divides by the ceilings).
"""
from __future__ import annotations

import json
import os

import torch

from . import build, env, results
from .timing import time_cuda, time_fn
from .verify import dtype_name


def _ceilings_path(device_name: str):
    return env.device_dir(device_name) / "ceilings.json"


METHOD = 2   # 2: GEMM ceilings are the best of two sizes (1: one size, 8192); entries of another method are remeasured


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
    if (key in data and not refresh and wanted <= set(data[key].get("gemm_tflops", {}))
            and data[key].get("method") == METHOD):
        return data[key]  # (an entry missing a precision measured since, or by an older method, is measured again)
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
    # GEMM: cuBLAS's best rate over two square sizes. One size is not a ceiling: at 8192 a bf16 GEMM runs ~1.6 ms a
    # call, long enough for the H100's clocks to settle below boost under the power limit, and cuBLAS at 4096 with a
    # bias was timed at 110% of that rate (b822efd); at 4096 alone the small-K tail of a wave costs some instead.
    gemm, at = {}, {}
    sizes = (4096, 8192) if cuda else (1024,)
    precisions = ["float64", "float32", "tf32", "bfloat16", "float16"] if cuda else ["float64", "float32"]
    for p in precisions:
        dt = torch.float32 if p in ("float32", "tf32") else getattr(torch, p)
        for size in sizes:
            a = torch.randn(size, size, device=device, generator=gen).to(dt)     # (size, size) @ (size, size)
            b = torch.randn(size, size, device=device, generator=gen).to(dt)
            old = torch.backends.cuda.matmul.allow_tf32
            torch.backends.cuda.matmul.allow_tf32 = p == "tf32"
            try:
                t = time_fn(lambda: torch.mm(a, b), device, flush=False) if cuda else time_fn(lambda: torch.mm(a, b),
                                                                                              device)
            finally:
                torch.backends.cuda.matmul.allow_tf32 = old
            rate = 2 * size ** 3 / (t.median_us * 1e-6) / 1e12
            if rate > gemm.get(p, 0.0):
                gemm[p], at[p] = rate, size
            del a, b
    out["gemm_tflops"] = gemm
    out["gemm_size"] = at              # the size that gave each precision's best rate
    out["method"] = METHOD
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


def smem_fill(bytes_per_block: int, blocks: int | None = None, device="cuda", graph: bool = True):
    """Timing of the shared-memory fill probe (cuda_src/harness/smem_fill.cu): `blocks` blocks (default one an SM)
    each pull bytes_per_block bytes (rounded up to 16) of random data from HBM into shared memory and end, timed like
    every row (graph replay by default, the L2 flushed before each repetition): the floor under a launch that must
    bring that much onto each SM before it can finish. Returns the lab.timing.Timing."""
    device = torch.device(device)
    blocks = blocks or torch.cuda.get_device_properties(device).multi_processor_count
    nbytes = -(-int(bytes_per_block) // 16) * 16
    g = torch.Generator(device=device).manual_seed(0)
    src = torch.randint(0, 256, (blocks * nbytes,), dtype=torch.uint8, device=device, generator=g)  # (blocks*bytes,)
    sink = torch.empty(blocks, 4, dtype=torch.int32, device=device)                              # (blocks, 4)
    ext = build.load("harness", verbose=False)
    return time_fn(lambda: ext.smem_fill(src, blocks, nbytes, sink), device, graph=graph)


def peak_for(ceil: dict, dtype: torch.dtype, precision: str | None, kind: str | None = "gemm") -> float | None:
    """The compute ceiling a version is held against: cuBLAS at its precision (TF32 versions against the TF32
    rate) for kind 'gemm', the FP32 FMA probe for 'fma' (SIMT kernels; none for float64), none for memory-bound ops."""
    if kind == "fma":  # an FP32 probe: no ceiling for float64 arithmetic (the H100's FP64 FMA rate is not measured)
        return ceil.get("fma_tflops") if dtype != torch.float64 else None
    if kind == "gemm":
        return ceil.get("gemm_tflops", {}).get(precision or dtype_name(dtype))
    return None
