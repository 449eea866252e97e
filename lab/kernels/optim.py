"""Optimising the optimizer: a multi-tensor-apply Adam / AdamW, horizontal fusion measured against PyTorch's.

Sources: cuda_src/optim/ (one unit per version: byvalue.cu v1/v2, v3.cu, v4.cu; table.cu the table upload;
optim.cuh what they share: the update, the quad loads, the table layout), cpp_src/optim/optim.cpp (binding, named
checks, the plan), cpp_src/optim/cpu.cpp (the C++ CPU version). The studies (whole-step benchmarks on GPT-2 small's
parameter list and on 2000 small tensors, their figure, the pointer-passing attempts of cuda_src/optim_attempts/):
lab/studies/optim.py.

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
from typing import Any, Callable

import torch

from .. import build
from ..registry import Family, Op, Version, register, version_number
from . import _triton
from ._common import elem_size

if _triton.MISSING is None:   # optional: without triton the `triton` version is listed on no device, with why
    from ._triton import optim as triton_optim

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


def _triton_step(params, grads, m, v, vmax, steps, hp):
    triton_optim.adam_step(params, grads, m, v, vmax, steps, lr=hp["lr"], beta1=hp["beta1"], beta2=hp["beta2"],
                           eps=hp["eps"], weight_decay=hp["weight_decay"], decoupled=hp["decoupled"],
                           amsgrad=hp["amsgrad"], maximize=hp["maximize"])
    return _outputs(params, m, v, vmax, steps, hp)


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
    vs.append(_triton.version(_triton_step, "Triton: one launch per tensor (no multi-tensor apply yet), steps "
                                            "incremented first by one _foreach_add_", takes_out=False, inplace=True))
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


# The whole-step benchmarks over these lists (extras), their figure and the pointer-passing attempts of the notes are
# studies: lab/studies/optim.py attaches them to this family.
register(Family(FAMILY, "Multi-tensor-apply Adam/AdamW: horizontal fusion of an optimizer step", OPS,
                notebook="notebooks/06_fused_optimizer.ipynb"))
