"""optim in Triton: one Adam / AdamW step over a list of tensors, in place, one launch per tensor (a first version:
no multi-tensor apply, so it is launch-bound on many small tensors, like torch's for-loop but one kernel per tensor
instead of ~10).

Params float32, bfloat16 or float16 (grads of the params' dtype); exp_avg, exp_avg_sq (max_exp_avg_sq with amsgrad)
float32; the step count a one-element float32 tensor per param on the device. The step counts are incremented first
(torch._foreach_add_: every program of a tensor's kernel must read the same t, and none may write it while others
read), then each kernel reads t and forms the bias corrections itself as -expm1(t·log β) (one_minus_pow), so that
1 - β2^t keeps its digits at t = 1 (1 - exp(t·log β) in float32 is off by up to ~6e-5 relative there; CUDA v1..v4 use
expm1f, which Triton's core language lacks).

The update, per element, in the order of the CUDA kernels (optim.cuh adam_update) and torch's for-loop:
    g = -g (maximize);  p *= 1 - lr·wd (AdamW) | g += wd·p (Adam);  m += (1-β1)(g - m);  v = β2·v + (1-β2)·g²
    [vmax = max(vmax, v)];  p -= lr/(1-β1^t) · m / (sqrt(v or vmax)/sqrt(1-β2^t) + eps)

What Triton does for free: the vector loads and the masked tail (CUDA's quads and their scalar fallback). What it
leaves: the list of tensors (here a Python loop of launches; CUDA v3/v4 walk a pointer table in one launch).
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from . import check_device

BLOCK = 1024   # elements per program


@triton.jit
def one_minus_pow(t, log_b):
    """1 - β^t = -expm1(t·log β) in float32, accurate at t = 1 where 1 - 0.999 cancels: expm1 by Kahan's trick,
    (u - 1)·x / log(u) with u = exp(x) rounded (u - 1 is exact; the ratio puts back what rounding u lost)."""
    x = t * log_b
    u = tl.exp(x)
    um1 = u - 1.0
    em1 = tl.where(um1 == 0.0, x, um1 * x / tl.log(tl.maximum(u, 1e-30)))
    return -tl.where(u < 1e-20, -1.0, em1)    # β^t below 1e-20: 1 - β^t is 1 in float32


@triton.jit
def adam_kernel(p_ptr, g_ptr, m_ptr, v_ptr, vmax_ptr, step_ptr, n, lr, beta2, omb1, omb2, eps, wd,
                log_b1, log_b2, DECOUPLED: tl.constexpr, AMSGRAD: tl.constexpr, MAXIMIZE: tl.constexpr,
                BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    t = tl.load(step_ptr)                                      # already incremented by the launcher
    step_size = tl.div_rn(lr, one_minus_pow(t, log_b1))        # lr / (1 - β1^t)
    bc2_sqrt = tl.sqrt_rn(one_minus_pow(t, log_b2))            # sqrt(1 - β2^t)

    p = tl.load(p_ptr + offs, mask=mask).to(tl.float32)
    g = tl.load(g_ptr + offs, mask=mask).to(tl.float32)
    m = tl.load(m_ptr + offs, mask=mask)
    v = tl.load(v_ptr + offs, mask=mask)
    if MAXIMIZE:
        g = -g
    if DECOUPLED:
        p = p * (1.0 - lr * wd)
    else:
        g = g + wd * p
    m = m + omb1 * (g - m)                                     # omb1 = 1 - β1, rounded from double
    v = v * beta2 + omb2 * (g * g)
    s = v
    if AMSGRAD:
        s = tl.maximum(tl.load(vmax_ptr + offs, mask=mask), v)
        tl.store(vmax_ptr + offs, s, mask=mask)
    denom = tl.sqrt_rn(s) / bc2_sqrt + eps
    p = p - step_size * tl.div_rn(m, denom)
    tl.store(p_ptr + offs, p.to(p_ptr.dtype.element_ty), mask=mask)
    tl.store(m_ptr + offs, m, mask=mask)
    tl.store(v_ptr + offs, v, mask=mask)


def adam_step(params: list[torch.Tensor], grads: list[torch.Tensor], exp_avgs: list[torch.Tensor],
              exp_avg_sqs: list[torch.Tensor], max_exp_avg_sqs: list[torch.Tensor], state_steps: list[torch.Tensor],
              *, lr: float, beta1: float, beta2: float, eps: float, weight_decay: float, decoupled: bool,
              amsgrad: bool = False, maximize: bool = False) -> int:
    """One Adam (decoupled=False) or AdamW (decoupled=True) step, in place; returns the number of kernel launches."""
    lists = {"grads": grads, "exp_avgs": exp_avgs, "exp_avg_sqs": exp_avg_sqs, "state_steps": state_steps}
    if amsgrad:
        lists["max_exp_avg_sqs"] = max_exp_avg_sqs
    for name, lst in lists.items():
        if len(lst) != len(params):
            raise ValueError(f"{name} must have one entry per param ({len(params)}), got {len(lst)}")
    if isinstance(lr, torch.Tensor):
        raise TypeError("lr must be a float for the Triton step (a device tensor lr is CUDA v1..v4's)")
    for i, p in enumerate(params):
        g, m, v, s = grads[i], exp_avgs[i], exp_avg_sqs[i], state_steps[i]
        vm = max_exp_avg_sqs[i] if amsgrad else None
        if g is None or g.shape != p.shape or g.dtype != p.dtype:
            raise ValueError(f"grads[{i}] must be a tensor of params[{i}]'s shape {tuple(p.shape)} and dtype "
                             f"{p.dtype}")
        if p.dtype not in (torch.float32, torch.bfloat16, torch.float16):
            raise TypeError(f"params[{i}] must be float32, bfloat16 or float16, got {p.dtype}")
        for name, t in (("exp_avgs", m), ("exp_avg_sqs", v), ("max_exp_avg_sqs", vm)):
            if t is not None and (t.shape != p.shape or t.dtype != torch.float32):
                raise ValueError(f"{name}[{i}] must be float32 of params[{i}]'s shape {tuple(p.shape)}")
        if s.numel() != 1 or s.dtype != torch.float32:
            raise ValueError(f"state_steps[{i}] must be a one-element float32 tensor")
        for name, t in (("params", p), ("grads", g), ("exp_avgs", m), ("exp_avg_sqs", v), ("max_exp_avg_sqs", vm)):
            if t is not None and not t.is_contiguous():
                raise ValueError(f"{name}[{i}] must be contiguous")
        check_device(params=p, grads=g, exp_avgs=m, exp_avg_sqs=v, max_exp_avg_sqs=vm, state_steps=s)
    if not params:
        return 0
    torch._foreach_add_(state_steps, 1.0)
    launches = 0
    for i, p in enumerate(params):
        n = p.numel()
        if n == 0:
            continue
        vm = max_exp_avg_sqs[i] if amsgrad else exp_avg_sqs[i]   # unread without amsgrad
        adam_kernel[(triton.cdiv(n, BLOCK),)](p, grads[i], exp_avgs[i], exp_avg_sqs[i], vm, state_steps[i], n,
                                              float(lr), float(beta2), 1.0 - beta1, 1.0 - beta2, float(eps),
                                              float(weight_decay), math.log(beta1), math.log(beta2),
                                              DECOUPLED=bool(decoupled), AMSGRAD=bool(amsgrad),
                                              MAXIMIZE=bool(maximize), BLOCK=BLOCK, num_warps=4)
        launches += 1
    return launches
