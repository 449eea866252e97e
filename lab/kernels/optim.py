"""Optimising the optimizer: a multi-tensor-apply Adam / AdamW, horizontal fusion measured against PyTorch's.

Sources: cuda_src/optim/ (one unit per version: byvalue.cu v1/v2, v3.cu, v4.cu; table.cu the table upload;
optim.cuh what they share: the update, the quad loads, the table layout), cpp_src/optim/optim.cpp (binding, named
checks, the plan), cpp_src/optim/cpu.cpp (the C++ CPU version), cuda_src/optim_attempts/ (standalone programs: the
pointer-passing attempts that fail, built and run in a subprocess).

An optimizer step touches every parameter tensor; one kernel per tensor per operation is launch-bound. One kernel
for all tensors needs their addresses in the kernel, and the versions differ in how the list gets there:

    v1  a struct of pointers passed by value, sized to the classic 4 KB parameter limit: as many launches as it takes
    v2  the same struct sized to 32764 bytes (CUDA >= 12.1, Volta+): fewer launches
    v3  the table in device memory: one launch, one block per 64K-element chunk
    v4  flat: the tensors end to end as one index space; a block may span many small tensors

    adam_step(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, ...)   functional, in place
    AdamW(params, lr, betas, eps, weight_decay, amsgrad, *, maximize, ...)   drop-in for torch.optim.AdamW
    Adam(params, ..., decoupled_weight_decay=False)                          drop-in for torch.optim.Adam

Params may be float32, bfloat16 or float16; the optimizer state is float32 for all three. The step count is a float32
tensor on the params' device, read and incremented by the kernel, so a step can be captured in a CUDA graph. lr is a
captured constant when it is a float, and read on the device when it is a CUDA float32 tensor (a schedule may change
it between replays); betas, eps and weight decay are captured constants.
"""
from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

import torch

from .. import build, env, results
from ..ceilings import ceilings, ceilings_cached
from ..registry import Family, Op, Version, register, version_number
from ..timing import time_cuda
from ._common import elem_size

FAMILY = "optim"
CHUNK = 65536          # elements per block in v1-v3 (torch's multi_tensor_apply chunk)
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
IDEAS = {
    "v1": "pointer struct by value, 4 KB kernel-parameter limit: 36 tensors / 416 chunks per launch",
    "v2": "the struct sized to the 32 KB limit (CUDA 12.1+): 256 tensors / 3936 chunks per launch",
    "v3": "pointer table in device memory: one launch, one block per 64K-element chunk",
    "v4": "flat: tensors end to end as one index space; a block spans tensors, no idle threads",
}


def ext():
    """The compiled module (built on first use; rebuilt whenever a source changed)."""
    return build.load(FAMILY)


def bytes_per_param(dtype: torch.dtype, amsgrad: bool = False) -> int:
    """Fewest bytes a step moves per parameter: read p, g (param dtype), m, v (fp32); write p, m, v [+ vmax r/w]."""
    return 3 * elem_size(dtype) + 16 + (8 if amsgrad else 0)


# ---- the functional step ------------------------------------------------------------------------------------------
def adam_step(params: list[torch.Tensor], grads: list[torch.Tensor], exp_avgs: list[torch.Tensor],
              exp_avg_sqs: list[torch.Tensor], max_exp_avg_sqs: list[torch.Tensor], state_steps: list[torch.Tensor],
              *, lr: float | torch.Tensor, beta1: float, beta2: float, eps: float, weight_decay: float,
              decoupled: bool, amsgrad: bool = False, maximize: bool = False, version: str | None = None,
              chunk: int = CHUNK) -> int:
    """One Adam (decoupled=False) or AdamW (decoupled=True) step over lists of tensors, in place.

    params/grads: float32, bfloat16 or float16 (grads of the params' dtype and layout); exp_avgs, exp_avg_sqs
    (max_exp_avg_sqs if amsgrad): float32 like the params; state_steps: one-element float32 tensors on the params'
    device, incremented. Returns the number of kernel launches it took (0 on the CPU).
    """
    if isinstance(lr, torch.Tensor):
        lr_f, lr_t = 0.0, lr
    else:
        lr_f, lr_t = float(lr), None
    version = version or ("v4" if params and params[0] is not None and params[0].is_cuda else "cpu")
    lists = (params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps)
    try:
        return ext().adam_step(*(list(x) for x in lists), lr_f, lr_t, float(beta1), float(beta2), float(eps),
                               float(weight_decay), bool(decoupled), bool(amsgrad), bool(maximize),
                               version_number(version), int(chunk))
    except TypeError as e:
        if "incompatible function arguments" not in str(e):
            raise
        names = ("params", "grads", "exp_avgs", "exp_avg_sqs", "max_exp_avg_sqs", "state_steps")
        for name, lst in zip(names, lists):  # pybind11 cannot say which entry it could not convert: find it
            for i, t in enumerate(lst):
                if not isinstance(t, torch.Tensor):
                    what = "is None: every param in the list needs a gradient" if t is None and name == "grads" \
                        else f"must be a tensor, got {type(t).__name__}"
                    raise (ValueError if t is None else TypeError)(f"{name}[{i}] {what}") from None
        raise


# ---- the reference (plain PyTorch; verify runs it on float64 copies) --------------------------------------------
def adam_ref(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, hp: dict):
    """The update rule of torch.optim.Adam/AdamW, written out; returns new (params, exp_avgs, exp_avg_sqs,
    [max_exp_avg_sqs,] state_steps) and leaves its inputs alone."""
    lr, b1, b2, eps, wd = hp["lr"], hp["beta1"], hp["beta2"], hp["eps"], hp["weight_decay"]
    out_p, out_m, out_v, out_vm, out_s = [], [], [], [], []
    for i, (p, g, m, v, s) in enumerate(zip(params, grads, exp_avgs, exp_avg_sqs, state_steps)):
        t = s + 1
        g = -g if hp["maximize"] else g
        if hp["decoupled"]:
            p = p * (1 - lr * wd)
        elif wd != 0:
            g = g + wd * p
        m = m + (1 - b1) * (g - m)
        v = v * b2 + (1 - b2) * g * g
        use = v
        if hp["amsgrad"]:
            use = torch.maximum(max_exp_avg_sqs[i], v)
            out_vm.append(use)
        denom = use.sqrt() / (1 - b2 ** t).sqrt() + eps
        p = p - lr / (1 - b1 ** t) * m / denom
        out_p.append(p), out_m.append(m), out_v.append(v), out_s.append(t)
    return (out_p, out_m, out_v) + ((out_vm,) if hp["amsgrad"] else ()) + (out_s,)


# ---- inputs for the Op ------------------------------------------------------------------------------------------
def split_sizes(tensors: int, numel: int, gen: torch.Generator) -> list[int]:
    """`tensors` sizes >= 1 summing to `numel`, drawn from gen (uneven, mostly not multiples of 4)."""
    if tensors > numel:
        raise ValueError(f"cannot split numel={numel} into {tensors} non-empty tensors")
    if tensors == 1:
        return [numel]
    w = torch.rand(tensors, generator=gen, dtype=torch.float64) + 0.05
    sizes = (w / w.sum() * (numel - tensors)).floor().long() + 1
    sizes[-1] += numel - int(sizes.sum())
    return [int(s) for s in sizes]


HP = dict(lr=0.05, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.1)  # lr large enough that an error shows in p


def _make_inputs(decoupled: bool):
    def make(shape: dict, dtype: torch.dtype, device, gen: torch.Generator):
        sizes = split_sizes(shape["tensors"], shape["numel"], gen)
        ams = bool(shape.get("amsgrad", 0))

        def rnd(n, scale=1.0, positive=False):
            x = torch.rand(n, generator=gen) if positive else torch.randn(n, generator=gen)
            return x * scale

        params = [rnd(n).to(dtype).to(device) for n in sizes]
        grads = [rnd(n).to(dtype).to(device) for n in sizes]
        m = [rnd(n, 0.1).to(device) for n in sizes]
        v = [rnd(n, 0.01, positive=True).to(device) for n in sizes]
        vmax = [(x * (0.5 + torch.rand(x.shape, generator=gen).to(device))) for x in v] if ams else []
        # steps differ per tensor: the bias correction is per tensor
        steps = [torch.tensor(float(k), device=device) for k in torch.randint(0, 20, (len(sizes),), generator=gen)]
        hp = dict(HP, amsgrad=ams, maximize=bool(shape.get("maximize", 0)), decoupled=decoupled,
                  cpu_steps=[s.detach().cpu() for s in steps])  # torch's for-loop/foreach keep steps on the CPU
        return params, grads, m, v, vmax, steps, hp
    return make


def _outputs(params, m, v, vmax, steps, hp):
    return (params, m, v) + ((vmax,) if hp["amsgrad"] else ()) + (steps,)


def _kernel(version: str):
    def fn(params, grads, m, v, vmax, steps, hp):
        adam_step(params, grads, m, v, vmax, steps, lr=hp["lr"], beta1=hp["beta1"], beta2=hp["beta2"],
                  eps=hp["eps"], weight_decay=hp["weight_decay"], decoupled=hp["decoupled"], amsgrad=hp["amsgrad"],
                  maximize=hp["maximize"], version=version)
        return _outputs(params, m, v, vmax, steps, hp)
    return fn


def _torch_adam(impl: str):
    """torch.optim.adam.adam, the functional form of torch.optim.Adam/AdamW, as its optimizers call it by default:
    the for-loop and foreach forms with the step count on the CPU, the fused form with it on the device."""
    def fn(params, grads, m, v, vmax, steps, hp):
        dev_steps = impl == "fused" or params[0].device.type == "cpu"
        st = steps if dev_steps else hp["cpu_steps"]
        step_fn, kw = _torch_functional(hp["decoupled"])
        step_fn(params, grads, m, v, vmax, st, foreach=impl == "foreach", fused=impl == "fused", capturable=False,
                amsgrad=hp["amsgrad"], beta1=hp["beta1"], beta2=hp["beta2"], lr=hp["lr"],
                weight_decay=hp["weight_decay"], eps=hp["eps"], maximize=hp["maximize"], **kw)
        return _outputs(params, m, v, vmax, st, hp)
    return fn


def _torch_functional(decoupled: bool):
    """torch.optim.adam.adam (with decoupled_weight_decay where this torch has it), else torch.optim.adamw.adamw."""
    import inspect
    from torch.optim import adam as adam_mod
    if "decoupled_weight_decay" in inspect.signature(adam_mod.adam).parameters:
        return adam_mod.adam, {"decoupled_weight_decay": decoupled}
    if decoupled:
        from torch.optim.adamw import adamw
        return adamw, {}
    return adam_mod.adam, {}


def _versions() -> list[Version]:
    vs = [Version("cpu", _kernel("cpu"), "cpu", "C++, at::parallel_for over 64K-element chunks", takes_out=False,
                  inplace=True)]
    vs += [Version(n, _kernel(n), "cuda", idea, takes_out=False, inplace=True) for n, idea in IDEAS.items()]
    for impl, idea in (("for-loop", "torch.optim for-loop: ~10 kernels per tensor"),
                       ("foreach", "torch.optim foreach: ~10 multi-tensor kernels per 4 KB slice of the list"),
                       ("fused", "torch.optim fused=True: one multi-tensor kernel per 4 KB slice")):
        vs.append(Version(f"torch.{impl}", _torch_adam(impl), "any", idea, baseline=True, takes_out=False,
                          check=False, inplace=True, dtypes=(torch.float32,)))
    return vs


def _nbytes(s: dict, dt: torch.dtype) -> float:
    return s["numel"] * bytes_per_param(dt, bool(s.get("amsgrad", 0)))


def _shape(tensors: int, numel: int, amsgrad: int = 0, maximize: int = 0) -> dict:
    return {"tensors": tensors, "numel": numel, "amsgrad": amsgrad, "maximize": maximize}


CHECK = [_shape(1, 1), _shape(3, 7, 1, 0), _shape(5, 1031, 0, 1), _shape(7, 65537 + 3, 1, 1),
         _shape(2, 3 * 65536 + 5), _shape(40, 100003, 1, 0),       # 40 tensors: v1 takes two launches
         _shape(300, 300007, 0, 1)]                                  # 300 tensors: v2 takes two launches
BENCH = [_shape(148, 1 << p) for p in (18, 21, 24, 27)]
BENCH_CPU = [_shape(148, 1 << p) for p in (18, 21)]
FORMULA = "GB/s = numel·(3·sizeof(param) + 16 [+ 8 amsgrad]) / time (read p, g, m, v; write p, m, v)"

OPS = [
    Op(FAMILY, "adamw", _make_inputs(True), adam_ref, _versions(), CHECK, BENCH, BENCH_CPU, DTYPES,
       nbytes=_nbytes, formula=FORMULA, size_key="numel", baseline="torch.fused",
       doc="one AdamW step (decoupled weight decay) over a list of tensors, in place"),
    Op(FAMILY, "adam", _make_inputs(False), adam_ref, _versions(), CHECK[:5], BENCH[1:3], BENCH_CPU[:1], DTYPES,
       nbytes=_nbytes, formula=FORMULA, size_key="numel", baseline="torch.fused",
       doc="one Adam step (L2 weight decay on the gradient) over a list of tensors, in place"),
]


# ---- the drop-in optimizers ---------------------------------------------------------------------------------------
def _check_args(lr, betas, eps, weight_decay, differentiable):
    # the messages torch.optim.Adam gives
    if isinstance(lr, torch.Tensor):
        if lr.numel() != 1:
            raise ValueError("Tensor lr must be 1-element")
    elif not 0.0 <= lr:
        raise ValueError(f"Invalid learning rate: {lr}")
    if not 0.0 <= eps:
        raise ValueError(f"Invalid epsilon value: {eps}")
    for i, b in enumerate(betas):
        if not 0.0 <= float(b) < 1.0:
            raise ValueError(f"Invalid beta parameter at index {i}: {b}")
    if not 0.0 <= weight_decay:
        raise ValueError(f"Invalid weight_decay value: {weight_decay}")
    if differentiable:
        raise ValueError("differentiable=True is not supported: lab's Adam updates in place in a CUDA kernel, "
                         "outside autograd (use torch.optim.Adam(differentiable=True))")


class Adam(torch.optim.Optimizer):
    """torch.optim.Adam's constructor and behaviour, stepped by lab's multi-tensor kernels.

    `version` picks the kernel ('v1'..'v4' on CUDA, default 'v4'; 'cpu' on the CPU, the default there). foreach,
    fused and capturable are accepted for compatibility and change nothing: every step is one fused multi-tensor
    kernel per param dtype, with the step count on the device (capturable). State per param: 'step' (float32, on the
    param's device), 'exp_avg', 'exp_avg_sq' [, 'max_exp_avg_sq'] — float32 for every param dtype, so a bf16 model
    keeps fp32 moments; for fp32 params the state_dict is interchangeable with torch's.

    Params whose .grad is None are skipped (their step does not advance), as in torch. Everything — params, grads,
    state, hyperparameters, of every param group — is checked before the first kernel runs, so bad input raises and
    leaves every parameter as it was. The optimizer keeps, per param group, the state tensors it was handed and the
    device pointer table (re-uploaded only when a pointer changes); load_state_dict resets that. Assigning a new
    tensor to an entry of `optimizer.state` by hand is not seen: update state tensors in place.
    """
    _decoupled = False

    def __init__(self, params, lr: float | torch.Tensor = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, amsgrad: bool = False, *, foreach: bool | None = None,
                 maximize: bool = False, capturable: bool = False, differentiable: bool = False,
                 fused: bool | None = None, decoupled_weight_decay: bool = False, version: str | None = None,
                 chunk: int = CHUNK):
        _check_args(lr, betas, eps, weight_decay, differentiable)
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad, maximize=maximize,
                        foreach=foreach, capturable=capturable, differentiable=differentiable, fused=fused,
                        decoupled_weight_decay=decoupled_weight_decay or self._decoupled)
        super().__init__(params, defaults)
        if version is not None:
            version_number(version)  # 'cpu' or 'v<N>', else ValueError now rather than at the first step
        self.version = version
        self.chunk = int(chunk)
        self._plans: dict[int, tuple] = {}

    def __setstate__(self, state):
        super().__setstate__(state)
        self.__dict__.setdefault("version", None)
        self.__dict__.setdefault("chunk", CHUNK)
        self._plans = {}

    # -- state --
    def _init_state(self, p: torch.Tensor, amsgrad: bool) -> None:
        st = self.state[p]
        if "step" not in st:
            st["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
        for k in ("exp_avg", "exp_avg_sq") + (("max_exp_avg_sq",) if amsgrad else ()):
            if k not in st:
                st[k] = torch.zeros_like(p, dtype=torch.float32, memory_format=torch.preserve_format)

    def _new_plan(self, gi: int, group: dict, key: tuple):
        params = group["params"]
        st = [self.state.get(p) or {} for p in params]
        plan = ext().plan_new(params, [s.get("exp_avg") for s in st], [s.get("exp_avg_sq") for s in st],
                              [s.get("max_exp_avg_sq") for s in st], [s.get("step") for s in st], key[2])
        self._plans[gi] = (key, plan)
        return plan

    def _hyper(self, group: dict, p0: torch.Tensor) -> tuple:
        lr = group["lr"]
        lr_t = None
        if isinstance(lr, torch.Tensor):
            if lr.dtype == torch.float32 and lr.device == p0.device:
                lr_t, lr = lr.reshape(()), 0.0  # read where it lives, at run time
            else:
                lr = float(lr)
        b1, b2 = (float(b) for b in group["betas"])
        version = self.version or ("v4" if p0.is_cuda else "cpu")
        return (float(lr), lr_t, b1, b2, float(group["eps"]), float(group["weight_decay"]),
                bool(group.get("decoupled_weight_decay", self._decoupled)), bool(group["maximize"]),
                version_number(version), self.chunk)

    def _prepare(self, gi: int, group: dict):
        """Check everything of one group and pack its pointers; returns the plan to launch (None: nothing to do)."""
        params = group["params"]
        if not params:
            return None
        key = (id(params), len(params), bool(group["amsgrad"]))
        hit = self._plans.get(gi)
        plan = hit[1] if hit is not None and hit[0] == key else self._new_plan(gi, group, key)
        args = self._hyper(group, params[0])
        for _ in range(2):
            try:
                missing = ext().plan_prepare(plan, *args)
            except (TypeError, ValueError) as e:
                raise type(e)(f"param group {gi}: {e}") from None
            if not missing:
                return plan
            for j in missing:  # first grad of these params: their state starts now, as in torch
                self._init_state(params[j], key[2])
            plan = self._new_plan(gi, group, key)
        raise RuntimeError("lab optim: state initialisation did not take")  # unreachable unless state is replaced

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        ready = [self._prepare(gi, g) for gi, g in enumerate(self.param_groups)]  # every check, then every launch
        for plan in ready:
            if plan is not None:
                ext().plan_launch(plan)
        return loss

    def load_state_dict(self, state_dict: dict) -> None:
        """torch's load_state_dict, but the moments stay float32 (torch casts them to the param dtype) and the step
        count goes to the param's device as float32."""
        saved = state_dict.get("state", {})
        ids = [pid for g in state_dict["param_groups"] for pid in g["params"]]
        params = [p for g in self.param_groups for p in g["params"]]
        super().load_state_dict(state_dict)
        for pid, p in zip(ids, params):
            if pid not in saved:
                continue
            st = self.state[p]
            for k in ("exp_avg", "exp_avg_sq", "max_exp_avg_sq"):
                if torch.is_tensor(saved[pid].get(k)):
                    st[k] = saved[pid][k].detach().to(device=p.device, dtype=torch.float32, copy=True)
            if "step" in saved[pid]:
                st["step"] = torch.as_tensor(saved[pid]["step"]).detach().to(device=p.device,
                                                                              dtype=torch.float32).reshape(()).clone()
        self._plans.clear()

    def launches(self) -> list[int]:
        """Kernel launches of the last step, per param group (0 on the CPU)."""
        return [h[1].last_launches if h else 0 for h in (self._plans.get(i) for i in range(len(self.param_groups)))]


class AdamW(Adam):
    """torch.optim.AdamW's constructor and behaviour (decoupled weight decay), stepped by lab's kernels. See Adam."""
    _decoupled = True

    def __init__(self, params, lr: float | torch.Tensor = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2, amsgrad: bool = False, *, maximize: bool = False,
                 foreach: bool | None = None, capturable: bool = False, differentiable: bool = False,
                 fused: bool | None = None, version: str | None = None, chunk: int = CHUNK):
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, foreach=foreach, maximize=maximize,
                         capturable=capturable, differentiable=differentiable, fused=fused,
                         decoupled_weight_decay=True, version=version, chunk=chunk)


# ---- parameter lists for the benchmarks --------------------------------------------------------------------------
def gpt2_small_shapes() -> list[tuple[int, ...]]:
    """The 148 parameter tensors of GPT-2 small (124,439,808 params; lm_head tied to wte), in model order."""
    d, vocab, ctx, layers = 768, 50257, 1024, 12
    shapes: list[tuple[int, ...]] = [(vocab, d), (ctx, d)]                          # wte, wpe
    for _ in range(layers):
        shapes += [(d,), (d,),                                                       # ln_1 weight, bias
                   (d, 3 * d), (3 * d,), (d, d), (d,),                               # attn c_attn, c_proj
                   (d,), (d,),                                                       # ln_2
                   (d, 4 * d), (4 * d,), (4 * d, d), (d,)]                           # mlp c_fc, c_proj
    shapes += [(d,), (d,)]                                                           # ln_f
    return shapes


def many_small_shapes(n: int = 2000, lo: int = 64, hi: int = 8192, seed: int = 0) -> list[tuple[int, ...]]:
    """n 1-D tensors with sizes log-uniform in [lo, hi] (biases, norms, small projections): the launch-bound case."""
    g = torch.Generator().manual_seed(seed)
    u = torch.rand(n, generator=g, dtype=torch.float64)
    return [(int(math.exp(math.log(lo) + x * (math.log(hi) - math.log(lo)))),) for x in u.tolist()]


# ---- extras: whole optimizer steps on a model's parameter list ---------------------------------------------------
def _variants(quick: bool) -> list[tuple[str, Callable, bool]]:
    """(name, make optimizer from params, also time a CUDA-graph replay)."""
    lr = 1e-3
    vs = [("torch.for-loop", lambda ps: torch.optim.AdamW(ps, lr=lr, foreach=False), False),
          ("torch.foreach", lambda ps: torch.optim.AdamW(ps, lr=lr, foreach=True), False),
          ("torch.fused", lambda ps: torch.optim.AdamW(ps, lr=lr, fused=True), False),
          ("torch.fused+capturable", lambda ps: torch.optim.AdamW(ps, lr=lr, fused=True, capturable=True), True)]
    if quick:
        vs = vs[1:4]   # foreach, fused and fused+capturable: the eager and the graph baselines
    vs += [(v, (lambda v: lambda ps: AdamW(ps, lr=lr, version=v))(v), True) for v in IDEAS]
    return vs


def _row(op: str, version: str, sizes: list[int], t, nbytes: float, copy_gbps: float,
         base: tuple[str, float] | None, device, note: str = "") -> dict:
    """base: (baseline name, its median) in the row's mode (eager rows against torch.fused, graph replays against
    torch.fused+capturable replayed from a graph), or None."""
    sec = t.median_us * 1e-6
    gbps = nbytes / sec / 1e9
    return {"family": FAMILY, "op": op, "version": version,
            "shape": f"tensors={len(sizes)} numel={sum(sizes)}", "size": sum(sizes), "dtype": "float32",
            "precision": "float32", "mode": t.mode, "median_us": t.median_us, "p20_us": t.p20_us,
            "p80_us": t.p80_us, "reps": t.reps, "gbps": gbps, "tflops": None, "pct_copy_bw": 100 * gbps / copy_gbps,
            "pct_peak": None,
            "baseline": f"{base[0]} ({t.mode})" if base else None,
            "speedup": base[1] / t.median_us if base else None, "note": note,
            **results.stamp(device)}


def host_us(step: Callable[[], object], reps: int = 20) -> float:
    """Median CPU time to issue one step (no synchronisation inside): what a launch-bound step costs the host."""
    out = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        out.append((time.perf_counter() - t0) * 1e6)
    torch.cuda.synchronize()
    return sorted(out)[len(out) // 2]


def bench_param_list(op: str, shapes: list[tuple[int, ...]], device, record: bool = True, quick: bool = False,
                     compile_step: bool = True) -> list[dict]:
    """Time one AdamW step over the parameter list `shapes` (fp32) for every variant: torch's for-loop, foreach and
    fused, torch.compile of the step, and v1..v4 (CUDA-graph replays of v4 and torch's capturable fused too).
    Rows: GB/s = 28·numel / time. The compile time of torch.compile is its own row ('[compile]', mode 'wall')."""
    device = torch.device(device)
    if device.type != "cuda":
        print(f"[lab] optim {op}: the optimizer-step benchmarks run on CUDA only; skipped on the CPU")
        return []
    copy = ceilings(device)["copy_gbps"]
    sizes = [math.prod(s) for s in shapes]
    nbytes = 28.0 * sum(sizes)
    gen = torch.Generator(device=device).manual_seed(0)
    params = [torch.randn(s, device=device, generator=gen) * 0.02 for s in shapes]
    for p in params:
        p.grad = torch.randn(p.shape, device=device, generator=gen) * 1e-3
    rows: list[dict] = []
    base: dict[str, tuple[str, float]] = {}   # mode -> (baseline, median): ratios within one mode
    label = f"{op}: {len(sizes)} tensors, {sum(sizes):,} params, {nbytes / 1e9:.3f} GB/step"
    print(f"[lab] optim {label}; floor at {copy:.0f} GB/s copy: {nbytes / copy / 1e6:.3f} ms", flush=True)

    def record_row(version, t, note=""):
        r = _row(op, version, sizes, t, nbytes, copy, base.get(t.mode), device, note)
        rows.append(r)
        print(f"[lab]   {version + (' (graph)' if t.mode == 'graph' else ''):<26} {t.median_us / 1e3:9.3f} ms  "
              f"{r['gbps']:7.0f} GB/s ({r['pct_copy_bw']:4.1f}% of copy)"
              + (f"  {r['speedup']:5.2f}x {r['baseline']}" if r["speedup"] else "") + (f"  {note}" if note else ""), flush=True)

    for name, make, graph in _variants(quick):
        opt = make(params)
        t = time_cuda(opt.step)
        if name == "torch.fused":
            base[t.mode] = (name, t.median_us)
        note = f"host {host_us(opt.step):.0f} us/step"
        if isinstance(opt, Adam):
            note += f", {opt.launches()[0]} launches"
        if name != "torch.fused+capturable":
            record_row(name, t, note)
        if graph:
            tg = time_cuda(opt.step, graph=True)
            if name == "torch.fused+capturable":
                base[tg.mode] = (name, tg.median_us)
            record_row(name, tg, "CUDA graph replay")
        del opt
        torch.cuda.empty_cache()
    if compile_step and not quick:
        rows += _compiled_step(op, params, sizes, nbytes, copy, device, record_row)
    del params
    torch.cuda.empty_cache()
    if record and rows:
        results.append(rows)
    return rows


def _compiled_step(op, params, sizes, nbytes, copy, device, record_row) -> list[dict]:
    """torch.compile of torch.optim.AdamW(foreach=True).step — vertical fusion by Inductor (the recipe 'Compiling
    the optimizer'); compile time with Inductor's caches off, as its own row."""
    import torch._dynamo
    import torch._inductor.config as inductor_config
    torch._dynamo.reset()
    opt = torch.optim.AdamW(params, lr=1e-3, foreach=True)

    @torch.compile(fullgraph=False)
    def step():
        opt.step()

    with inductor_config.patch(force_disable_caches=True):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        sec = time.perf_counter() - t0
    t = time_cuda(step)
    record_row("torch.compile", t, f"host {host_us(step):.0f} us/step; first call {sec:.1f} s (own row)")
    row = {"family": FAMILY, "op": op, "version": "torch.compile [compile]",
           "shape": f"tensors={len(sizes)} numel={sum(sizes)}", "size": sum(sizes), "dtype": "float32",
           "precision": "float32", "mode": "wall", "median_us": sec * 1e6, "p20_us": sec * 1e6, "p80_us": sec * 1e6,
           "reps": 1, "gbps": None, "tflops": None, "pct_copy_bw": None, "pct_peak": None, "speedup": None,
           "baseline": None,
           "note": "first call: Dynamo trace + Inductor compile (caches off) + one step, wall clock",
           **results.stamp(device)}
    print(f"[lab]   torch.compile first call (trace + compile + one step): {sec:.1f} s", flush=True)
    del opt, step
    torch._dynamo.reset()
    return [row]


def bench_gpt2_small(device, record: bool = True, quick: bool = False) -> list[dict]:
    """AdamW over GPT-2 small's 148 parameter tensors (124M params, fp32): bandwidth-bound."""
    return bench_param_list("gpt2_small", gpt2_small_shapes(), device, record, quick)


def bench_many_small(device, record: bool = True, quick: bool = False) -> list[dict]:
    """AdamW over 2000 small tensors (64..8192 elements): launch-bound. torch.compile of this step compiles 2000
    tensors' worth of graph; it runs only with LAB_OPTIM_COMPILE_MANY=1 (its compile time is minutes)."""
    return bench_param_list("many_small", many_small_shapes(), device, record, quick,
                            compile_step=os.environ.get("LAB_OPTIM_COMPILE_MANY") == "1")


# ---- the figure ---------------------------------------------------------------------------------------------------
def plot_steps(rows: list[dict] | None = None, path: Path | str | None = None, device_name: str | None = None):
    """Step time and achieved bandwidth of every variant, one column per parameter list (rows: the extras' rows as
    recorded, or the newest ones in the results table of `device_name`, default the newest device's). Returns the
    figure's path (results/<device>/plots/optim_steps.png), or None without rows. `lab plot` redraws it."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    if rows is None:
        rows = results.latest([r for r in results.read(family=FAMILY) if r["op"] in ("gpt2_small", "many_small")])
        if rows and not device_name:
            device_name = max(rows, key=lambda r: r["timestamp"] or "")["device_name"]
        rows = [r for r in rows if r["device_name"] == device_name]
    rows = [r for r in rows if r["mode"] != "wall"]
    ops = [o for o in ("gpt2_small", "many_small") if any(r["op"] == o for r in rows)]
    if not ops:
        return None
    fig, axes = plt.subplots(2, len(ops), figsize=(6.5 * len(ops), 7.5), squeeze=False)
    for j, op in enumerate(ops):
        sel = [r for r in rows if r["op"] == op]
        names = [r["version"] + (" (graph)" if r["mode"] == "graph" else "") for r in sel]
        colors = ["0.6" if r["version"].startswith("torch") else "C0" for r in sel]
        ms = [r["median_us"] / 1e3 for r in sel]
        ax = axes[0][j]
        bars = ax.bar(names, ms, color=colors)
        for b, v in zip(bars, ms):
            ax.annotate(f"{v:.3g}", (b.get_x() + b.get_width() / 2, v), ha="center", va="bottom", fontsize=7)
        ax.set_yscale("log")
        ax.set_ylabel("ms per step (median)")
        ax.set_title(f"AdamW step, {op}: {sel[0]['shape']}", fontsize=9)
        ax.tick_params(axis="x", labelsize=7)
        plt.setp(ax.get_xticklabels(), rotation=40, ha="right", rotation_mode="anchor")   # names end under their bar
        ax = axes[1][j]
        gb = [r["gbps"] for r in sel]
        ax.bar(names, gb, color=colors)
        ceil = ceilings_cached(sel[0]["device_name"], sel[0]["torch"]) or {}
        if ceil.get("copy_gbps"):
            ax.axhline(ceil["copy_gbps"], color="k", lw=0.8, ls="--")
            ax.annotate(f"copy {ceil['copy_gbps']:.0f} GB/s", (0, ceil["copy_gbps"]), fontsize=7, va="bottom")
        ax.set_ylabel("achieved GB/s (28 B/param / time)")
        ax.tick_params(axis="x", labelsize=7)
        plt.setp(ax.get_xticklabels(), rotation=40, ha="right", rotation_mode="anchor")   # names end under their bar
    r0 = sel[0]
    fig.text(0.01, 0.005, f"{FORMULA}\n{r0['device_name']} · torch {r0['torch']} · CUDA {r0['cuda']} · "
                          f"commit {r0['commit']} · {r0['timestamp']}", fontsize=7, color="0.35")
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    path = Path(path) if path else env.device_dir(r0["device_name"]) / "plots" / "optim_steps.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


# ---- the failed attempts of the notes, in a subprocess -----------------------------------------------------------
ATTEMPTS = env.CUDA_SRC / "optim_attempts"


@dataclass
class Attempt:
    name: str
    built: bool            # nvcc accepted it
    ran: bool              # the program ran (False: not built, or no GPU)
    outcome: str           # one line: what happened
    log: str = ""          # compiler or program output


def nvcc() -> str | None:
    home = os.environ.get("CUDA_HOME")
    cands = ([os.path.join(home, "bin", "nvcc")] if home else []) + [shutil.which("nvcc") or ""]
    return next((c for c in cands if c and os.path.exists(c)), None)


def _arch_flags() -> list[str]:
    try:
        return build.cuda_arch()[0]
    except build.BuildError:
        return ["-arch=sm_90"]


def _compile(src: str, defines: Iterable[str] = (), *, workdir: str) -> tuple[bool, str, str | None]:
    """nvcc a standalone program of cuda_src/optim_attempts/ -> (built, compiler output, binary path)."""
    cc = nvcc()
    if cc is None:
        return False, "nvcc not found (set CUDA_HOME or put nvcc on PATH)", None
    out = os.path.join(workdir, Path(src).stem)
    cmd = [cc, *_arch_flags(), "-O2", *[f"-D{d}" for d in defines], str(ATTEMPTS / src), "-o", out]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    return r.returncode == 0, (r.stdout + r.stderr).strip(), out if r.returncode == 0 else None


def _first_error(log: str) -> str:
    for line in log.splitlines():
        if re.search(r"error", line, re.I):
            return re.sub(r"^\S*optim_attempts/", "", line.strip())
    return log.strip().splitlines()[-1] if log.strip() else ""


def _run(binary: str, *args: str) -> tuple[int, str]:
    r = subprocess.run([binary, *args], capture_output=True, text=True, timeout=120)
    return r.returncode, (r.stdout + r.stderr).strip()


def attempt_std_vector() -> Attempt:
    """Attempt 1: pass std::vector<float*> to the kernel. nvcc refuses: its operator[] is host code."""
    with tempfile.TemporaryDirectory(prefix="lab-optim-") as tmp:
        ok, log, _ = _compile("std_vector.cu", workdir=tmp)
    return Attempt("1: std::vector<float*> as a kernel argument", ok, False,
                   "compiled (unexpected)" if ok else f"nvcc refuses: {_first_error(log)}", log)


def attempt_host_pointers() -> list[Attempt]:
    """Attempt 2: a host array of device pointers (float**) -> the kernel's first load through it faults; the same
    array copied to device memory works (the notes' 'revisit attempt 2'). Each in its own process: the fault
    leaves that process's CUDA context unusable, never this one's."""
    with tempfile.TemporaryDirectory(prefix="lab-optim-") as tmp:
        ok, log, binary = _compile("host_pointer_table.cu", workdir=tmp)
        out = []
        for mode in ("host", "device"):
            if not ok:
                out.append(Attempt(f"2: pointer table in {mode} memory", False, False, _first_error(log), log))
                continue
            if not torch.cuda.is_available():
                out.append(Attempt(f"2: pointer table in {mode} memory", True, False, "built; needs a GPU to run"))
                continue
            rc, text = _run(binary, mode)
            line = next((ln for ln in text.splitlines() if ln.startswith("RESULT")), text[-300:])
            out.append(Attempt(f"2: pointer table in {mode} memory", True, True, line, text))
        return out


def attempt_param_limit(tensors: Iterable[int] = (255, 256, 2047, 2048)) -> list[Attempt]:
    """Attempt 3: all pointers in one struct passed by value (16 bytes per tensor + 4 for the scale). 255 tensors
    fit the classic 4 KB; 256 do not, yet compile (CUDA >= 12.1 allows 32764 bytes on Volta+); 2047 fit 32764;
    2048 do not, and nvcc says so."""
    out = []
    with tempfile.TemporaryDirectory(prefix="lab-optim-") as tmp:
        for n in tensors:
            ok, log, binary = _compile("param_limit.cu", [f"N_TENSORS={n}"], workdir=tmp)
            name = f"3: struct of {n} tensors by value ({16 * n + 4} bytes of parameters)"
            if not ok:
                out.append(Attempt(name, False, False, f"nvcc refuses: {_first_error(log)}", log))
            elif not torch.cuda.is_available():
                out.append(Attempt(name, True, False, "compiled; needs a GPU to run"))
            else:
                rc, text = _run(binary)
                line = next((ln for ln in text.splitlines() if ln.startswith("RESULT")), text[-300:])
                out.append(Attempt(name, True, True, line, text))
    return out


register(Family(FAMILY, "Multi-tensor-apply Adam/AdamW: horizontal fusion of an optimizer step", OPS,
                notebook="notebooks/06_fused_optimizer.ipynb",
                extras={"gpt2_small": bench_gpt2_small, "many_small": bench_many_small},
                plots=[lambda device_name: plot_steps(device_name=device_name)]))
