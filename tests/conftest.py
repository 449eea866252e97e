"""Shared fixtures. CUDA tests skip, with the reason, where no GPU is visible; they run on the H100."""
from __future__ import annotations

import pytest
import torch

HAS_GPU = torch.cuda.is_available()
needs_gpu = pytest.mark.skipif(not HAS_GPU, reason="no GPU visible (torch.cuda.is_available() is False); "
                                                  "these run on the H100")


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
