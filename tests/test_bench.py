"""lab.bench's parts that run without a GPU, with lab.timing's and lab.ceilings': the L2 flush's mode is checked
before anything touches a device; the speedups compare like with like."""
import pytest
import torch

from conftest import needs_gpu
from lab import bench, ceilings, timing


@pytest.mark.parametrize("how", ["arg", "env"])
def test_unknown_flush_mode_is_a_clear_error(how, monkeypatch):
    if how == "env":
        monkeypatch.setenv("LAB_FLUSH", "clean")
    with pytest.raises(ValueError, match=r"L2 flush mode must be one of \('write', 'read'\), got 'clean'"):
        timing.flush_l2("cpu", mode="clean" if how == "arg" else None)


def _row(version, mode, median, precision="float32", shape="n=8", ref="torch"):
    return {"version": version, "mode": mode, "median_us": median, "precision": precision, "dtype": "float32",
            "shape": shape, "_ref": ref}


def test_speedups_compare_like_with_like():
    """Graph rows against the baseline's graph replay, eager against eager, TF32 against the TF32 baseline; no ratio
    across modes or precisions (a graph row over an eager baseline flattered launch-bound kernels)."""
    rows = bench.assign_speedups([
        _row("torch", "events", 100.0), _row("torch", "graph", 40.0),
        _row("v2", "events", 50.0), _row("v2", "graph", 20.0),
        _row("torch.tf32", "events", 30.0, "tf32", ref="torch.tf32"), _row("v12", "events", 10.0, "tf32", ref="torch.tf32"),
        _row("v3", "graph", 10.0, shape="n=9"),                 # its shape has no baseline row in graph mode
        _row("v9", "events", 10.0, "tf32x3", ref=None),          # no baseline computes in that precision
    ])
    by = {(r["version"], r["mode"], r["shape"]): r for r in rows}
    assert by[("v2", "events", "n=8")]["speedup"] == 2.0 and by[("v2", "events", "n=8")]["baseline"] == "torch (events)"
    assert by[("v2", "graph", "n=8")]["speedup"] == 2.0 and by[("v2", "graph", "n=8")]["baseline"] == "torch (graph)"
    assert by[("v12", "events", "n=8")]["speedup"] == 3.0 and by[("v12", "events", "n=8")]["baseline"] == "torch.tf32 (events)"
    assert by[("v3", "graph", "n=9")]["speedup"] is None
    assert by[("v9", "events", "n=8")]["speedup"] is None and by[("v9", "events", "n=8")]["baseline"] is None
    assert all("_ref" not in r for r in rows)


def test_reference_baseline_matches_precision():
    from lab import registry
    op = registry.get("linear").op("linear")
    cuda = torch.device("cuda")
    assert bench.reference_baseline(op, cuda, torch.float32, "float32").name == "torch"
    assert bench.reference_baseline(op, cuda, torch.float32, "tf32").name == "torch.tf32"
    assert bench.reference_baseline(op, "cpu", torch.float32, "tf32") is None   # torch.tf32 runs on CUDA only


def test_fma_probe_is_the_harnesss_and_checks_its_input():
    """The FP32 FMA probe behind the 'fma' ceiling is the harness's own kernel (cuda_src/harness/), not a family's."""
    from lab import build
    ext = build.load("harness", verbose=False)
    with pytest.raises(ValueError, match=r"threads must be a multiple of 32 in \[32, 1024\], got 100"):
        ext.fma_peak(torch.empty(200), 2, 100, 8)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match=r"fma_peak: out must be a CUDA tensor, got cpu"):
            ext.fma_peak(torch.empty(64), 2, 32, 8)


@needs_gpu
def test_fma_peak_probe_runs():
    # the ceiling probe must produce finite output (it feeds every %-of-peak number)
    from lab import build
    out = torch.full((132 * 256,), float("nan"), device="cuda")
    build.load("harness", verbose=False).fma_peak(out, 132, 256, 8)
    assert torch.isfinite(out).all()
    assert ceilings.fma_peak_tflops() > 0


@pytest.mark.parametrize("args, message", [
    (dict(bytes_per_block=40), r"bytes_per_block must be a positive multiple of 16 .*got 40"),
    (dict(blocks=0), r"blocks must be at least 1, got 0"),
    (dict(src=torch.zeros(100, dtype=torch.uint8)), r"src must hold blocks \* bytes_per_block = 128 bytes, got 100"),
    (dict(src=torch.zeros(128)), r"src must be Byte, got Float"),
    (dict(sink=torch.zeros(2, 3, dtype=torch.int32)), r"sink must have shape \(blocks, 4\)"),
])
def test_smem_fill_probe_checks_its_input(args, message):
    from lab import build
    a = {**dict(src=torch.zeros(128, dtype=torch.uint8), blocks=2, bytes_per_block=64,
                sink=torch.zeros(2, 4, dtype=torch.int32)), **args}
    with pytest.raises((ValueError, TypeError), match=message):
        build.load("harness", verbose=False).smem_fill(a["src"], a["blocks"], a["bytes_per_block"], a["sink"])


def test_smem_fill_probe_wants_cuda_tensors():
    from lab import build
    if torch.cuda.is_available():
        pytest.skip("the CPU-tensor message is checked where there is no GPU")
    with pytest.raises(ValueError, match=r"smem_fill: src and sink must be CUDA tensors, got cpu and cpu"):
        build.load("harness", verbose=False).smem_fill(torch.zeros(128, dtype=torch.uint8), 2, 64,
                                                      torch.zeros(2, 4, dtype=torch.int32))


@needs_gpu
@pytest.mark.parametrize("blocks, nbytes", [(1, 16), (3, 48), (132, 160 * 1024 + 16), (7, 32768 * 3 + 4096)])
def test_smem_fill_probe_lands_every_block(blocks, nbytes):
    # each block reads its slice's last 16 bytes back from shared memory: they must be the source's
    from lab import build
    src = torch.randint(0, 256, (blocks * nbytes,), dtype=torch.uint8, device="cuda")             # (blocks*nbytes,)
    sink = torch.full((blocks, 4), -1, dtype=torch.int32, device="cuda")                             # (blocks, 4)
    build.load("harness", verbose=False).smem_fill(src, blocks, nbytes, sink)
    want = src.view(blocks, nbytes)[:, -16:].contiguous().view(torch.int32)                         # (blocks, 4)
    assert torch.equal(sink, want)
    assert ceilings.smem_fill(nbytes, blocks).median_us > 0


@needs_gpu
def test_a_call_that_waits_for_the_gpu_is_told_apart_and_timed_in_series():
    a = torch.randn(1 << 10, device="cuda")                         # (1024,)
    assert timing.waits_for_the_gpu(lambda: a.sum().item())
    assert not timing.waits_for_the_gpu(lambda: a + a)
    t = timing.time_cuda(lambda: a.sum().item(), flush=False, min_reps=5, max_reps=5)
    assert t.gpu_us is None and t.reps == 5 and t.mode == "events"


@needs_gpu
def test_each_repetition_is_the_slower_of_the_gpu_and_the_host():
    a = torch.randn(1 << 20, device="cuda")                         # (1M,)
    t = timing.time_cuda(lambda: a * 2, min_reps=7, max_reps=7)
    assert len(t.gpu_us) == len(t.host_us) == t.reps == 7
    assert t.times_us == [max(g, h) for g, h in zip(t.gpu_us, t.host_us)]
    assert all(g > 0 for g in t.gpu_us) and all(h > 0 for h in t.host_us)


def test_summary_table_shows_the_gpu_part_beside_the_median():
    """A host-bound row (its median above its GPU part) shows both numbers; a row without a GPU part shows '-'."""
    base = {"op": "forward", "dtype": "float32", "shape": "n=8", "gbps": None, "pct_copy_bw": None, "tflops": None,
            "pct_peak": None, "speedup": None}
    text = bench.summary_table([{**base, "version": "v5", "mode": "events", "median_us": 24.35, "gpu_us": 7.71},
                                {**base, "version": "cpu", "mode": "cpu", "median_us": 310.0, "gpu_us": None}])
    head, v5, cpu = text.splitlines()
    assert "median us    GPU us" in head
    assert v5.split()[:6] == ["forward", "v5", "float32", "n=8", "24.35", "7.71"]
    assert cpu.split()[4:6] == ["310.00", "-"]
