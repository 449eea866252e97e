"""Every family's public entry points on unusual input (.ci/edge_probe.py): sizes 1 and primes, empty tensors,
non-contiguous and misaligned views, wrong dtypes and devices, NaN/Inf, outputs that alias inputs, out-of-range
indices. Each case must match the float64 reference or raise a clear error: a crash, a CUDA error or a silently wrong
answer (BAD) fails the run."""
import re
import subprocess
import sys

import pytest

from lab import env

from conftest import devices


@pytest.mark.parametrize("device", devices())
def test_no_case_is_bad(device):
    r = subprocess.run([sys.executable, str(env.ROOT / ".ci" / "edge_probe.py"), "--device", device, "-q"],
                       capture_output=True, text=True, timeout=2400, cwd=env.ROOT)
    tail = (r.stdout + r.stderr)[-6000:]
    m = re.search(r"edge probe: (\d+) cases, (\d+) ok, (\d+) clear errors, (\d+) BAD", r.stdout)
    assert m, tail
    cases, ok, errors, bad = map(int, m.groups())
    assert bad == 0 and r.returncode == 0, tail
    assert cases == ok + errors and ok > cases // 2, tail   # most cases compute, the rest are refused by name
