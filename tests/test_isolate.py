"""lab.isolate: a version that crashes, hangs or faults is reported as that version's result; the caller lives on,
its CUDA context usable. The faulty versions live in tests/faulty/, not in any family of the lab."""
import torch

from conftest import needs_gpu
from lab import isolate, registry


def test_crash_and_hang_of_cpu_versions_are_results(faulty):
    op = registry.get("faulty").op("scale")
    rs = isolate.check_op(op, "cpu", versions=["cpu", "crash", "hang"], timeout=15, seeds=[0],
                          imports=faulty["imports"], env=faulty["env"])
    by = {r.version: r for r in rs}
    assert set(by) == {"cpu", "crash", "hang"}
    assert all(r.passed for r in rs if r.version == "cpu") and by["cpu"].rel_err == 0.0
    assert not by["crash"].passed and "worker died (SIGSEGV)" in by["crash"].problem
    assert not by["hang"].passed and "timed out after 15 s" in by["hang"].problem
    # this process never ran them: the right version still runs here
    x = torch.randn(5)
    assert torch.equal(op.version("cpu").fn(x), 2 * x)


def test_isolated_bench_reports_failures_and_keeps_rows(faulty):
    op = registry.get("faulty").op("scale")
    rows, bad = isolate.bench_op(op, "cpu", versions=["cpu", "crash"], timeout=60, record=False,
                                 imports=faulty["imports"], env=faulty["env"])
    assert {r["version"] for r in rows} == {"cpu", "torch"}            # the baseline once, beside the version
    assert sum(r["version"] == "torch" for r in rows) == len({(r["shape"], r["mode"]) for r in rows})
    assert [f.job.version for f in bad] == ["crash"] and "SIGSEGV" in bad[0].problem


@needs_gpu
def test_faulting_and_hung_kernels_leave_the_caller_usable(faulty):
    op = registry.get("faulty").op("scale")
    rs = isolate.check_op(op, "cuda", versions=["v1", "oob", "spin", "v1"], timeout=20, seeds=[0],
                          imports=faulty["imports"], env=faulty["env"])
    by = {}
    for r in rs:
        by.setdefault(r.version, []).append(r)
    assert all(r.passed for r in by["v1"])
    assert not any(r.passed for r in by["oob"])
    assert any("illegal" in r.problem.lower() or "CUDA error" in r.problem for r in by["oob"]), by["oob"]
    assert any("timed out after 20 s" in r.problem for r in by["spin"])
    # the caller's CUDA context is fine, and the right kernel still runs in this process
    assert torch.ones(3, device="cuda").sum().item() == 3.0
    x = torch.randn(1000, device="cuda")
    assert torch.equal(op.version("v1").fn(x), 2 * x)
