"""Shared fixtures. CUDA tests skip, with the reason, where no GPU is visible; they run on the lent GPU."""
from __future__ import annotations

import pytest
import torch

HAS_GPU = torch.cuda.is_available()
needs_gpu = pytest.mark.skipif(not HAS_GPU, reason="no GPU visible (torch.cuda.is_available() is False); "
                                                  "these run on the lent GPU (.ci/gpu)")


def devices():
    """cpu always; cuda where a GPU is visible (a skipped cuda param says why otherwise)."""
    return ["cpu", pytest.param("cuda", marks=needs_gpu)]


def pytest_configure(config):
    # Without a GPU, compile the CUDA sources anyway (compile + link, no run) for the H100's arch, so CI catches a
    # .cu that no longer builds. Needs a CUDA build of torch and nvcc; test_compile_cuda skips with the reason if not.
    import os
    import shutil
    if not torch.cuda.is_available() and torch.version.cuda and shutil.which("nvcc"):
        os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0")
    # What the tests record (rows, checks, ceilings of this machine) goes to a scratch results folder, never into the
    # repository's results/ (its subprocesses inherit it too).
    if "LAB_RESULTS_DIR" not in os.environ:
        import tempfile
        os.environ["LAB_RESULTS_DIR"] = _SCRATCH["results"] = tempfile.mkdtemp(prefix="lab-test-results-")


_SCRATCH: dict = {}   # what pytest_configure made, removed when the session ends


def pytest_unconfigure(config):
    import shutil
    if "results" in _SCRATCH:
        shutil.rmtree(_SCRATCH.pop("results"), ignore_errors=True)


FAULTY = __import__("pathlib").Path(__file__).resolve().parent / "faulty"


@pytest.fixture
def faulty(tmp_path, monkeypatch):
    """The `faulty` test family (tests/faulty/) in a scratch source root with lab's shared headers, built, and
    registered in this process. Returns what lab.isolate's workers need: {"env": ..., "imports": [...], "root": ...}."""
    import importlib.util
    import shutil
    from lab import build, env
    root = tmp_path / "src"
    shutil.copytree(FAULTY / "cpp_src", root / "cpp_src")
    shutil.copytree(FAULTY / "cuda_src", root / "cuda_src")
    for rel in ("cpp_src/lab_common.h", "cpp_src/lab_unit.h", "cuda_src/lab_cuda.cuh"):
        shutil.copy(env.ROOT / rel, root / rel)
    monkeypatch.setattr(env, "SRC_ROOT", root)
    monkeypatch.setattr(env, "CPP_SRC", root / "cpp_src")
    monkeypatch.setattr(env, "CUDA_SRC", root / "cuda_src")
    monkeypatch.setenv("LAB_SRC_ROOT", str(root))
    mod_path = str(FAULTY / "faulty_family.py")
    if "lab_test_faulty_family" not in __import__("sys").modules:
        spec = importlib.util.spec_from_file_location("lab_test_faulty_family", mod_path)
        mod = importlib.util.module_from_spec(spec)
        __import__("sys").modules["lab_test_faulty_family"] = mod
        spec.loader.exec_module(mod)
    build.load("faulty", verbose=False)
    return {"env": {"LAB_SRC_ROOT": str(root)}, "imports": [mod_path], "root": root}
