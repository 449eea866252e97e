"""The Triton versions (lab/kernels/_triton/), on the CPU: every kernel in Triton's interpreter against its family's
float64 reference, on the family's own check shapes (1, primes, non-multiples of every block: the masked tails) at
the family's tolerances, outputs poisoned first (lab.verify.check_version, as for every version). On the H100 the
same versions run natively in tests/test_<family>.py (device "cuda"), like every version.

TRITON_INTERPRET=1 is read when @triton.jit decorates a kernel, so the kernels run in a child process started with it
set (this process imported them compiled, for the GPU). Interpreter caveats (Triton 3.8), so the GPU run still counts:
it ignores input_precision="tf32" (multiplies in fp32), its tl.dot multiplies bfloat16 as uint16 bits (the linear
launcher upcasts bf16 tiles under the interpreter only), and its fp32 -> bf16 cast truncates (bf16 errors ~2x the
GPU's, still well inside the bf16 tolerance).
"""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
HAS_TRITON = importlib.util.find_spec("triton") is not None
needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="triton is not importable here (pip install triton): the "
                                                         "Triton versions are skipped, and so is their test")

# The child: each `triton*` version of an op, moved to the CPU (device "cpu") and checked as on the GPU (a baseline
# that takes out=: verify poisons its out= first), over the op's dtypes and check shapes (or those given), 2 seeds.
CHILD = r"""
import dataclasses, json, sys
import torch
from lab import registry, verify
fam, op_name, shapes = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
op = registry.get(fam).op(op_name)
for v in op.versions:
    if not v.name.startswith("triton"):
        continue
    assert v.device == "cuda", f"{v.name} is on device {v.device!r}: {v.idea}"
    cpu = dataclasses.replace(v, device="cpu")
    for dt in op.dtypes:
        if not v.supports(dt):
            continue
        for s in shapes or op.check_shapes:
            r = verify.check_version(op, cpu, s, dt, "cpu", seeds=(0, 1))
            print(json.dumps({"version": v.name, "line": r.details(), "passed": r.passed}), flush=True)
"""

LARGE_LINEAR = [{"M": 1000, "N": 513, "K": 777, "bias": 1}]   # more than one 128x256 tile each way, odd everywhere


def run_interpreted(family: str, op: str, shapes: list[dict] | None = None, timeout: float = 600) -> list[dict]:
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-c", CHILD, family, op, json.dumps(shapes or [])], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=timeout)
    if p.returncode:
        raise AssertionError(f"the interpreter run of {family}.{op} exited {p.returncode}:\n{p.stdout}\n"
                             f"{p.stderr[-4000:]}")
    return [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]


# family, op, the versions expected, results expected (versions x dtypes x shapes)
CASES = [
    ("basics", "vector_add", {"triton"}, 2 * 10),
    ("linear", "linear", {"triton", "triton.tf32"}, (2 + 1) * 11),
    ("linear", "fc_out", {"triton", "triton.tf32"}, 2 * 5),
    ("rope", "rope", {"triton"}, 3 * 12),
    ("optim", "adamw", {"triton"}, 3 * 7),
    ("optim", "adam", {"triton"}, 3 * 5),
]


@needs_triton
@pytest.mark.parametrize("family,op,versions,count", CASES, ids=[f"{f}.{o}" for f, o, _, _ in CASES])
def test_triton_kernels_match_reference_in_the_interpreter(family, op, versions, count):
    rs = run_interpreted(family, op)
    assert {r["version"] for r in rs} == versions and len(rs) == count, [r["line"] for r in rs]
    bad = [r["line"] for r in rs if not r["passed"]]
    assert not bad, "\n".join(bad)


@needs_triton
def test_triton_linear_on_a_large_odd_problem_in_the_interpreter():
    rs = run_interpreted("linear", "linear", LARGE_LINEAR)
    assert len(rs) == 3 and all(r["passed"] for r in rs), "\n".join(r["line"] for r in rs)


@needs_triton
def test_triton_launchers_refuse_cpu_tensors_outside_the_interpreter():
    if os.environ.get("TRITON_INTERPRET", "0") not in ("0", ""):
        pytest.skip("this process runs the interpreter")
    from lab.kernels._triton import basics as tb
    from lab.kernels._triton import linear as tl_
    with pytest.raises(ValueError, match=r"a is on the CPU: the Triton kernels run on CUDA tensors"):
        tb.vector_add(torch.ones(3), torch.ones(3))
    with pytest.raises(ValueError, match=r"b must have the same shape as a = \(3,\), got \(2,\)"):
        tb.vector_add(torch.ones(3), torch.ones(2))
    with pytest.raises(ValueError, match=r"weight must have shape \(N, K\) with K = x.size\(-1\) = 5"):
        tl_.linear(torch.ones(2, 5), torch.ones(3, 4))


def test_families_stand_without_triton():
    """With `import triton` failing, every family still imports, and each `triton*` version is listed on no device
    (skipped everywhere, never run) with the reason in its idea."""
    code = r"""
import sys
sys.modules["triton"] = None          # `import triton` now raises ImportError
from lab import registry
fams = registry.families()
assert not registry.BROKEN, registry.BROKEN
vs = [v for f in fams for o in f.ops for v in o.versions if v.name.startswith("triton")]
assert len(vs) == 8, [v.name for v in vs]
for v in vs:
    assert v.device == "none" and not v.runs_on("cuda") and not v.runs_on("cpu"), v
    assert "skipped: triton is not importable" in v.idea, v.idea
print("ok")
"""
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert p.returncode == 0 and p.stdout.strip().endswith("ok"), p.stdout + p.stderr[-3000:]


def test_lines_of_code_are_read_from_the_sources(tmp_path):
    from lab.studies import kernel_lines as K
    assert K.python_code_lines('def f(x):\n    """doc\n    more"""\n\n    # note\n    return x  # why\n') == 2
    assert K.c_code_lines("/* a\n b */\nint x; // c\n\n// d\nint y;\n") == 2
    (tmp_path / "fam").mkdir()
    (tmp_path / "fam" / "k.cu").write_text(
        "// header\ntemplate <typename T>\n__global__ void k1(T* a) {\n  if (a) {\n    a[0] = 1;  // one\n  }\n}\n"
        "__global__ void k2(float* a) { a[0] = 2; }\n")
    assert K.cuda_lines("fam", "k.cu", "k1", root=tmp_path) == 6 and K.cuda_lines("fam", "k.cu", "k2", root=tmp_path) == 1
    assert K.cuda_lines("fam", "k.cu", root=tmp_path) == 7
    for fam in ("basics", "linear", "rope", "optim"):
        kernels = K.triton_kernels(fam)
        lines = K.triton_lines(fam)
        assert kernels and all(lines[k] > 5 for k in kernels), (fam, lines)
    assert K.cuda_lines("basics", "vector_add.cu", "add_v2") > 3


def test_triton_is_set_against_the_fastest_rung_of_its_own_precision_and_mode():
    from lab.studies import kernel_lines as K

    def row(v, us, lo, hi, prec="float32", mode="events"):
        return {"op": "linear", "version": v, "shape": "M=8", "dtype": "float32", "precision": prec, "mode": mode,
                "median_us": us, "p20_us": lo, "p80_us": hi}
    rows = [row("triton", 10.0, 9.0, 11.0), row("v8", 20.0, 19.0, 21.0), row("v9", 15.0, 14.0, 16.0),
            row("torch", 5.0, 4.0, 6.0),                                    # a baseline: never the rung
            row("triton.tf32", 3.0, 2.9, 3.1, prec="tf32"), row("v10", 3.05, 2.95, 3.2, prec="tf32"),
            row("triton", 9.0, 8.0, 10.0, mode="graph")]                   # no rung timed in graph mode
    lines = K.triton_against_rungs(rows).splitlines()
    assert "best rung v9" in lines[0] and lines[0].endswith("Triton is FASTER") and "0.67x" in lines[0]
    assert "best rung v10" in lines[1] and lines[1].endswith("level (p20..p80 ranges overlap)")
    assert lines[2] == "linear triton M=8: no CUDA rung of this precision timed beside it"
    assert "nothing to compare" in K.triton_against_rungs([row("v8", 1.0, 1.0, 1.0)], "cpu")


def test_launch_fill_sets_blocks_against_sms_beside_the_ncu_times():
    """The table notebook 02 prints for "where Triton's TF32 kernel is ahead, and why": per shape with rows of both
    v11 and triton.tf32 (ncu.csv rows, as profile.read_ncu reads them), every recorded launch with its grid's blocks
    against the SM count; the verdict from each version's newest run; one line where no shape has both."""
    from lab.studies import kernel_lines as K

    def row(v, grid, block, us, sm, ts, shape="M=1024 N=1024 K=1024 bias=1", kernel="k", dev="GPU X", smem=0.0):
        return {"family": "linear", "op": "linear", "version": v, "shape": shape, "dtype": "float32",
                "precision": "tf32", "device_name": dev, "kernel": kernel, "grid": grid, "block": block,
                "duration_us": us, "sm_pct": sm, "smem_static": 0.0, "smem_dynamic": smem, "commit": "abc1234",
                "timestamp": ts, "run_id": ts}
    rows = [row("v11", "64x1x1", "384x1x1", 25.0, 22.0, "2026-01-01T00:00:00",
                kernel="void v11_wgmma<float, 128>(CUtensorMap_st, int)", smem=197728.0),
            row("triton.tf32", "32x1x1", "256x1x1", 40.0, 13.5, "2026-01-01T00:00:01", kernel="linear_kernel"),
            row("triton.tf32", "128x1x1", "128x1x1", 20.0, 27.0, "2026-01-02T00:00:00", kernel="linear_kernel"),
            row("torch.tf32", "128x1x1", "384x1x1", 16.5, 33.4, "2026-01-01T00:00:02", kernel="sm90_xmma_gemm"),
            row("v11", "256x1x1", "384x1x1", 100.0, 60.0, "2026-01-01T00:00:03", shape="M=4096 N=4096 K=4096 bias=1"),
            row("triton.tf32", "512x1x1", "256x1x1", 110.0, 55.0, "2026-01-01T00:00:04",
                shape="M=4096 N=4096 K=4096 bias=1"),
            row("v10", "64x1x1", "128x1x1", 50.0, 30.0, "2026-01-01T00:00:05"),          # not compared: left out
            row("v11", "8x1x1", "384x1x1", 9.0, 9.0, "2026-01-01T00:00:06", shape="M=128 N=128 K=128 bias=1"),
            row("triton.tf32", "1x1x1", "128x1x1", 9.0, 9.0, "2026-01-01T00:00:07", dev="GPU Y")]   # another GPU
    lines = K.launch_fill(rows, 132, "GPU X").splitlines()
    assert lines[0] == "linear float32 (tf32) M=1024 N=1024 K=1024 bias=1: 132 SMs"
    assert lines[1].split() == ["version", "kernel", "grid", "block", "blocks", "/SMs", "smem", "KB", "us", "SM%",
                                "ncu", "run"]
    assert lines[2].split() == ["*", "v11", "v11_wgmma", "64x1x1", "384x1x1", "64", "0.48", "193.1", "25.00", "22.0",
                                "abc1234", "2026-01-01T00:00:00"]
    assert lines[3].split()[:7] == ["triton.tf32", "linear_kernel", "32x1x1", "256x1x1", "32", "0.24", "0.0"]
    assert not lines[3].startswith("*")                                   # an older run: listed, not the verdict's
    assert lines[4].startswith("* triton.tf32") and lines[4].split()[5:7] == ["128", "0.97"]
    assert lines[5].startswith("* torch.tf32") and "sm90_xmma_gemm" in lines[5]
    assert lines[6] == ("  newest runs: triton.tf32's kernel takes 0.80x v11's time: triton.tf32 is ahead; "
                        "v11 launches 64 blocks for 132 SMs: at least 68 SMs get no block")
    assert lines[7] == "linear float32 (tf32) M=4096 N=4096 K=4096 bias=1: 132 SMs"   # sizes in order; M=128: no Triton
    assert lines[-1] == ("  newest runs: triton.tf32's kernel takes 1.10x v11's time: v11 is ahead; "
                         "v11 launches 256 blocks for 132 SMs: none is left without one")
    assert len(lines) == 7 + 5 and not any("v10" in ln for ln in lines)
    unknown = K.launch_fill(rows, None, "GPU X").splitlines()             # no GPU here: the SM count is not recorded
    assert unknown[0].endswith("SM count n/a (no GPU here; ncu.csv does not record it)")
    assert unknown[2].split()[5:7] == ["64", "n/a"] and unknown[6].endswith("v11 launches 64 blocks; SMs n/a")
    none = K.launch_fill(rows, None, "Some CPU")
    assert none.startswith("no ncu rows of both v11 and triton.tf32 recorded for Some CPU") and "\n" not in none


def test_memory_ops_counts_global_accesses_per_function_by_width():
    from lab.studies import kernel_lines
    sass = ("\t\tFunction : k_a\n        /*0040*/  LDG.E.128.CONSTANT R4, desc[UR4][R2.64] ;\n"
            "        /*0050*/  LDG.E.128.CONSTANT R8, desc[UR4][R6.64] ;\n        /*0060*/  FADD R4, R4, R8 ;\n"
            "        /*0070*/  STG.E.128 desc[UR4][R10.64], R4 ;\n        /*0080*/  EXIT ;\n"
            "\t\tFunction : k_b\n        /*0040*/  @P0 LDG.E R4, desc[UR4][R2.64] ;\n"
            "        /*0050*/  STG.E desc[UR4][R6.64], R4 ;\n        /*0060*/  RED.E.ADD.F32.FTZ.RN.STRONG.GPU "
            "desc[UR4][R8.64], R4 ;\n")
    got = kernel_lines.memory_ops(sass)
    assert got == {"k_a": {"LDG.E.128.CONSTANT": 2, "STG.E.128": 1},
                   "k_b": {"LDG.E": 1, "RED.E.ADD.F32.FTZ.RN.STRONG.GPU": 1, "STG.E": 1}}
    assert list(kernel_lines.memory_ops(sass, "k_b")) == ["k_b"]


@needs_triton
@pytest.mark.skipif(shutil.which("nvcc") is None and not os.environ.get("CUDA_HOME"),
                    reason="nvcc not found: the SASS of a CUDA unit cannot be compiled here")
def test_generated_code_of_vector_add_cuda_v2_and_triton():
    """The evidence notebook 01 prints for 'where Triton is faster, why': both emit 16-byte accesses when Triton may
    assume 16-divisible pointers and n; without n's divisibility Triton falls back to 4-byte accesses."""
    from lab.kernels._triton.basics import BLOCK, vector_add_kernel
    from lab.studies import kernel_lines
    v2 = kernel_lines.memory_ops(kernel_lines.cuda_sass("basics", "vector_add.cu"), "add_v2<float>")
    (ops,) = v2.values()
    assert ops.get("LDG.E.128.CONSTANT", 0) >= 2 and ops.get("STG.E.128", 0) >= 1   # float4 in the loop
    assert ops.get("LDG.E.CONSTANT", 0) == 2 and ops.get("STG.E", 0) == 1           # the scalar tail
    sig = {"a_ptr": "*fp32", "b_ptr": "*fp32", "out_ptr": "*fp32", "n": "i64"}
    wide = kernel_lines.memory_ops(kernel_lines.triton_sass(
        vector_add_kernel, sig, {"BLOCK": BLOCK}, aligned=("a_ptr", "b_ptr", "out_ptr", "n")))
    narrow = kernel_lines.memory_ops(kernel_lines.triton_sass(
        vector_add_kernel, sig, {"BLOCK": BLOCK}, aligned=("a_ptr", "b_ptr", "out_ptr")))
    # BLOCK / (4 warps x 32 lanes) = 8 floats a lane: two 16-byte loads per operand, or eight 4-byte ones
    assert wide == {"vector_add_kernel": {"LDG.E.128": 4, "STG.E.128": 2}}
    assert narrow == {"vector_add_kernel": {"LDG.E": 16, "STG.E": 8}}
