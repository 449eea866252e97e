"""rope's study: what torch.compile costs before its first run (the extra `compile_time`: `python -m lab bench rope
--extra compile_time`, the report), which the torch.compile rows' steady-state times do not show."""
from __future__ import annotations

import contextlib
import time

import torch

from .. import registry, results
from ..kernels.rope import (FAMILY, BackwardOf, clear_table_cache, make_qk, make_shape, rope_qk_torch_compile,
                            rope_torch_compile)
from ..registry import shape_label


def compile_time(device, record: bool = True, quick: bool = False) -> list[dict]:
    """Wall time of torch.compile's first call (Dynamo trace + Inductor codegen and compile, with Inductor's caches
    off, + one run) at the issue's shape: what the torch.compile rows' steady-state times do not show."""
    device = torch.device(device)
    if device.type != "cuda":
        print("[lab] rope compile_time: torch.compile baselines run on CUDA only; skipped on the CPU")
        return []
    import torch._dynamo as _  # noqa: F401  (an `as` import: a bare `import torch.x` here would make torch local)
    import torch._inductor.config as inductor_config
    s = make_shape(8, 32, 2048, 128, kv_heads=32)
    dt = torch.bfloat16
    cases = {
        "rope": lambda i: rope_torch_compile(*i[:1], *i[2:]),
        "rope_qk": lambda i: rope_qk_torch_compile(*i),
        "rope_bwd": lambda i: BackwardOf("rope")(torch.randn_like(i[0]), i[0], *i[2:]),
    }
    rows = []
    for op_name, call in cases.items():
        inputs = make_qk(s, dt, device, torch.Generator().manual_seed(0))
        torch._dynamo.reset()
        clear_table_cache()
        try:
            no_cache = (inductor_config.patch(force_disable_caches=True)
                        if hasattr(inductor_config, "force_disable_caches") else contextlib.nullcontext())
            with no_cache:
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                call(inputs)
                torch.cuda.synchronize()
                sec = time.perf_counter() - t0
        except Exception as e:  # a compile failure is reported, not fatal to the benchmark run
            print(f"[lab] rope compile_time {op_name}: torch.compile failed: {type(e).__name__}: {e}"[:400])
            continue
        shape = {k: v for k, v in s.items() if op_name == "rope_qk" or k != "kv_heads"}
        rows.append({"family": FAMILY, "op": op_name, "version": "torch.compile [compile]",
                     "shape": shape_label(shape), "size": None, "dtype": "bfloat16", "precision": "bfloat16",
                     "mode": "wall", "median_us": sec * 1e6, "p20_us": sec * 1e6, "p80_us": sec * 1e6, "reps": 1,
                     "baseline": None,
                     "note": "first call: trace + compile (Inductor caches off) + one run, wall clock"
                             + (", forward and backward" if op_name == "rope_bwd" else ""),
                     **results.stamp(device)})
        print(f"[lab] torch.compile first call, {op_name} bf16 {shape_label(shape)}: {sec:.1f} s", flush=True)
        del inputs
    torch._dynamo.reset()
    if record and rows:
        results.append(rows)
    return rows


registry.attach_extras(FAMILY, {"compile_time": compile_time})
