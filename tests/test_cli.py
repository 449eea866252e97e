"""python -m lab: the commands a user types, and what they say when the input is wrong."""
import subprocess
import sys

from lab import env


def lab(*args, **kw):
    return subprocess.run([sys.executable, "-m", "lab", *args], cwd=env.ROOT, capture_output=True, text=True,
                          timeout=1200, **kw)


def test_list_names_every_family_and_marks_gpu_versions():
    r = lab("list")
    assert r.returncode == 0, r.stderr
    for fam in ("basics",):
        assert f"{fam}:" in r.stdout
    assert "square" in r.stdout and "v2" in r.stdout


def test_check_one_op_at_one_size_on_cpu():
    r = lab("check", "basics", "--op", "matmul", "--device", "cpu", "--size", "M=7,K=13,N=5", "--seeds", "2")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "matmul" in r.stdout and "passed" in r.stdout


def test_unknown_family_is_a_clear_error():
    r = lab("check", "nosuchfamily")
    assert r.returncode == 2
    assert "no kernel family 'nosuchfamily'" in r.stderr and "basics" in r.stderr


def test_bad_size_key_is_a_clear_error():
    r = lab("check", "basics", "--op", "square", "--size", "rows=5", "--device", "cpu")
    assert r.returncode != 0
    assert "shape keys ['n']" in r.stderr


def test_bad_size_value_is_a_clear_error():
    # a negative or non-numeric count used to reach torch.randn as a traceback
    for value in ("-5", "abc"):
        r = lab("bench", "basics", "--op", "square", "--size", f"n={value}", "--device", "cpu", "--dry")
        assert r.returncode != 0
        assert f"--size: basics.square's n is a count: a non-negative integer, got '{value}'" in r.stderr, r.stderr


def test_unknown_version_is_a_clear_error_not_an_empty_run():
    # a typo used to run nothing and pass ("0/0 passed", an empty profile); a version some ops lack is still fine
    for cmd in ("check", "bench", "profile"):
        r = lab(cmd, "kron", "--version", "v9", "--version", "v1", "--device", "cpu")
        assert r.returncode != 0, (cmd, r.stdout)
        assert "--version: 'v9' is not a version of kron; its versions: cpu, v1," in r.stderr, (cmd, r.stderr)
    r = lab("check", "basics", "--op", "square", "--version", "v3", "--device", "cpu")   # v3 is vector_add's
    assert r.returncode != 0 and "'v3' is not a version of basics --op square" in r.stderr, r.stderr


def test_op_given_twice_is_an_error_not_the_last_one_silently():
    # argparse would keep the last --op: a sanitizer run meant for two ops would check only one and still pass
    r = lab("check", "basics", "--op", "square", "--op", "matmul", "--device", "cpu")
    assert r.returncode == 2
    assert "--op given twice (square, matmul)" in r.stderr and "passed" not in r.stdout


def test_bench_extra_alone_runs_only_that_extra():
    # --extra without --op: no op sweep (rope's ops have CPU versions, so a sweep would print a timing table)
    r = lab("bench", "rope", "--extra", "compile_time", "--device", "cpu", "--dry")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "[lab] rope extra: compile_time" in r.stdout
    assert "rope.rope" not in r.stdout + r.stderr and "median us" not in r.stdout


def test_bench_checks_a_version_before_timing_it(faulty, capsys):
    """Validate, then benchmark: a version wrong on the check shapes is reported and not timed; the right one is."""
    from lab.__main__ import main
    assert main(["bench", "faulty", "--op", "scale", "--device", "cpu", "--dry", "--version", "cpu",
                 "--version", "wrong"]) == 0
    out = capsys.readouterr().out
    assert "faulty.scale: not timed, wrong on the check shapes: wrong" in out
    timed = [ln for ln in out.splitlines() if ln.startswith("[lab] (")]
    assert any(" cpu " in ln for ln in timed) and not any(" wrong " in ln for ln in timed), timed


def test_bench_of_versions_that_cannot_run_here_says_so():
    """`lab compare --rerun` prints bench commands for GPU rows; typed on a machine without a GPU (or naming versions
    that do not run here) the command says nothing was timed and why, instead of printing nothing."""
    from lab.__main__ import main
    import contextlib, io
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["bench", "basics", "--op", "vector_add", "--device", "cpu", "--dry", "--version", "v4"]) == 0
    assert "[lab] basics.vector_add: no version of v4 runs on cpu (the CUDA versions need a GPU): nothing timed" \
        in buf.getvalue()
