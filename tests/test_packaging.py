"""pyproject.toml, environment.yml and the build agree on the oldest torch the lab builds with (lab's import layers:
tests/test_imports.py)."""
import re
import tomllib

from lab import build, env


def _floor(spec: str) -> tuple[int, int]:
    m = re.search(r"torch\s*>=\s*(\d+)\.(\d+)", spec)
    assert m, f"no torch>=X.Y in {spec!r}"
    return int(m.group(1)), int(m.group(2))


def test_torch_floor_is_the_same_everywhere():
    deps = tomllib.loads((env.ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    py = _floor(next(d for d in deps if d.startswith("torch")))
    yml = (env.ROOT / "environment.yml").read_text()
    conda = _floor(next(ln for ln in yml.splitlines() if re.match(r"\s*-\s*torch\s*>=", ln)))
    assert py == conda == build.MIN_TORCH


def test_environment_names_a_compiler_and_the_cuda_of_the_measurements():
    yml = (env.ROOT / "environment.yml").read_text()
    assert re.search(r"^\s*-\s*cxx-compiler\b", yml, re.M)
    nvcc = re.search(r"^\s*-\s*cuda-nvcc=(\d+\.\d+)", yml, re.M)
    index = re.search(r"download\.pytorch\.org/whl/cu(\d+)", yml)
    assert nvcc and index and nvcc.group(1).replace(".", "") == index.group(1)  # nvcc matches torch's CUDA
