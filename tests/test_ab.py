""".ci/ab: a base commit's tree timed beside this one on one GPU. Its control logic, run here with a stand-in python3
that reports where and with what it was started; the real A/B ran on an H100 (issue 13, README "What has run")."""
import os
import shutil
import subprocess

import pytest

from lab import env

SCRIPT = env.ROOT / ".ci" / "ab"
pytestmark = pytest.mark.skipif(not (env.ROOT / ".git").exists() or not SCRIPT.exists(),
                                reason="needs the repository's git history and .ci/ab")


def _head() -> str:
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=env.ROOT, capture_output=True, text=True,
                          check=True).stdout.strip()


def run(*args, env_=None):
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=env.ROOT, env=env_ or dict(os.environ),
                          capture_output=True, text=True, timeout=300)


@pytest.fixture
def prepared():
    base = _head()
    tree = env.ROOT / "ab" / base
    r = run("prepare", base)
    assert r.returncode == 0, r.stdout + r.stderr
    yield base, tree
    shutil.rmtree(tree, ignore_errors=True)
    shutil.rmtree(env.ROOT / "ab" / f"results-{base}", ignore_errors=True)


def test_prepare_writes_the_base_commits_sources(prepared):
    base, tree = prepared
    for path in ("lab/__init__.py", "lab/bench.py", "cuda_src/lab_cuda.cuh"):
        committed = subprocess.run(["git", "show", f"{base}:{path}"], cwd=env.ROOT, capture_output=True, text=True,
                                   check=True).stdout
        assert (tree / path).read_text() == committed, path
    assert not (tree / "results").exists() and not (tree / "notebooks").exists()


def test_run_alternates_the_two_trees_each_with_its_commit_and_results(prepared, tmp_path):
    base, tree = prepared
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "python3").write_text('#!/bin/bash\necho "RAN cwd=$PWD commit=$LAB_COMMIT results=${LAB_RESULTS_DIR:-} '
                                  'args=$*"\n')
    (fake / "python3").chmod(0o755)
    e = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}", "LAB_COMMIT": "newsha"}
    e.pop("LAB_RESULTS_DIR", None)
    r = run("run", base, "2", "rope", "--op", "rope", env_=e)
    assert r.returncode == 0, r.stdout + r.stderr
    ran = [line for line in r.stdout.splitlines() if line.startswith("RAN")]
    a = f"RAN cwd={tree} commit={base} results={env.ROOT}/ab/results-{base}/results args=-m lab bench rope --op rope"
    b = f"RAN cwd={env.ROOT} commit=newsha results= args=-m lab bench rope --op rope"
    assert ran == [a, b, a, b]


def test_run_without_the_tree_or_the_commit_says_what_to_do(prepared):
    base, _ = prepared
    r = run("run", "0000000", "1", "rope")
    assert r.returncode == 2 and "ab/0000000 is missing: .ci/ab prepare 0000000 here" in r.stdout
    e = dict(os.environ)
    e.pop("LAB_COMMIT", None)
    r = run("run", base, "1", "rope", env_=e)
    assert r.returncode != 0 and "LAB_COMMIT=<the sha of this tree" in r.stderr
