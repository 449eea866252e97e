"""linear (nn.Linear forward; ops linear, gemv, fc_out): every version against the float64 reference on awkward sizes
with poisoned outputs and several seeds; against nn.Linear itself for 2-D, 3-D and 1-D inputs with and without bias;
the weight read in place; the tensor-core versions beside cuBLAS at the same precision (TF32 on float32 tensors, bf16
on bfloat16 ones: one version name each); the GEMV at the decoder's shape; bad input names the argument."""
import pytest
import torch

from lab import registry, verify
from lab.kernels import linear as L

from conftest import devices, needs_gpu

FAM = registry.get("linear")
CUDA_F32 = list(L.IDEAS)                                               # v1 .. v12
CUDA_BF16 = [v for v in L.IDEAS if torch.bfloat16 in L.DTYPES.get(v, ())]  # v10, v11: the same names as on fp32


def _versions(device: str, dtype: torch.dtype) -> list[str]:
    if device == "cpu":
        return ["cpu"]
    return CUDA_BF16 if dtype == torch.bfloat16 else CUDA_F32


def _precision(version: str, dtype: torch.dtype) -> str | None:
    return FAM.op("linear").version(version).precision_at(dtype)


def test_precision_is_a_dimension_of_a_version():
    # one name per rung: the tensor-core rungs run both dtypes, TF32 on float32 and bf16 on bfloat16
    assert CUDA_BF16 == ["v10", "v11"] and L.LADDER == [f"v{i}" for i in range(1, 13)]
    op = FAM.op("linear")
    assert [v.name for v in op.versions if not v.baseline] == ["cpu"] + L.LADDER
    for v in CUDA_BF16:
        assert op.version(v).precision_at(torch.float32) == "tf32"
        assert op.version(v).precision_at(torch.bfloat16) is None
    assert [v.name for v in FAM.op("gemv").versions] == ["cpu", "v1", "torch"]


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("op", [o.name for o in FAM.ops])
def test_every_version_matches_reference(op, device):
    verify.assert_op_passes(FAM.op(op), device)


@pytest.mark.parametrize("device", devices())
def test_large_odd_sizes(device):
    # The 1000x777x513 and friends (lab.kernels.linear.CHECK_LARGE), every version, two seeds.
    rs = verify.check_op(FAM.op("linear"), device, shapes=L.CHECK_LARGE, seeds=range(2))
    assert rs, "no version ran"
    bad = [r.details() for r in rs if not r.passed]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("device,dtype", [("cpu", torch.float32),
                                          pytest.param("cuda", torch.float32, marks=needs_gpu),
                                          pytest.param("cuda", torch.bfloat16, marks=needs_gpu)])
@pytest.mark.parametrize("in_features", [129, 136])  # 136: every 16-byte / TMA path; 129: the scalar fallbacks
@pytest.mark.parametrize("lead", [(37,), (3, 11), (2, 3, 5), ()], ids=["2d", "3d", "4d", "1d"])
@pytest.mark.parametrize("bias", [True, False])
def test_matches_nn_linear(device, dtype, in_features, lead, bias):
    # The module itself is the reference: its weight (out_features, in_features) goes in as stored; float64 copy.
    torch.manual_seed(in_features + len(lead) * 7 + bias)
    layer = torch.nn.Linear(in_features, 67, bias=bias).to(device=device, dtype=dtype)
    ref_layer = torch.nn.Linear(in_features, 67, bias=bias, dtype=torch.float64)
    ref_layer.load_state_dict({k: v.double().cpu() for k, v in layer.state_dict().items()})
    x = torch.randn(*lead, in_features, device=device).to(dtype)
    with torch.no_grad():
        ref = ref_layer(x.double().cpu())
    for v in _versions(device, dtype):
        y = L.linear(x, layer.weight.detach(), layer.bias.detach() if bias else None, version=v)
        assert y.shape == ref.shape, f"{v}: shape {tuple(y.shape)}, nn.Linear gives {tuple(ref.shape)}"
        verify.assert_close(y, ref, dtype, _precision(v, dtype), what=f"{v} {tuple(x.shape)} bias={bias}")


@pytest.mark.parametrize("device", devices())
def test_default_version_and_empty_sizes(device):
    x, w, b = torch.randn(6, 0, device=device), torch.randn(5, 0, device=device), torch.randn(5, device=device)
    torch.testing.assert_close(L.linear(x, w, b), b.expand(6, 5))          # K = 0: y = bias
    torch.testing.assert_close(L.linear(x, w), torch.zeros(6, 5, device=device))
    assert L.linear(torch.randn(0, 3, device=device), torch.randn(4, 3, device=device)).shape == (0, 4)
    x, w = torch.randn(3, 8, device=device), torch.randn(4, 8, device=device)
    verify.assert_close(L.linear(x, w), x.double() @ w.double().T, torch.float32)


@needs_gpu
def test_weight_is_read_in_place():
    # No version allocates anything (a transposed copy of the weight would): the peak stays at what was allocated.
    g = torch.Generator().manual_seed(0)
    for dtype, versions in ((torch.float32, CUDA_F32), (torch.bfloat16, CUDA_BF16)):
        x = torch.randn(300, 264, generator=g).to("cuda", dtype)
        w = torch.randn(520, 264, generator=g).to("cuda", dtype)
        b = torch.randn(520, generator=g).to("cuda", dtype)
        out = torch.empty(300, 520, device="cuda", dtype=dtype)
        for v in versions:
            L.linear(x, w, b, out=out, version=v)  # first call: module load, attributes
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
            L.linear(x, w, b, out=out, version=v)
            torch.cuda.synchronize()
            assert torch.cuda.max_memory_allocated() == before, f"{v} allocated device memory"


@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_misaligned_operands_take_the_scalar_paths(dtype):
    # Contiguous views starting one element past a 16-byte boundary: the 16-byte loads, cp.async and TMA paths
    # must fall back, not fault or misread. K = 264 would otherwise take every vector path.
    g = torch.Generator().manual_seed(1)
    M, N, K = 131, 257, 264
    xs = torch.randn(M * K + 1, generator=g).to("cuda", dtype)
    ws = torch.randn(N * K + 1, generator=g).to("cuda", dtype)
    bs = torch.randn(N + 1, generator=g).to("cuda", dtype)
    x, w, b = xs[1:].view(M, K), ws[1:].view(N, K), bs[1:]
    ref = torch.nn.functional.linear(x.double(), w.double(), b.double())
    for v in _versions("cuda", dtype):
        out = torch.empty(M * N + 1, device="cuda", dtype=dtype)[1:].view(M, N)
        verify.assert_close(L.linear(x, w, b, out=out, version=v), ref, dtype, _precision(v, dtype), what=v)


@needs_gpu
@pytest.mark.parametrize("version,baseline,dtype,factor", [("v10", "torch.tf32", torch.float32, 2),
                                                           ("v11", "torch.tf32", torch.float32, 3),
                                                           ("v10", "torch", torch.bfloat16, 2),
                                                           ("v11", "torch", torch.bfloat16, 2)])
def test_tensor_core_error_is_cublas_error(version, baseline, dtype, factor):
    # Same precision side by side: our TF32/bf16 error against float64 stays within 2x cuBLAS's own at that precision.
    # v11 on float32 feeds fp32 bits to wgmma, which truncates them to TF32 (v10 rounds with cvt.rna): truncation's
    # error is 2.6x rounding's in theory and measured so on the H100 (5.4e-4 vs 2.1e-4), hence 3x for it.
    op = FAM.op("linear")
    base = op.version(baseline)
    for seed in range(3):
        x, w, b = op.make_inputs({"M": 512, "N": 768, "K": 1024}, dtype, "cuda", torch.Generator().manual_seed(seed))
        ref = L.linear_ref(x.double(), w.double(), b.double())
        ours = verify.compare(L.linear(x, w, b, version=version), ref).rel_err
        theirs = verify.compare(base.fn(x, w, b), ref).rel_err
        assert ours <= factor * theirs, f"{version}: rel err {ours:.2e}, cuBLAS ({baseline}) {theirs:.2e}"


@needs_gpu
def test_gemv_at_the_decoder_shape():
    # fc_out at batch 1, 1-D input as the decoder has it: (1280,) -> (5893,). The layer's parameters require grad and
    # the kernels have no backward (the bindings refuse them under grad mode): inference runs under no_grad.
    g = torch.Generator().manual_seed(2)
    layer = torch.nn.Linear(1280, 5893).cuda()
    x = torch.randn(1280, generator=g).cuda()
    ref = torch.nn.functional.linear(x.double(), layer.weight.double(), layer.bias.double())
    assert L.fastest(x) == ("gemv", "v1")
    with torch.no_grad():
        runs = {"gemv v1": (L.gemv(x, layer.weight, layer.bias, version="v1"), None),
                "default": (L.linear(x, layer.weight, layer.bias), None)}   # the fastest: gemv's v1 at one row
        for v in (L.BEST_SIMT, "v11"):
            runs[f"linear {v}"] = (L.linear(x, layer.weight, layer.bias, version=v), _precision(v, torch.float32))
    for name, (y, precision) in runs.items():
        assert y.shape == (5893,)
        verify.assert_close(y, ref, torch.float32, precision, what=name)
    with pytest.raises(ValueError, match=r"gemv: weight requires grad, but this kernel has no backward"):
        L.gemv(x, layer.weight, layer.bias.detach())


@needs_gpu
@pytest.mark.parametrize("m", [5, 9, 16, 64, 128, 129, 300])
def test_split_k_at_the_decoder_shape(m):
    # v12 where v8's 128x128 tiles cannot fill the GPU: fc_out (5893 x 1280) from a few rows to past two row tiles;
    # K split over a cluster of up to 8 blocks, partial tiles summed in distributed shared memory; poisoned output
    g = torch.Generator().manual_seed(m)
    x = torch.randn(m, 1280, generator=g).cuda()
    w = (torch.randn(5893, 1280, generator=g) / 1280 ** 0.5).cuda()
    b = torch.randn(5893, generator=g).cuda()
    ref = torch.nn.functional.linear(x.double(), w.double(), b.double())
    out = torch.full((m, 5893), float("nan"), device="cuda")
    verify.assert_close(L.linear(x, w, b, out=out, version="v12"), ref, torch.float32, what=f"v12 M={m}")
    verify.assert_close(L.linear(x, w, out=torch.full_like(out, float("nan")), version="v12"),
                        ref - b.double(), torch.float32, what=f"v12 M={m} no bias")
    props = torch.cuda.get_device_properties(0)
    few_tiles = -(-m // 128) * -(-5893 // 128) < props.multi_processor_count   # v8's tiles cannot fill the GPU
    if m > L.GEMV_ROWS:
        assert L.fastest(x, 5893) == ("linear", "v12" if props.major >= 9 and few_tiles else L.BEST_SIMT)
    verify.assert_close(L.linear(x, w, b), ref, torch.float32, what=f"default M={m}")


@pytest.mark.parametrize("device", devices())
def test_bad_input_names_the_argument(device):
    v = "v8" if device == "cuda" else "cpu"
    x, w, b = torch.randn(4, 5, device=device), torch.randn(3, 5, device=device), torch.randn(3, device=device)
    with pytest.raises(ValueError, match=r"weight must have shape \(out_features, in_features\) with in_features = "
                                         r"x.size\(-1\) = 5, got \(3, 4\)"):
        L.linear(x, torch.randn(3, 4, device=device), b, version=v)
    with pytest.raises(TypeError, match=r"x must be Float or BFloat16, got Int"):
        L.linear(torch.ones(4, 5, dtype=torch.int32, device=device), w, b, version=v)
    with pytest.raises(TypeError, match=r"weight must have the same dtype as x \(Float\), got Double"):
        L.linear(x, w.double(), b, version=v)
    with pytest.raises(TypeError, match=r"bias must have the same dtype as x \(Float\), got BFloat16"):
        L.linear(x, w, b.bfloat16(), version=v)
    with pytest.raises(ValueError, match=r"x must be contiguous"):
        L.linear(torch.randn(5, 4, device=device).t(), w, b, version=v)
    with pytest.raises(ValueError, match=r"weight must be contiguous"):
        L.linear(x, torch.randn(5, 3, device=device).t(), b, version=v)
    with pytest.raises(ValueError, match=r"bias must be contiguous"):
        L.linear(x, w, torch.randn(3, 2, device=device)[:, 0], version=v)
    with pytest.raises(ValueError, match=r"bias must have shape \(out_features,\) = \(3,\), got \(4,\)"):
        L.linear(x, w, torch.randn(4, device=device), version=v)
    with pytest.raises(ValueError, match=r"weight must be 2-D \(out_features, in_features\), got 3-D"):
        L.linear(x, w.view(3, 5, 1), b, version=v)
    with pytest.raises(ValueError, match=r"out must have shape \(\.\.\., out_features\) = \(4, 3\), got \(3, 4\)"):
        L.linear(x, w, b, out=torch.empty(3, 4, device=device), version=v)
    # no backward: a weight that requires grad is an error under grad mode, not an output that silently does not
    layer = torch.nn.Linear(5, 3, device=device)
    with pytest.raises(ValueError, match=r"linear: weight requires grad, but this kernel has no backward"):
        L.linear(x, layer.weight, layer.bias.detach(), version=v)
    with pytest.raises(ValueError, match=r"linear: bias requires grad"):
        L.linear(x, layer.weight.detach(), layer.bias, version=v)
    with torch.no_grad():
        y = L.linear(x, layer.weight, layer.bias, version=v)
    torch.testing.assert_close(y, x @ layer.weight.detach().T + layer.bias.detach(), rtol=1e-4, atol=1e-5)


def test_versions_and_devices_must_agree():
    x, w = torch.randn(4, 5), torch.randn(3, 5)
    with pytest.raises(ValueError, match=r"version 8 is a CUDA kernel but x is on the CPU"):
        L.linear(x, w, version="v8")
    with pytest.raises(TypeError, match=r"the C\+\+ CPU version takes Float tensors, got BFloat16"):
        L.linear(x.bfloat16(), w.bfloat16(), version="cpu")
    with pytest.raises(ValueError, match="version must be 'cpu' or 'v<N>'"):
        L.linear(x, w, version="fast")
    with pytest.raises(ValueError, match=r"gemv: version 1 is a CUDA kernel but x is on the CPU"):
        L.gemv(x, w, version="v1")
    torch.testing.assert_close(L.gemv(x, w), x @ w.T)                      # the C++ CPU code serves both ops


@needs_gpu
def test_cuda_bad_input():
    x, w = torch.randn(4, 5, device="cuda"), torch.randn(3, 5, device="cuda")
    with pytest.raises(ValueError, match=r"weight must be on the same device as x \(cuda:0\), got cpu"):
        L.linear(x, w.cpu(), version="v8")
    with pytest.raises(ValueError, match=r"bias must be on the same device as x \(cuda:0\), got cpu"):
        L.linear(x, w, torch.randn(3), version="v8")
    for v in (8, 12):  # v12 too, the float32 rung numbered above the bf16 ones: never a float kernel on bf16 data
        with pytest.raises(TypeError, match=rf"version {v} takes Float tensors \(x, weight, bias, out\), got "
                                            r"BFloat16 \(the bfloat16 versions are 10 and 11\)"):
            L.linear(x.bfloat16(), w.bfloat16(), version=f"v{v}")
    with pytest.raises(ValueError, match=r"linear: CUDA versions are 1..12, got 13"):
        L.ext().linear(x, w, None, torch.empty(4, 3, device="cuda"), 13)
    with pytest.raises(ValueError, match=r"gemv: CUDA versions are 1..1, got 2"):
        L.gemv(x, w, version="v2")
    with pytest.raises(TypeError, match=r"gemv: version 1 takes Float tensors \(x, weight, bias, out\), got BFloat16"):
        L.gemv(x.bfloat16(), w.bfloat16())
    with pytest.raises(ValueError, match=r"version 0 is the C\+\+ CPU code but x is on cuda:0 \(move to the CPU"):
        L.linear(x, w, version="cpu")


@pytest.mark.parametrize("device", devices())
def test_out_sharing_memory_with_an_input_is_refused(device):
    """out = x (in_features = out_features, so the shapes allow it) would have the GEMM overwrite rows of x that other
    tiles still read: refused with the argument's name, for every version of both ops (a silently wrong answer
    before: all zeros on the CPU)."""
    dev = torch.device(device)
    g = torch.Generator().manual_seed(11)
    for op, fn in (("linear", L.linear), ("gemv", L.gemv)):
        for v in [v.name for v in FAM.op(op).versions_for(dev, torch.float32, kernels_only=True)]:
            x, w = torch.randn(40, 40, generator=g).to(dev), torch.randn(40, 40, generator=g).to(dev)  # (M, K), (N, K)
            b = torch.randn(40, generator=g).to(dev)
            with pytest.raises(ValueError, match=r"out shares memory with x: the kernel reads x while it writes out"):
                fn(x, w, b, out=x, version=v)
            with pytest.raises(ValueError, match=r"out shares memory with weight"):
                fn(x, w, b, out=w, version=v)
            with pytest.raises(ValueError, match=r"out shares memory with bias"):
                fn(x[:1], w, b, out=b.view(1, 40), version=v)
