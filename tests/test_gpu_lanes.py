""".ci/gpu-lanes: one lane of .ci/gpu runs per GPU. Its control logic, run here with a stand-in nvidia-smi (two GPUs)
and steps that record nothing; the real lanes ran on a machine of four H100s (README, "What has run on the lent GPU")."""
import os
import subprocess
import tarfile

import pytest

from lab import env

SCRIPT = env.ROOT / ".ci" / "gpu-lanes"


@pytest.fixture
def fake_gpus(tmp_path):
    """A PATH whose nvidia-smi lists two GPUs named NAME ($FAKE_GPU_NAME)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text('#!/bin/bash\nif [ "$1" = -L ]; then echo "GPU 0: $FAKE_GPU_NAME (UUID: a)"; '
                   'echo "GPU 1: $FAKE_GPU_NAME (UUID: b)"; else echo "$FAKE_GPU_NAME"; fi\n')
    smi.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_GPU_NAME": "NVIDIA H100 80GB HBM3",
            "OUT": str(tmp_path / "out"), "LAB_LANES_DIR": str(tmp_path / "lanes")}


def run(env_, *lanes):
    return subprocess.run(["bash", str(SCRIPT), *lanes], cwd=env.ROOT, env=env_, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.skipif(not SCRIPT.exists(), reason="no .ci/gpu-lanes in this tree")
def test_each_lane_runs_its_segments_in_order_on_its_own_gpu(fake_gpus, tmp_path):
    # "nothing" is no step of .ci/gpu: each run starts, runs no step and ends, which is all the lanes' logic needs
    r = run(fake_gpus, "nothing: basics + FOO=bar nothing: rope", "nothing: gru")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "2 GPU(s) (NVIDIA H100 80GB HBM3), 2 lane(s)" in r.stdout
    lane0 = (tmp_path / "lanes" / "lane0.log").read_text()
    lane1 = (tmp_path / "lanes" / "lane1.log").read_text()
    first, second = lane0.index("( nothing: basics) on GPU 0"), lane0.index("(FOO=bar nothing: rope) on GPU 0")
    assert first < second
    assert "( nothing: gru) on GPU 1" in lane1
    out = tmp_path / "out"
    with tarfile.open(out / "logs.tgz") as t:
        assert {"./lane0.log", "./lane1.log"} <= set(t.getnames())
    assert (out / "results.tgz").exists()
    # a lane whose run fails fails the whole: .ci/gpu refuses a step that records rows without LAB_COMMIT
    r = run({k: v for k, v in fake_gpus.items() if k != "LAB_COMMIT"}, "nothing: basics", "report: basics")
    assert r.returncode == 1 and "status 1" in r.stdout, r.stdout + r.stderr
    assert "need LAB_COMMIT" in (tmp_path / "lanes" / "lane1.log").read_text()


@pytest.mark.skipif(not SCRIPT.exists(), reason="no .ci/gpu-lanes in this tree")
def test_more_lanes_than_gpus_and_the_wrong_gpu_stop_before_any_step(fake_gpus, tmp_path):
    r = run(fake_gpus, "nothing: a", "nothing: b", "nothing: c")
    assert r.returncode == 2 and "3 lanes for 2 GPUs" in r.stdout
    r = run({**fake_gpus, "FAKE_GPU_NAME": "NVIDIA H200", "LAB_ONLY_GPU": "H100"}, "nothing: a")
    assert r.returncode == 3 and "this GPU is not a H100: nothing run" in r.stdout
    assert not (tmp_path / "lanes" / "lane0.log").exists()
