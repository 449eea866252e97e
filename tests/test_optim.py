"""optim: multi-tensor Adam/AdamW. Every version against the float64 reference (odd sizes, several seeds, per-tensor
steps); 100 steps on an MLP against torch.optim.AdamW/Adam; state_dict interchange with torch; skipped params;
CUDA-graph capture; launches across the by-value limits; bf16/fp16 params with fp32 state; bad input raises a
named error and leaves every parameter as it was; the pointer-passing attempts fail as the notes say."""
import copy
import math

import pytest
import torch
import torch.nn.functional as F

from lab import build, registry, verify
from lab.kernels import optim
from lab.studies import optim as study

from conftest import HAS_GPU, devices, needs_gpu

FAM = registry.get("optim")
needs_nvcc = pytest.mark.skipif(build.nvcc_path() is None, reason="nvcc not found: the attempts are compiled with it")


def _versions(device):
    return ["cpu"] if device == "cpu" else ["v1", "v2", "v3", "v4"]


# ---- one step against the float64 reference ---------------------------------------------------------------------
@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("op", [o.name for o in FAM.ops])
def test_every_version_matches_reference(op, device):
    verify.assert_op_passes(FAM.op(op), device, seeds=(0, 1))


def _lists(sizes, device, dtype=torch.float32, seed=0, amsgrad=False):
    g = torch.Generator().manual_seed(seed)
    p = [torch.randn(n, generator=g).to(dtype).to(device) for n in sizes]
    gr = [torch.randn(n, generator=g).to(dtype).to(device) for n in sizes]
    m = [torch.randn(n, generator=g).mul(0.1).to(device) for n in sizes]
    v = [torch.rand(n, generator=g).mul(0.01).to(device) for n in sizes]
    vm = [x * 1.1 for x in v] if amsgrad else []
    s = [torch.tensor(float(i % 7), device=device) for i in range(len(sizes))]
    return p, gr, m, v, vm, s


def _ref_step(lists, **kw):
    hp = dict(optim.HP, amsgrad=False, maximize=False, decoupled=True)
    hp.update(kw)
    return optim.adam_ref(*verify.upcast(lists), hp)


def _step(lists, version, **kw):
    hp = dict(optim.HP, decoupled=True, **kw)
    return optim.adam_step(*lists, lr=hp["lr"], beta1=hp["beta1"], beta2=hp["beta2"], eps=hp["eps"],
                           weight_decay=hp["weight_decay"], decoupled=hp["decoupled"], amsgrad=hp.get("amsgrad", False),
                           maximize=hp.get("maximize", False), version=version, chunk=hp.get("chunk", optim.CHUNK))


def _assert_step_matches(lists, ref, dtype=torch.float32, what=""):
    p, _, m, v, vm, s = lists
    outs = (p, m, v) + ((vm,) if vm else ()) + (s,)
    for i, (o, r) in enumerate(zip(outs, ref)):
        verify.assert_close(o, r, dtype if i == 0 else torch.float32, what=f"{what} output {i}")


@needs_gpu
@pytest.mark.parametrize("version", ["v1", "v2", "v3", "v4"])
def test_launches_across_the_by_value_limits(version):
    # chunk=256 makes 40-odd tensors of a few thousand elements cross every limit of v1 (36 tensors, 416 chunks)
    # and split tensors between launches; each step count must still advance exactly once
    sizes = [1 + (i * 7919) % 4000 for i in range(300)] + [300_000]
    lists = _lists(sizes, "cuda", amsgrad=True)
    ref = _ref_step(lists, amsgrad=True)
    launches = _step(lists, version, amsgrad=True, chunk=256)
    torch.cuda.synchronize()
    _assert_step_matches(lists, ref, what=version)
    if version in ("v3", "v4"):
        assert launches >= 2  # table upload + one step kernel
    else:
        caps = optim.ext().byvalue_caps(int(version[1]), True)
        chunks = sum(max(1, -(-n // 256)) for n in sizes)
        assert launches >= max(-(-len(sizes) // caps[1]), -(-chunks // caps[2])), (launches, caps)


@needs_gpu
def test_by_value_structs_fit_their_limits_and_v2_needs_fewer_launches():
    for version, limit in ((1, 4096), (2, 32764)):
        for ams in (False, True):
            nbytes, tensors, blocks = optim.ext().byvalue_caps(version, ams)
            assert nbytes + 96 <= limit and tensors >= 36 and blocks >= 320
    sizes = [math.prod(s) for s in optim.gpt2_small_shapes()]
    lists = _lists(sizes[:40], "cuda")      # wte alone is 589 chunks: over v1's 416 blocks, and 40 > 36 tensors
    n = {v: _step(lists, v) for v in ("v1", "v2", "v4")}
    assert n["v1"] > n["v2"] == 1 and n["v4"] == 2, n


@pytest.mark.parametrize("device", devices())
def test_misaligned_views_take_the_scalar_path(device):
    # params and state as views 4 bytes into flat buffers: not 16-byte aligned, so the vector loads must not be used
    sizes = [5, 1030, 4099]
    for version in _versions(device):
        flat = [torch.randn(sum(sizes) + 1, device=device) for _ in range(4)]
        flat[3].abs_()                                        # exp_avg_sq >= 0
        p, g, m, v = [[f[1 + sum(sizes[:i]):1 + sum(sizes[:i + 1])] for i in range(len(sizes))] for f in flat]
        lists = (p, g, m, v, [], [torch.tensor(3.0, device=device) for _ in sizes])
        ref = _ref_step(lists)
        _step(lists, version)
        _assert_step_matches(lists, ref, what=version)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_params_keep_fp32_state_over_steps(device, dtype):
    # 20 AdamW steps with fixed grads: m and v depend on the grads alone, so the fp32 state must match float64
    # tightly; p (rounded to bf16/fp16 each step) within that dtype's tolerance
    sizes = [1, 33, 5000]
    for version in _versions(device):
        lists = _lists(sizes, device, dtype)
        ref = tuple(list(x) for x in verify.upcast(lists))
        for _ in range(20):
            _step(lists, version)
            hp = dict(optim.HP, amsgrad=False, maximize=False, decoupled=True)
            out = optim.adam_ref(*ref, hp)
            ref = (list(out[0]), ref[1], out[1], out[2], [], out[3])
            ref = ([p.to(dtype).double() for p in ref[0]],) + ref[1:]  # the stored param is rounded each step
        p, _, m, v, _, s = lists
        verify.assert_close(p, ref[0], dtype, what=f"{version} params")
        verify.assert_close(m, ref[2], torch.float32, what=f"{version} exp_avg")
        verify.assert_close(v, ref[3], torch.float32, what=f"{version} exp_avg_sq")
        assert all(float(x) == float(y) for x, y in zip(s, ref[5]))


# ---- the drop-in optimizer against torch.optim -----------------------------------------------------------------
def _mlp(device, dtype=torch.float32):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.GELU(), torch.nn.Linear(64, 64),
                               torch.nn.LayerNorm(64), torch.nn.GELU(), torch.nn.Linear(64, 5)).to(device, dtype)


def _train(model, opt, steps, device, seed=0, start=0):
    g = torch.Generator().manual_seed(seed)
    dtype = next(model.parameters()).dtype
    for i in range(start + steps):
        x = torch.randn(32, 20, generator=g).to(device, dtype)
        y = torch.randint(0, 5, (32,), generator=g).to(device)
        if i < start:
            continue
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()


CONFIGS = {
    "adamw": (torch.optim.AdamW, optim.AdamW, dict(lr=1e-3, weight_decay=0.05)),
    "adamw_amsgrad_maximize": (torch.optim.AdamW, optim.AdamW, dict(lr=2e-3, amsgrad=True, maximize=True)),
    "adam_l2": (torch.optim.Adam, optim.Adam, dict(lr=1e-3, weight_decay=0.1, betas=(0.8, 0.99), eps=1e-6)),
    "adam_decoupled": (torch.optim.Adam, optim.Adam, dict(lr=1e-3, weight_decay=0.1, decoupled_weight_decay=True)),
}


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("config", list(CONFIGS))
def test_100_steps_on_an_mlp_match_torch(device, config):
    torch_cls, lab_cls, kw = CONFIGS[config]
    ref_model = _mlp(device)
    _train(ref_model, torch_cls(ref_model.parameters(), foreach=False, **kw), 100, device)
    for version in _versions(device):
        model = _mlp(device)
        opt = lab_cls(model.parameters(), version=version, **kw)
        _train(model, opt, 100, device)
        for (name, a), b in zip(model.named_parameters(), ref_model.parameters()):
            torch.testing.assert_close(a, b, rtol=2e-4, atol=2e-5, msg=lambda m: f"{version} {name}: {m}")
        steps = {float(s["step"]) for s in opt.state.values()}
        assert steps == {100.0}


@pytest.mark.parametrize("device", devices())
def test_state_dict_interchanges_with_torch(device):
    kw = dict(lr=1e-3, weight_decay=0.01)
    for version in _versions(device):
        a = _mlp(device)
        ours = optim.AdamW(a.parameters(), version=version, **kw)
        _train(a, ours, 10, device)
        b = copy.deepcopy(a)
        theirs = torch.optim.AdamW(b.parameters(), foreach=False, **kw)
        theirs.load_state_dict(copy.deepcopy(ours.state_dict()))   # ours -> torch (a copy: torch keeps
        # the tensors it is given when dtype and device already match)
        _train(a, ours, 10, device, start=10)
        _train(b, theirs, 10, device, start=10)
        for x, y in zip(a.parameters(), b.parameters()):
            torch.testing.assert_close(x, y, rtol=2e-4, atol=2e-5)
        c = copy.deepcopy(b)
        back = optim.AdamW(c.parameters(), version=version, **kw)
        back.load_state_dict(copy.deepcopy(theirs.state_dict()))  # torch -> ours: steps come back as device float32
        assert all(s["step"].device.type == device and s["step"].dtype == torch.float32
                   for s in back.state.values())
        _train(b, theirs, 5, device, start=20)
        _train(c, back, 5, device, start=20)
        for x, y in zip(b.parameters(), c.parameters()):
            torch.testing.assert_close(x, y, rtol=2e-4, atol=2e-5)


@pytest.mark.parametrize("device", devices())
def test_bf16_model_state_dict_keeps_fp32_moments(device):
    m = _mlp(device, torch.bfloat16)
    opt = optim.AdamW(m.parameters(), version=_versions(device)[-1])
    _train(m, opt, 3, device)
    sd = copy.deepcopy(opt.state_dict())
    opt2 = optim.AdamW(m.parameters())
    opt2.load_state_dict(sd)
    for s1, s2 in zip(opt.state.values(), opt2.state.values()):
        assert s2["exp_avg"].dtype == torch.float32 and torch.equal(s1["exp_avg"], s2["exp_avg"])


@pytest.mark.parametrize("device", devices())
def test_params_without_grad_are_skipped_like_torch(device):
    for version in _versions(device):
        ps = [torch.nn.Parameter(torch.randn(n, device=device)) for n in (3, 17, 5)]
        qs = [torch.nn.Parameter(p.detach().clone()) for p in ps]
        ours, theirs = optim.AdamW(ps, lr=0.1, version=version), torch.optim.AdamW(qs, lr=0.1, foreach=False)
        g = torch.Generator().manual_seed(1)
        for step in range(6):
            grads = [torch.randn(p.shape, generator=g).to(device) for p in ps]
            for i, (p, q) in enumerate(zip(ps, qs)):
                have = not (i == 1 and step < 3) and not (i == 2 and step % 2)   # p1 starts late, p2 every other
                p.grad = grads[i].clone() if have else None
                q.grad = grads[i].clone() if have else None
            ours.step()
            theirs.step()
        for p, q in zip(ps, qs):
            torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
            assert float(ours.state[p]["step"]) == float(theirs.state[q]["step"])


@pytest.mark.parametrize("device", devices())
def test_lr_as_a_tensor(device):
    for version in _versions(device):
        ps = [torch.nn.Parameter(torch.randn(100, device=device))]
        qs = [torch.nn.Parameter(ps[0].detach().clone())]
        lr = torch.tensor(0.01, device=device)
        ours, theirs = optim.AdamW(ps, lr=lr, version=version), torch.optim.AdamW(qs, lr=0.01, foreach=False)
        for k in range(4):
            lr.fill_(0.01 * (k + 1))          # a schedule writing the tensor in place: the next step reads it
            theirs.param_groups[0]["lr"] = 0.01 * (k + 1)
            for p, q in zip(ps, qs):
                p.grad = torch.full_like(p, 0.5 - k)
                q.grad = p.grad.clone()
            ours.step()
            theirs.step()
        torch.testing.assert_close(ps[0], qs[0], rtol=1e-5, atol=1e-6)


# ---- CUDA graphs --------------------------------------------------------------------------------------------------
@needs_gpu
@pytest.mark.parametrize("version", ["v1", "v2", "v3", "v4"])
def test_captured_step_replays_like_eager_steps(version):
    def setup():
        torch.manual_seed(0)
        ps = [torch.nn.Parameter(torch.randn(n, device="cuda")) for n in (3, 70000, 513)]
        for p in ps:
            p.grad = torch.randn_like(p)
        return ps
    a, b = setup(), setup()
    lr = torch.tensor(1e-2, device="cuda")
    eager = optim.AdamW(a, lr=1e-2, version=version)
    graphed = optim.AdamW(b, lr=lr, version=version)
    eager.step()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        graphed.step()                        # warm-up (creates the state) off the capturing stream
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        graphed.step()
    for k in range(5):
        eager.param_groups[0]["lr"] = 1e-2 / (k + 1)
        lr.fill_(1e-2 / (k + 1))              # lr is read on the device: the replay sees the new value
        eager.step()
        g.replay()
    graphed.step()                            # an eager step after capture still uses its own table
    eager.step()
    torch.cuda.synchronize()
    for x, y in zip(a, b):
        torch.testing.assert_close(y, x, rtol=1e-6, atol=1e-7)
    assert {float(st["step"]) for st in graphed.state.values()} == {7.0}


@needs_gpu
@pytest.mark.parametrize("version", ["v1", "v4"])
def test_whole_training_step_captured(version):
    # torch's whole-network capture recipe: grads are allocated inside the capture, so the pointer table is
    # written inside the graph
    def run(graphed):
        model = _mlp("cuda")
        opt = optim.AdamW(model.parameters(), lr=1e-3, version=version)
        g = torch.Generator().manual_seed(0)
        data = [(torch.randn(32, 20, generator=g).cuda(), torch.randint(0, 5, (32,), generator=g).cuda())
                for _ in range(8)]
        if not graphed:
            for x, y in data:
                opt.zero_grad(set_to_none=True)
                F.cross_entropy(model(x), y).backward()
                opt.step()
            return model
        sx, sy = data[0][0].clone(), data[0][1].clone()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):              # warm-up: 3 real steps on the first batches
            for x, y in data[:3]:
                opt.zero_grad(set_to_none=True)
                F.cross_entropy(model(x), y).backward()
                opt.step()
        torch.cuda.current_stream().wait_stream(s)
        opt.zero_grad(set_to_none=True)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            F.cross_entropy(model(sx), sy).backward()
            opt.step()
        for x, y in data[3:]:
            sx.copy_(x), sy.copy_(y)
            graph.replay()
        return model
    ref, got = run(False), run(True)
    torch.cuda.synchronize()
    for a, b in zip(got.parameters(), ref.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


# ---- bad input: a named error, and nothing updated ----------------------------------------------------------------
def _snapshot(params):
    return [p.detach().clone() for p in params]


BAD_LISTS = {   # name: (change to the lists [params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps], error)
    "grad_none": (lambda L, d: L[1].__setitem__(1, None), ValueError, r"grads\[1\] is None"),
    "grad_shape": (lambda L, d: L[1].__setitem__(2, torch.randn(4, device=d)), ValueError,
                   r"grads\[2\] must have the same shape as params\[2\] = \(7,\), got \(4,\)"),
    "grad_dtype": (lambda L, d: L[1].__setitem__(0, L[1][0].double()), TypeError,
                   r"grads\[0\] must have the same dtype as params\[0\] \(Float\), got Double"),
    "grad_sparse": (lambda L, d: L[1].__setitem__(1, L[1][1].to_sparse()), ValueError, r"grads\[1\] is sparse"),
    "state_dtype": (lambda L, d: L[2].__setitem__(2, L[2][2].bfloat16()), TypeError,
                    r"exp_avgs\[2\] must be Float \(the optimizer state is fp32"),
    "step_shape": (lambda L, d: L[5].__setitem__(1, torch.zeros(2, device=d)), ValueError,
                   r"state_steps\[1\] must hold one element"),
    "param_twice": (lambda L, d: [L[k].__setitem__(2, L[0][0] if k == 0 else L[k][0].clone()) for k in range(4)],
                    ValueError, r"params\[0\] and params\[2\] share memory"),
    "param_int": (lambda L, d: L[0].__setitem__(1, torch.ones(5, dtype=torch.int32, device=d)), TypeError,
                  r"params\[1\] must be Float, BFloat16 or Half, got Int"),
}


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("case", list(BAD_LISTS))
def test_bad_lists_name_the_tensor_and_update_nothing(case, device):
    mutate, exc, msg = BAD_LISTS[case]
    lists = [list(x) for x in _lists([3, 5, 7], device)]
    mutate(lists, device)
    before = _snapshot([t for t in lists[0] if t is not None])
    with pytest.raises(exc, match=msg):
        _step(lists, _versions(device)[0])
    for a, b in zip([t for t in lists[0] if t is not None], before):
        assert torch.equal(a, b)


@pytest.mark.parametrize("device", devices())
def test_bad_hyperparameters_and_lengths(device):
    version = _versions(device)[0]
    lists = _lists([3], device)
    with pytest.raises(ValueError, match=r"lr must be >= 0"):
        _step(lists, version, lr=-1.0)
    with pytest.raises(ValueError, match=r"grads has 0 tensors, params has 1"):
        optim.adam_step(lists[0], [], *lists[2:], lr=1e-3, beta1=0.9, beta2=0.99, eps=1e-8, weight_decay=0,
                        decoupled=True, version=version)


def test_cuda_version_on_cpu_params_is_refused():
    with pytest.raises(ValueError, match=r"version 1 is a CUDA kernel but the params are on the CPU"):
        _step(_lists([3], "cpu"), "v1")


@needs_gpu
def test_cpu_version_on_cuda_params_is_refused():
    with pytest.raises(ValueError, match=r"version 0 is the C\+\+ CPU code but the params are on cuda:0"):
        _step(_lists([3], "cuda"), "cpu")


@pytest.mark.parametrize("device", devices())
def test_optimizer_checks_every_group_before_updating_any(device):
    # group 0 is fine, group 1 has a sparse grad: the step raises and group 0 is not touched either
    emb = torch.nn.Embedding(10, 4, sparse=True).to(device)
    lin = torch.nn.Linear(4, 3).to(device)
    opt = optim.AdamW([{"params": lin.parameters()}, {"params": emb.parameters()}], lr=0.1)
    lin(emb(torch.tensor([1, 2], device=device))).sum().backward()
    before = _snapshot(list(lin.parameters()) + list(emb.parameters()))
    with pytest.raises(ValueError, match=r"param group 1: params\[0\].grad is sparse .*SparseAdam"):
        opt.step()
    for a, b in zip(list(lin.parameters()) + list(emb.parameters()), before):
        assert torch.equal(a, b)
    assert all(float(s["step"]) == 0 for s in opt.state.values())


def test_optimizer_arguments_are_checked_like_torch():
    p = [torch.nn.Parameter(torch.randn(3))]
    with pytest.raises(ValueError, match="Invalid learning rate: -1"):
        optim.AdamW(p, lr=-1)
    with pytest.raises(ValueError, match="Invalid beta parameter at index 1: 1.0"):
        optim.AdamW(p, betas=(0.9, 1.0))
    with pytest.raises(ValueError, match="Invalid weight_decay value: -0.1"):
        optim.Adam(p, weight_decay=-0.1)
    with pytest.raises(ValueError, match="differentiable=True is not supported"):
        optim.AdamW(p, differentiable=True)
    with pytest.raises(ValueError, match="version must be 'cpu' or 'v<N>'"):
        optim.AdamW(p, version="fast")


@needs_gpu
def test_params_on_mixed_devices_are_refused_and_untouched():
    ps = [torch.nn.Parameter(torch.randn(4, device="cuda")), torch.nn.Parameter(torch.randn(4))]
    for p in ps:
        p.grad = torch.ones_like(p)
    opt = optim.AdamW(ps, lr=0.1)
    before = _snapshot(ps)
    with pytest.raises(ValueError, match=r"param group 0: params\[1\] must be on the same device as params\[0\] "
                                         r"\(cuda:0\), got cpu"):
        opt.step()
    for a, b in zip(ps, before):
        assert torch.equal(a, b)


# ---- the attempts of the notes ------------------------------------------------------------------------------------
@needs_nvcc
def test_std_vector_argument_does_not_compile():
    a = study.attempt_std_vector()
    assert not a.built and "__host__ function" in a.outcome


@needs_nvcc
def test_struct_by_value_stops_at_32764_bytes():
    fits, over = study.attempt_param_limit((2047, 2048))
    assert fits.built and not over.built
    assert "32764 bytes allowed" in over.outcome
    if HAS_GPU:
        assert "values_ok=yes" in fits.outcome


@needs_nvcc
@needs_gpu
def test_host_pointer_table_faults_and_device_table_works():
    host, dev = study.attempt_host_pointers()
    assert "error=cudaSuccess" in dev.outcome and "values_ok=yes" in dev.outcome
    # without HMM/ATS the GPU cannot read pageable host memory: the first load through the table faults
    assert "cudaErrorIllegalAddress" in host.outcome or "pageable_memory_access=1" in host.outcome
