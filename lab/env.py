"""Where things live and what machine we are on.

Everything that records a number (results table, ceilings, build times) stamps it with `machine()`, so a row
always says which GPU, which torch and which commit produced it.
"""
from __future__ import annotations

import functools
import logging
import os
import platform
import re
import shutil
import subprocess
from pathlib import Path


def _set_cuda_home() -> None:
    """torch finds CUDA_HOME as dirname(dirname(which nvcc)) without resolving links: /usr/local/bin/nvcc -> a
    CUDA_HOME of /usr/local with no CUDA headers. Point it at the real toolkit before cpp_extension is imported."""
    if os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH"):
        return
    nvcc = shutil.which("nvcc")
    candidates = ([Path(nvcc).resolve().parent.parent] if nvcc else []) + [Path("/usr/local/cuda")]
    for home in candidates:  # a wrapper script on PATH is not the toolkit: look for its headers
        if (home / "include" / "cuda_runtime.h").exists():
            os.environ["CUDA_HOME"] = str(home)
            return


_set_cuda_home()  # before anything imports torch.utils.cpp_extension (torch.utils.benchmark does)


def _quiet_no_cuda_runtime() -> None:
    """cpp_extension warns "No CUDA runtime is found, using CUDA_HOME=..." on import on every machine without a GPU,
    i.e. on every command there: no news to someone who knows the machine has no GPU (lab says which CUDA sources it
    did not compile, and how to). Only that one message is dropped."""
    class _Drop(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            return not str(record.msg).startswith("No CUDA runtime is found")

    logging.getLogger("torch.utils.cpp_extension").addFilter(_Drop())


_quiet_no_cuda_runtime()

# Without a GPU, a CUDA build of torch's profiler (kineto) logs "gpuGetDeviceCount failed with code 35" at ERROR on
# every profiled call: no news on a machine known to have none. Its log level (read when torch loads kineto) is raised
# past ERROR there only; where a GPU driver is present its errors still show.
if not Path("/dev/nvidiactl").exists():
    os.environ.setdefault("KINETO_LOG_LEVEL", "5")

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
# Kernel sources: the repository's, unless LAB_SRC_ROOT points at another tree with cuda_src/ and cpp_src/ (the build
# timing and hot-reload tests edit a copy there, never the repository's files).
SRC_ROOT = Path(os.environ.get("LAB_SRC_ROOT", ROOT))
CUDA_SRC = SRC_ROOT / "cuda_src"
CPP_SRC = SRC_ROOT / "cpp_src"
# results/<device>/ per machine (the GPU's name, or the CPU's model): a run on one machine never rewrites another's rows,
# plots, ceilings or summary. $LAB_RESULTS_DIR moves the root (tests use a scratch one).
RESULTS = Path(os.environ.get("LAB_RESULTS_DIR", ROOT / "results"))


def slug(name: str) -> str:
    """A device's folder name: 'NVIDIA H100 80GB HBM3' -> 'nvidia-h100-80gb-hbm3'."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "unknown-device"


def results_root() -> Path:
    return Path(os.environ.get("LAB_RESULTS_DIR", RESULTS))


def device_dir(name: str) -> Path:
    """results/<slug of the device name>/: that device's results.csv, checks.csv, build_times.csv, ceilings.json,
    SUMMARY.md, plots/, profiles/ and executed notebooks."""
    return results_root() / slug(name)


def results_dir(device: torch.device | str | None = None) -> Path:
    """This machine's results folder for `device` (default: the GPU if there is one, else the CPU)."""
    return device_dir(device_name(device if device is not None else default_device()))


def device_dirs() -> list[Path]:
    """Every device folder under results/ that holds anything."""
    root = results_root()
    return sorted(d for d in root.iterdir() if d.is_dir() and any(d.iterdir())) if root.exists() else []


def cache_dir() -> Path:
    """Build cache root: $LAB_CACHE_DIR, else $XDG_CACHE_HOME/kernel-lab, else ~/.cache/kernel-lab."""
    if "LAB_CACHE_DIR" in os.environ:
        return Path(os.environ["LAB_CACHE_DIR"])
    base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return base / "kernel-lab"


def has_gpu() -> bool:
    return torch.cuda.is_available()


def default_device() -> torch.device:
    return torch.device("cuda" if has_gpu() else "cpu")


@functools.lru_cache(maxsize=None)
def git_commit() -> str:
    """Short commit of the working tree, with '+dirty' when sources differ from it; 'unknown' outside git.

    $LAB_COMMIT overrides it: a copy of the tree without .git (the lent GPU box) is told which commit it is."""
    if os.environ.get("LAB_COMMIT"):
        return os.environ["LAB_COMMIT"]
    try:
        sha = subprocess.run(["git", "rev-parse", "--short=10", "HEAD"], cwd=ROOT, capture_output=True,
                             text=True, timeout=5).stdout.strip()
        if not sha:
            return "unknown"
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "lab", "cuda_src", "cpp_src"], cwd=ROOT,
                               capture_output=True, text=True, timeout=5).stdout.strip()
        return sha + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


@functools.lru_cache(maxsize=None)
def cpu_model() -> str:
    """The CPU's model name ("AMD EPYC 7B13"), not just its architecture: CPU rows and ceilings are keyed by it."""
    try:
        for ln in Path("/proc/cpuinfo").read_text().splitlines():
            if ln.lower().startswith("model name"):
                return ln.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def device_name(device: torch.device | str) -> str:
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return cpu_model()


@functools.lru_cache(maxsize=None)
def machine(device: str = "cuda" if torch.cuda.is_available() else "cpu") -> dict:
    """The stamp every recorded number carries."""
    info = {
        "device": torch.device(device).type,
        "device_name": device_name(device),
        "torch": torch.__version__,
        "cuda": torch.version.cuda or "none",
        "commit": git_commit(),
    }
    if info["device"] == "cuda":
        p = torch.cuda.get_device_properties(device)
        info.update(sm_count=p.multi_processor_count, capability=f"{p.major}.{p.minor}",
                    l2_bytes=getattr(p, "L2_cache_size", 0), mem_bytes=p.total_memory)
    else:
        info.update(cpu_threads=torch.get_num_threads())
    return info
