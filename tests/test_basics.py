"""CUDA basics (square, vector_add, stencil_1d, matmul): every version against the float64 reference, odd sizes,
poisoned outputs, several seeds; and bad input gives an error that names the argument."""
import pytest
import torch

from lab import registry, verify
from lab.kernels import basics

from conftest import devices, needs_gpu

FAM = registry.get("basics")


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("op", [o.name for o in FAM.ops])
def test_every_version_matches_reference(op, device):
    verify.assert_op_passes(FAM.op(op), device)


@needs_gpu
@pytest.mark.parametrize("version", ["v1", "v2", "v3", "v4"])
def test_vectorised_versions_take_misaligned_views(version):
    # x[1:] is contiguous but 4 bytes past a 16-byte boundary: v2-v4 must fall back to v1, not fault or misread
    g = torch.Generator().manual_seed(0)
    base = torch.randn(4099, generator=g).cuda()
    x, b = base[1:], base.flip(0)[1:].contiguous()
    if version in ("v1", "v2"):                          # (square's ladder stops at v2)
        torch.testing.assert_close(basics.square(x, version=version), x * x, rtol=0, atol=0)
    torch.testing.assert_close(basics.vector_add(x, b, version=version), x + b, rtol=0, atol=0)


@needs_gpu
@pytest.mark.parametrize("version", ["v3", "v4"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_vector_add_large_and_ragged(version, dtype):
    # v3: n past several full grids (132 SMs x 2048 threads x 2 vectors per trip), so the second load of a trip and
    # later trips run; v4: a last tile partly filled; both: n not a multiple of the vector width (the scalar tail).
    # The output is poisoned first
    for n in ((1 << 23) + 5, 1023, 1025 + 2):
        g = torch.Generator().manual_seed(n)
        a, b = (torch.randn(n, generator=g, dtype=dtype).cuda() for _ in range(2))
        out = torch.full((n,), float("nan"), dtype=dtype, device="cuda")
        basics.vector_add(a, b, out=out, version=version)
        torch.testing.assert_close(out, a + b, rtol=0, atol=0)


@needs_gpu
def test_large_matmul_tiles_against_float64():
    g = torch.Generator().manual_seed(3)
    A = torch.randn(1000, 777, generator=g).cuda()
    B = torch.randn(777, 513, generator=g).cuda()
    for v in ("v1", "v2"):
        verify.assert_close(basics.matmul(A, B, version=v), A.double() @ B.double(), torch.float32, what=v)


@pytest.mark.parametrize("device", devices())
def test_bad_input_names_the_argument(device):
    x = torch.randn(10, device=device)
    cuda_v = "v1" if device == "cuda" else "cpu"
    with pytest.raises(TypeError, match=r"x must be Float or Double, got Int"):
        basics.square(torch.ones(10, dtype=torch.int32, device=device), version=cuda_v)
    with pytest.raises(ValueError, match=r"x must be contiguous"):
        basics.square(torch.randn(10, 4, device=device).t(), version=cuda_v)
    with pytest.raises(ValueError, match=r"b must have the same shape as a = \(10,\), got \(9,\)"):
        basics.vector_add(x, x[:9], version=cuda_v)
    with pytest.raises(TypeError, match=r"b must have the same dtype as a"):
        basics.vector_add(x, x.double(), version=cuda_v)
    with pytest.raises(ValueError, match=r"B must have shape \(K, N\) with K = A.size\(1\) = 5, got \(4, 3\)"):
        basics.matmul(torch.randn(2, 5, device=device), torch.randn(4, 3, device=device), version=cuda_v)
    with pytest.raises(ValueError, match=r"x must be 1-D \(n,\), got 2-D"):
        basics.stencil_1d(torch.randn(3, 3, device=device), version=cuda_v)
    with pytest.raises(ValueError, match=r"out must have shape like x = \(10,\), got \(11,\)"):
        basics.square(x, out=torch.empty(11, device=device), version=cuda_v)


def test_cuda_version_on_cpu_tensor_is_refused():
    with pytest.raises(ValueError, match=r"version 2 is a CUDA kernel but x is on the CPU"):
        basics.square(torch.randn(4), version="v2")
    with pytest.raises(ValueError, match="version must be 'cpu' or 'v<N>'"):
        basics.square(torch.randn(4), version="fast")


@needs_gpu
def test_mixed_devices_are_refused():
    with pytest.raises(ValueError, match=r"b must be on the same device as a \(cuda:0\), got cpu"):
        basics.vector_add(torch.randn(4, device="cuda"), torch.randn(4), version="v1")


@pytest.mark.parametrize("device", devices())
def test_out_sharing_memory_with_an_input(device):
    """An output that shares memory with an input the kernel still reads is refused by name (otherwise a stencil reads
    its own output and a GEMM overwrites rows it reads: a silently wrong answer); the elementwise ops run in place, and
    that matches the reference."""
    dev = torch.device(device)
    g = torch.Generator().manual_seed(5)
    for v in [v.name for v in FAM.op("stencil_1d").versions_for(dev, torch.float32, kernels_only=True)]:
        x = torch.randn(300, generator=g).to(dev)   # (n,)
        with pytest.raises(ValueError, match=r"out shares memory with x: the kernel reads x while it writes out"):
            basics.stencil_1d(x, out=x, version=v)
        with pytest.raises(ValueError, match=r"out shares memory with x"):
            basics.stencil_1d(x[:299], out=x[1:], version=v)   # shifted by one: a partial overlap
    for v in [v.name for v in FAM.op("matmul").versions_for(dev, torch.float32, kernels_only=True)]:
        A, B = torch.randn(40, 40, generator=g).to(dev), torch.randn(40, 40, generator=g).to(dev)   # (M, K), (K, N)
        with pytest.raises(ValueError, match=r"out shares memory with A"):
            basics.matmul(A, B, out=A, version=v)
        with pytest.raises(ValueError, match=r"out shares memory with B"):
            basics.matmul(A, B, out=B, version=v)
    for v in [v.name for v in FAM.op("square").versions_for(dev, torch.float32, kernels_only=True)]:
        x = torch.randn(1027, generator=g).to(dev)
        want = x.double() ** 2
        assert basics.square(x, out=x, version=v) is not None
        assert verify.compare(x, want).rel_err <= verify.tolerance(torch.float32), v
        with pytest.raises(ValueError, match=r"out overlaps x without being exactly it"):
            basics.square(x[:1026], out=x[1:], version=v)
    for v in [v.name for v in FAM.op("vector_add").versions_for(dev, torch.float32, kernels_only=True)]:
        a, b = torch.randn(1027, generator=g).to(dev), torch.randn(1027, generator=g).to(dev)
        want = a.double() + b.double()
        basics.vector_add(a, b, out=b, version=v)
        assert verify.compare(b, want).rel_err <= verify.tolerance(torch.float32), v
