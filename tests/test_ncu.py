"""Nsight Compute in the loop (issue 18, the CPU part): reading `ncu --csv`, the ncu run's plumbing against a
stand-in ncu, and `python -m lab profile FAMILY --ncu` where there is no ncu.

tests/fixtures/ncu_details_long.csv is HAND-WRITTEN in the layout of `ncu --csv --page details` (the long format: one
row per metric of each kernel launch, columns "ID","Process ID","Process Name","Host Name","Kernel Name","Context",
"Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"), with
ncu's ==PROF== lines before it, units scaled the way ncu prints them without --print-units base (usecond, nsecond,
Mbyte, Kbyte/block), thousands separators and n/a. It is not a recording: replace it with the output of a real run on
the H100 (`python -m lab profile basics --op square --version v2 --ncu`, then `ncu --import
results/<device>/traces/ncu/basics_square_v2_float32.ncu-rep --csv --page details`) and update the numbers below.

tests/fixtures/ncu_h100_sgemm_*.csv ARE recordings: Nsight Compute on the H100 at commit f66f57c (.ci/sgemm_stalls.py:
linear v8, v9 and cuBLAS at 4096^3; copies of results/nvidia-h100-80gb-hbm3/profiles/linear_sgemm_4096_ncu_*.csv), the
details page (sections, rule columns, "ns"/"hz" units) and the raw page (one column per metric, a units row). They
hold the warp-stall and launch metrics lab.profile asks for, under the names that ncu used there.
"""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from lab import env, profile, results

FIXTURES = Path(__file__).resolve().parent / "fixtures"
FIXTURE = FIXTURES / "ncu_details_long.csv"
SQUARE = "void square_v2<float>(const float *, float *, long)"
FILL = ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, std::array<char *, 1>>"
        "(int, T2, T3)")


def test_parse_the_long_format_fixture():
    launches = profile.parse_ncu_csv(FIXTURE.read_text())
    assert [(x["launch"], x["kernel"], x["grid"], x["block"]) for x in launches] == [
        (0, SQUARE, "4096x1x1", "256x1x1"), (1, FILL, "8192x1x1", "128x1x1")]     # quoted names with commas
    m0, m1 = launches[0]["metrics"], launches[1]["metrics"]
    assert m0["gpu__time_duration.sum"] == pytest.approx(3.2e-6)          # usecond -> seconds
    assert m1["gpu__time_duration.sum"] == pytest.approx(2.816e-6)        # "2,816" nsecond
    assert m0["dram__bytes_write.sum"] == 4194304                         # "4,194,304" byte
    assert m0["dram__bytes_read.sum"] == pytest.approx(4.19e6)            # Mbyte
    assert m1["launch__shared_mem_per_block_dynamic"] == pytest.approx(1020)   # Kbyte/block
    assert m1["sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active"] is None   # n/a
    assert launches[0]["units"]["dram__bytes_read.sum"] == "byte"
    assert len(m0) == 20 and len(m1) == 17
    assert m0["smsp__sass_thread_inst_executed_op_fmul_pred_on.sum"] == 1048576     # "inst", thousands separators


def test_ncu_row_derives_bandwidths_and_the_top_stalls():
    r0, r1 = (profile.ncu_row(x) for x in profile.parse_ncu_csv(FIXTURE.read_text()))
    assert r0["duration_us"] == pytest.approx(3.2)
    assert r0["dram_gbps"] == pytest.approx((4.19e6 + 4194304) / 3.2e-6 / 1e9)
    assert r0["l2_gbps"] == pytest.approx(16.78e6 / 3.2e-6 / 1e9)
    assert (r0["dram_pct"], r0["sm_pct"], r0["occupancy_pct"]) == (78.52, 21.03, 81.77)
    assert r0["tensor_pct"] == 0 and r0["tensor_metric"] == "sm__pipe_tensor_cycles_active"
    assert (r0["regs"], r0["smem_static"], r0["smem_dynamic"]) == (16, 0, 0)
    assert [(r0[f"stall{i}"], r0[f"stall{i}_ratio"]) for i in (1, 2, 3)] == [
        ("long_scoreboard", 18.42), ("lg_throttle", 2.31), ("wait", 1.07)]
    assert r1["tensor_pct"] is None and r1["tensor_metric"] is None     # n/a on every tensor metric: none recorded
    # the square's x*x: 2^20 FMULs (one FLOP each, no FFMA) over 3.2 us; the fill launch recorded neither metric
    assert r0["issue_ipc"] == 0.41 and r0["fp32_tflops"] == pytest.approx(1048576 / 3.2e-6 / 1e12)
    assert r1["issue_ipc"] is None and r1["fp32_tflops"] is None
    assert [r1[f"stall{i}"] for i in (1, 2, 3)] == ["wait", "not_selected", "long_scoreboard"]
    assert profile.kernel_category(r0["kernel"], True) == "ours"        # square_v2 is defined in cuda_src/basics/
    assert profile.kernel_category(r1["kernel"], True) == "elementwise"


def test_parse_the_newer_layout_with_rule_columns_and_the_raw_page():
    head = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
            '"Device","CC","Section Name","Metric Name","Metric Unit","Metric Value","Rule Name","Rule Type",'
            '"Rule Description","Estimated Speedup Type","Estimated Speedup"')
    pre = '"0","1","python","h","k1","1","7","(32, 1, 1)","(1, 1, 1)","0","9.0",'
    text = "\n".join([head, pre + '"Command line profiler metrics","gpu__time_duration.sum","us","1.50","","","","",""',
                      pre + '"","","","","SOLBottleneck","OPT","This kernel is small","global","42"'])
    (x,) = profile.parse_ncu_csv(text)
    assert x["metrics"] == {"gpu__time_duration.sum": pytest.approx(1.5e-6)}       # the rule row adds nothing
    # --page raw: one row per launch, one column per metric, the units in the row under the header
    raw = "\n".join(['"ID","Kernel Name","Grid Size","Block Size","gpu__time_duration.sum","dram__bytes_read.sum"',
                     '"","","","","nsecond","Kbyte"',
                     '"0","k1","(2, 1, 1)","(64, 1, 1)","1,500","2.5"',
                     '"1","k2","(4, 1, 1)","(64, 1, 1)","700","n/a"'])
    a, b = profile.parse_ncu_csv(raw)
    assert (a["kernel"], a["grid"], b["kernel"]) == ("k1", "2x1x1", "k2")
    assert a["metrics"] == {"gpu__time_duration.sum": pytest.approx(1.5e-6), "dram__bytes_read.sum": 2500}
    assert b["metrics"]["dram__bytes_read.sum"] is None
    assert profile.parse_ncu_csv("==PROF== no kernels were profiled\n") == []


def test_parse_the_h100_recordings():
    """Real ncu output: the details page with sections and rule columns, and the raw page with a units row."""
    details = profile.parse_ncu_csv((FIXTURES / "ncu_h100_sgemm_details.csv").read_text())
    assert [x["kernel"].split("(")[0] for x in details] == [
        "void linear::async_copy_warptile<2, 8, 4>", "void linear::async_copy_warptile<4, 8, 4>",
        "sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize128x128x8_stage3_warpsize2x2x1_ffma_aligna4_alignc4_execute_"
        "kernel__5x_cublas"]
    assert [x["metrics"]["Duration"] for x in details] == pytest.approx([3.3696e-3, 3.420832e-3, 2.712256e-3])
    assert details[0]["metrics"]["smsp__inst_executed.sum"] == 2624987136                  # "2,624,987,136"
    assert [profile.kernel_category(x["kernel"], True) for x in details] == ["ours", "ours", "cublas"]
    raw = [profile.ncu_row(x) for x in profile.parse_ncu_csv(
        (FIXTURES / "ncu_h100_sgemm_warpstate_raw.csv").read_text())]
    assert [r["duration_us"] for r in raw] == pytest.approx([3370.848, 3399.648, 2712.416])
    assert [(r["regs"], r["smem_static"], r["smem_dynamic"]) for r in raw] == [
        (128, 33792, 0), (219, 33792, 0), (255, 0, 33792)]
    assert [(r["stall1"], r["stall2"], r["stall3"]) for r in raw] == [
        ("not_selected", "dispatch_stall", "barrier"), ("not_selected", "short_scoreboard", "dispatch_stall"),
        ("not_selected", "short_scoreboard", "dispatch_stall")]
    # every stall reason lab.profile asks for is one this ncu reported on the H100 (Hopper's gmma included)
    header = (FIXTURES / "ncu_h100_sgemm_warpstate_raw.csv").read_text()
    assert all(profile.STALL_METRIC.format(r) in header for r in profile.STALL_REASONS)
    assert all(m in header for m in ("gpu__time_duration.sum", "launch__registers_per_thread",
                                     "launch__shared_mem_per_block_static", "launch__shared_mem_per_block_dynamic"))


def test_numbers_and_units():
    assert profile.parse_number("1,234,567.5") == 1234567.5
    assert profile.parse_number("n/a") is None and profile.parse_number("") is None
    assert profile.parse_number("9,00") == 9.0                        # a decimal comma
    assert profile._unit_factor("Gbyte/second") == ("byte/second", 1e9)
    assert profile._unit_factor("msecond") == ("second", 1e-3)
    assert profile._unit_factor("register/thread") == ("register/thread", 1.0)


def _fake_ncu(tmp_path: Path, known: list[str]) -> Path:
    """A stand-in for ncu: --version, --query-metrics (the base names in `known`), a profiling run (writes the report
    and logs its argv) and --import (prints the fixture)."""
    log = tmp_path / "argv.log"
    script = tmp_path / "ncu"
    script.write_text(textwrap.dedent(f"""\
        #!{sys.executable}
        import pathlib, sys
        args = sys.argv[1:]   # (the profiled command's own options come after ncu's: look at the first)
        if args[0] == "--version":
            print("NVIDIA (R) Nsight Compute Command Line Profiler\\nVersion 2099.1.0.0 (build 0) (public-release)")
        elif args[0] == "--query-metrics":
            print("Device GH100 (stand-in)\\nMetric Name    Metric Description")
            for m in {known!r}:
                print(m + "    Counter    a description")
        elif args[0] == "--import":
            sys.stdout.write(pathlib.Path({str(FIXTURE)!r}).read_text())
        else:
            pathlib.Path({str(log)!r}).write_text("\\n".join(args))
            out = args[args.index("-o") + 1]
            pathlib.Path(out + ".ncu-rep").write_bytes(b"report")
        """))
    script.chmod(0o755)
    return script


def test_ncu_runs_the_command_under_ncu_and_records_rows(tmp_path, monkeypatch):
    known = sorted({m.split(".")[0] for m in profile.NCU_METRICS} - {"sm__pipe_tensor_op_hmma_cycles_active"})
    monkeypatch.setenv("LAB_NCU", str(_fake_ncu(tmp_path, known)))
    monkeypatch.setenv("LAB_RESULTS_DIR", str(tmp_path / "results"))
    monkeypatch.setattr(profile, "ncu_unavailable", lambda: None)      # the stand-in needs no GPU
    said = []
    cmd = profile.ncu_command("basics", "square", "v2", "float32", {"n": 1 << 20})
    key = {"family": "basics", "op": "square", "version": "v2", "shape": "n=1048576", "dtype": "float32",
           "precision": "float32"}
    rows = profile.ncu(cmd, key, ours_version=True, device="cpu", name="basics_square_v2_float32", say=said.append)
    argv = (tmp_path / "argv.log").read_text().splitlines()
    assert argv[argv.index("--profile-from-start") + 1] == "off"
    asked = argv[argv.index("--metrics") + 1].split(",")
    assert "gpu__time_duration.sum" in asked and "launch__registers_per_thread" in asked
    assert not any("hmma" in m for m in asked)                 # this ncu does not list it: left out, and said
    assert any("sm__pipe_tensor_op_hmma_cycles_active" in s for s in said)
    assert argv[-len(cmd):] == cmd and "--ncu-child" in cmd
    assert [(r["kernel"], r["category"], r["version"], r["role"]) for r in rows] == [
        (SQUARE, "ours", "v2", "ours"), (FILL, "elementwise", "v2", "ours")]
    assert rows[0]["ncu"].startswith("Version 2099.1")
    back = profile.read_ncu(family="basics", op="square")
    assert [r["kernel"] for r in back] == [SQUARE, FILL]
    assert back[0]["duration_us"] == pytest.approx(3.2) and back[0]["stall1"] == "long_scoreboard"
    assert "long_scoreboard 18.42" in profile.ncu_table(back)
    with pytest.raises(TypeError, match="command"):
        profile.ncu(lambda: None)


def test_a_metric_listing_that_lacks_what_the_h100_reported_is_not_trusted(tmp_path, monkeypatch):
    """A listing without the stall metrics ncu reported on the H100 is misread: nothing is left out because of it."""
    monkeypatch.setenv("LAB_NCU", str(_fake_ncu(tmp_path, ["gpu__time_duration", "dram__bytes_read"])))
    assert profile.ncu_known_metrics(profile.ncu_path()) is None
    said = []
    _, asked = profile.run_ncu(["true"], say=said.append)
    assert asked == list(profile.NCU_METRICS) and not said


def test_ncu_absent_says_so_and_records_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("LAB_NCU", str(tmp_path / "no-such-ncu"))
    assert profile.ncu_path() is None
    said = []
    assert profile.ncu(["true"], say=said.append) == []
    assert "not found" in said[0]


def test_cli_profile_ncu_without_ncu_exits_cleanly(tmp_path):
    e = {**os.environ, "LAB_NCU": str(tmp_path / "no-such-ncu"), "LAB_RESULTS_DIR": str(tmp_path)}
    r = subprocess.run([sys.executable, "-m", "lab", "profile", "basics", "--ncu"], cwd=env.ROOT, env=e,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "[lab] profile --ncu: Nsight Compute (ncu) was not found" in r.stdout
    assert not list(tmp_path.rglob("ncu.csv"))


def test_the_dominant_kernel_and_its_bound_are_read_from_recorded_rows(tmp_path, monkeypatch):
    """tests/fixtures/ncu_h100_embedding_forward.csv IS a recording: results/<H100>/ncu.csv of `python -m lab profile
    embedding --op forward --dtype f --ncu` at d465051 (4096 tokens, a 9 us gather: no unit near its peak)."""
    dev = tmp_path / "nvidia-h100-80gb-hbm3"
    dev.mkdir()
    (dev / profile.NCU).write_text((FIXTURES / "ncu_h100_embedding_forward.csv").read_text())
    monkeypatch.setenv("LAB_RESULTS_DIR", str(tmp_path))
    lines = profile.dominant_kernel_line("embedding", "forward").splitlines()
    assert [ln.split()[0] for ln in lines] == ["v1", "v2", "v3", "v4", "torch"]
    assert "embedding_fwd_v1" in lines[0] and "71% of 32.42 us" in lines[0] and lines[0].endswith("(ncu d465051)")
    assert all("latency-bound" in ln for ln in lines)
    assert profile.kernel_bound({"dram_pct": 85.0, "sm_pct": 30.0}) == "memory"
    assert profile.kernel_bound({"dram_pct": 20.0, "sm_pct": 70.0, "tensor_pct": 90.0}) == "compute"
    assert profile.kernel_bound({"dram_pct": None, "sm_pct": 12.0}) == "latency"
    # a version with kernel times but no ncu rows: its time share, and the bound said to be unmeasured
    shape = "tokens=4096 dim=1024 vocab=50257 dist=zipf idx=int64"
    key = {"family": "embedding", "op": "forward", "role": "ours", "dtype": "float32", "precision": "float32",
           "mode": "eager", "device": "cuda", "device_name": "NVIDIA H100 80GB HBM3", "category": "ours",
           "calls_per_call": 1, "reps": 3, "commit": "abc", "run_id": "r", "timestamp": "2026-01-01T00:00:00"}
    profile.record([{**key, "version": "v9", "shape": shape, "kernel": "void gather_v9(float*)", "us_per_call": 7.5},
                    {**key, "version": "v8", "shape": "tokens=7", "kernel": "void gather_v8(float*)",
                     "us_per_call": 1.0}])
    lines = profile.dominant_kernel_line("embedding", "forward").splitlines()
    assert [ln.split()[0] for ln in lines] == ["v1", "v2", "v3", "v4", "torch", "v9"]   # v8: another shape
    assert "bound not measured" in lines[-1] and "100% of 7.50 us" in lines[-1]
    assert "no recorded profile rows" in profile.dominant_kernel_line("embedding", "backward")
    assert profile.dominant_kernel_line("embedding", "forward", shape="tokens=7").split()[0] == "v8"


def test_the_dominant_kernel_sums_its_launches(tmp_path, monkeypatch):
    """A kernel launched many times (a per-step kernel) outweighs one longer single launch: kernels are grouped by
    name, their times summed, their ncu percentages averaged weighted by time."""
    monkeypatch.setenv("LAB_RESULTS_DIR", str(tmp_path))
    base = {"family": "gru", "op": "forward", "role": "ours", "version": "v2", "shape": "batch=1", "dtype": "float32",
            "precision": "float32", "device": "cuda", "device_name": "NVIDIA H100 80GB HBM3", "mode": "ncu",
            "category": "ours", "commit": "abc", "run_id": "r", "timestamp": "2026-01-01T00:00:00"}
    rows = [{**base, "launch": i, "kernel": "void gru_step(float*)", "duration_us": 4.0, "dram_pct": d,
             "sm_pct": 10.0, "tensor_pct": 0.0} for i, d in enumerate((90.0, 70.0, 80.0))]
    rows.append({**base, "launch": 3, "kernel": "void gemm_big(float*)", "duration_us": 10.0, "dram_pct": 5.0,
                 "sm_pct": 90.0, "tensor_pct": 0.0})
    results.append(rows, columns=profile.NCU_COLUMNS, name=profile.NCU)
    (line,) = profile.dominant_kernel_line("gru", "forward").splitlines()
    assert "gru_step" in line and "  3x     12.00 us" in line and "( 55% of 22.00 us)" in line, line
    assert "DRAM   80%" in line and "memory-bound" in line, line
    kernels = profile.kernel_totals(rows, "duration_us")
    assert [(k["kernel"], k["launches"], k["total"]) for k in kernels] == [
        ("void gru_step(float*)", 3, 12.0), ("void gemm_big(float*)", 1, 10.0)]


def test_ours_and_baseline_keeps_our_versions_and_the_ratio_baseline_only():
    from lab import registry, steps
    adamw = registry.get("optim").op("adamw")
    names = steps.ours_and_baseline(adamw)
    # (the C++ CPU version is ours too: versions_for drops it on the GPU)
    assert names == ["cpu", "v1", "v2", "v3", "v4", "torch.fused"]   # not the for-loop / foreach / Triton baselines
    kron = registry.get("kron").op("forward")
    # v3/v4/v5 multiply in TF32 on float32 tensors: their ratios are against torch.bmm.tf32
    assert steps.ours_and_baseline(kron) == ["cpu", "v1", "v2", "v3", "v4", "v5", "v6", "torch.bmm",
                                             "torch.bmm.tf32"]


def test_cli_profile_ours_and_version_together_is_a_clear_error(tmp_path):
    e = {**os.environ, "LAB_RESULTS_DIR": str(tmp_path)}
    r = subprocess.run([sys.executable, "-m", "lab", "profile", "basics", "--op", "square", "--ours", "--version",
                        "v1", "--device", "cpu"], cwd=env.ROOT, env=e, capture_output=True, text=True, timeout=600)
    assert r.returncode != 0
    assert "--ours and --version both name the versions; give one of them" in r.stderr


def test_sgemm_source_summary_reads_the_h100_recordings(capsys):
    # results/<device>/profiles/linear_sgemm_4096_ncu_source_*.csv ARE recordings (ncu SourceCounters on the H100,
    # linear v9 and cuBLAS at 4096^3); `.ci/sgemm_stalls.py summarize` shares the samples of each stall reason by
    # opcode. Checked against a sum written here over the same rows: v9's long-scoreboard share and its top opcode.
    import csv
    import importlib.util
    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("sgemm_stalls", root / ".ci" / "sgemm_stalls.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)                                  # defines summarize; runs nothing on import
    path = root / "results" / "nvidia-h100-80gb-hbm3" / "profiles" / "linear_sgemm_4096_ncu_source_v9.csv"
    rows = list(csv.DictReader(path.read_text().splitlines()[1:]))
    reasons = [c for c in rows[0] if c.startswith("stall_")]
    total = sum(float(r[c] or 0) for r in rows for c in reasons)
    lsb = sum(float(r["stall_long_sb"] or 0) for r in rows)
    lea = sum(float(r["stall_long_sb"] or 0) for r in rows if r["Source"].split()[:1] == ["LEA"])
    mod.summarize([str(path)])
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.strip().startswith("long_sb"))
    share, top = line.split()[1], [w.rstrip(",") for w in line.split()[2:4]]    # "long_sb  0.056   LEA 0.056, ..."
    assert float(share) == pytest.approx(lsb / total, abs=5e-4)
    assert top == ["LEA", f"{lea / total:.3f}"] and lea > 0.9 * lsb    # the LEAs after the copies hold nearly all
