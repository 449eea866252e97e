"""The roofline from measured bytes (issue 18): each version placed by the DRAM bytes Nsight Compute measured beside
the bytes the op's formula counts (lab.profile.measured_calls / measured_bytes_table, lab.plot.plot_roofline_measured).

tests/fixtures/ncu_h100_embedding_forward.csv IS a recording (results/<H100>/ncu.csv of `python -m lab profile
embedding --op forward --dtype f --ncu` at d465051). The linear.linear rows below are made up (round numbers, no
recording): they exist to give an op with a FLOP formula, which the embedding has not. CPU only, nothing timed.
"""
from __future__ import annotations

import csv
import json
from pathlib import Path

import matplotlib
import pytest
import torch

from lab import plot, profile, registry, results

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "ncu_h100_embedding_forward.csv"
H100 = "NVIDIA H100 80GB HBM3"
TORCH = "2.11.0+cu130"          # the recording's torch: the ceilings entry a figure reads is keyed by it
CEIL = {"copy_gbps": 3000.0, "fma_tflops": 65.0, "gemm_size": 8192,
        "gemm_tflops": {"bfloat16": 700.0, "float16": 700.0, "float32": 51.0, "float64": 63.0, "tf32": 370.0}}
SHAPE = "tokens=4096 dim=1024 vocab=50257 dist=zipf idx=int64"


@pytest.fixture
def h100(tmp_path, monkeypatch):
    """A scratch results folder holding the H100's recorded embedding rows and a ceilings.json in the committed
    file's format (results/nvidia-h100-80gb-hbm3/ceilings.json)."""
    dev = tmp_path / "nvidia-h100-80gb-hbm3"
    dev.mkdir()
    (dev / profile.NCU).write_text(FIXTURE.read_text())
    (dev / "ceilings.json").write_text(json.dumps({f"{H100} | torch {TORCH}": CEIL}, indent=1))
    monkeypatch.setenv("LAB_RESULTS_DIR", str(tmp_path))
    return dev


def _fixture_rows(version: str) -> list[dict]:
    with open(FIXTURE, newline="") as fh:
        return [r for r in csv.DictReader(fh) if r["version"] == version]


def test_a_shape_label_reads_back_into_the_shape_it_was_made_from():
    assert profile.parse_shape_label(SHAPE) == {"tokens": 4096, "dim": 1024, "vocab": 50257, "dist": "zipf",
                                                "idx": "int64"}
    assert profile.parse_shape_label("batch=1 factors=128x128 padding_idx=-1 idx_shape=(2, 3, 4)") == {
        "batch": 1, "factors": "128x128", "padding_idx": -1, "idx_shape": (2, 3, 4)}
    assert profile.parse_shape_label(None) == {}
    # a label alone cannot tell kron's one-factor 'factors=9' (a string) from a number: the op's shapes say
    assert profile.parse_shape_label("batch=7 factors=9") == {"batch": 7, "factors": 9}
    for fam in registry.families():       # every op's own shapes: the label is what ncu.csv and results.csv hold
        for op in fam.ops:
            for s in profile.op_shapes(op):
                assert profile.parse_shape_label(registry.shape_label(s), profile.op_shapes(op)) == s, (op.name, s)


def test_measured_bytes_are_the_recorded_dram_rate_times_duration(h100):
    calls = {c["version"]: c for c in profile.measured_calls("embedding", "forward")}
    assert list(calls) == ["v1", "v2", "v3", "v4", "torch"]        # ours in ladder order, then the baseline
    (v3,) = _fixture_rows("v3")                                     # v3: one fused kernel
    want = float(v3["dram_gbps"]) * 1e9 * float(v3["duration_us"]) * 1e-6
    assert calls["v3"]["measured_bytes"] == pytest.approx(want, rel=1e-12)
    assert calls["v3"]["measured_bytes"] == pytest.approx(6.10e6, rel=1e-2)   # 641.805 GB/s x 9.504 us
    assert calls["v3"]["time_us"] == pytest.approx(9.504) and calls["v3"]["launches"] == 1
    v1 = _fixture_rows("v1")                                        # v1: range check (reduce + cat), then the gather
    assert len(v1) == 3 and calls["v1"]["launches"] == 3
    assert calls["v1"]["measured_bytes"] == pytest.approx(
        sum(float(r["dram_gbps"]) * 1e3 * float(r["duration_us"]) for r in v1), rel=1e-12)
    assert calls["v1"]["time_us"] == pytest.approx(sum(float(r["duration_us"]) for r in v1))
    # the formula: the op's own, at the parsed shape: 2 * tokens * dim * 4 bytes (read the rows, write out)
    op = registry.get("embedding").op("forward")
    formula = op.nbytes(profile.parse_shape_label(SHAPE), torch.float32)
    assert formula == 2 * 4096 * 1024 * 4
    assert all(c["formula_bytes"] == formula for c in calls.values())
    assert all(c["flops"] is None for c in calls.values())          # no FLOP formula: a memory-bound op
    assert calls["torch"]["role"] == "baseline" and calls["v3"]["shape"] == SHAPE


def test_the_table_sets_measured_beside_formula_bytes(h100):
    lines = profile.measured_bytes_table("embedding", "forward").splitlines()
    assert lines[0].startswith(f"embedding.forward (float32) on {H100}, ncu rows of d465051, at {SHAPE}")
    body = {ln.split()[0]: ln.split() for ln in lines[2:]}
    assert list(body) == ["v1", "v2", "v3", "v4", "torch"]
    # version, kernels, time us, measured MB, formula MB, measured/formula, GB/s on measured bytes
    assert body["v3"][1:] == ["1", "9.50", "6.100", "33.554", "0.18", "642"]
    assert body["v1"][1:3] == ["3", "32.42"]
    assert "no recorded ncu rows" in profile.measured_bytes_table("embedding", "backward")


def _inside(fig, artist) -> bool:
    """The artist's drawn box lies within the figure's (a title or footer not clipped)."""
    box = artist.get_window_extent(fig.canvas.get_renderer())
    fb = fig.bbox
    return box.x0 >= fb.x0 - 1 and box.y0 >= fb.y0 - 1 and box.x1 <= fb.x1 + 1 and box.y1 <= fb.y1 + 1


def test_a_memory_bound_op_gets_one_bar_pair_per_version(h100):
    fig = plot.plot_roofline_measured("embedding", "forward", save=False)
    ax = fig.axes[0]
    fig.canvas.draw()
    bars = [p for p in ax.patches if isinstance(p, matplotlib.patches.Rectangle)]
    assert len(bars) == 2 * 5                                       # measured + formula, five versions
    calls = profile.measured_calls("embedding", "forward")
    heights = sorted(round(b.get_height(), 6) for b in bars)
    want = sorted([round(c["measured_bytes"] / 1e6, 6) for c in calls] + [round(2 * 4096 * 1024 * 4 / 1e6, 6)] * 5)
    assert heights == want
    pairs = {}
    for b in bars:                                                  # each pair around its version's tick
        pairs.setdefault(round(b.get_x() + b.get_width() / 2), []).append(b)
    assert sorted(pairs) == [0, 1, 2, 3, 4] and all(len(p) == 2 for p in pairs.values())
    v3_measured = min(pairs[2], key=lambda b: b.get_x())            # left of the pair: measured, filled
    assert v3_measured.get_height() == pytest.approx(calls[2]["measured_bytes"] / 1e6)
    assert v3_measured.get_facecolor() != max(pairs[2], key=lambda b: b.get_x()).get_facecolor()
    assert [t.get_text().split("\n")[0] for t in ax.get_xticklabels()] == ["v1", "v2", "v3", "v4", "torch"]
    v3 = ax.get_xticklabels()[2].get_text()
    assert "642 GB/s (21% of copy)" in v3 and "0.18x the formula" in v3     # against CEIL's 3000 GB/s
    # title and footer inside the figure, the legend right of the data, the footer names the commit and device
    footer = [t for t in fig.texts if "commit d465051" in t.get_text()]
    assert footer and H100 in footer[0].get_text() and _inside(fig, footer[0]) and _inside(fig, ax.title)
    legend = ax.get_legend().get_window_extent(fig.canvas.get_renderer())
    assert legend.x0 >= ax.get_window_extent().x1 and _inside(fig, ax.get_legend())
    matplotlib.pyplot.close(fig)
    path = plot.plot_roofline_measured("embedding", "forward")
    assert path == h100 / "plots" / "embedding_forward_float32_measured.png" and path.stat().st_size > 0
    assert plot.plot_roofline_measured("embedding", "backward") is None     # no ncu rows


LINEAR = "M=1024 N=1024 K=1024 bias=1"


def _linear_rows() -> list[dict]:
    """Made-up ncu rows of linear.linear at 1024^3: v1 in two launches, v10 (TF32) in one, the TF32 baseline."""
    base = {"family": "linear", "op": "linear", "shape": LINEAR, "dtype": "float32", "device": "cuda",
            "device_name": H100, "mode": "ncu", "torch": TORCH, "cuda": "13.0", "commit": "abc1234",
            "timestamp": "2026-11-26T10:00:00", "ncu": "Version test"}
    return [
        {**base, "version": "v1", "role": "ours", "precision": "float32", "launch": 0, "kernel": "void linear_v1()",
         "duration_us": 100.0, "dram_gbps": 400.0, "run_id": "r1"},      # 40 MB
        {**base, "version": "v1", "role": "ours", "precision": "float32", "launch": 1, "kernel": "void bias_v1()",
         "duration_us": 10.0, "dram_gbps": 1000.0, "run_id": "r1"},      # 10 MB
        {**base, "version": "v10", "role": "ours", "precision": "tf32", "launch": 0, "kernel": "void linear_v10()",
         "duration_us": 20.0, "dram_gbps": 800.0, "run_id": "r1"},       # 16 MB
        {**base, "version": "torch.tf32", "role": "baseline", "precision": "tf32", "launch": 0,
         "kernel": "nvjet_tst_128x128", "duration_us": 16.0, "dram_gbps": 1000.0, "run_id": "r1"},   # 16 MB
    ]


def test_an_op_with_flops_gets_a_roofline_with_filled_and_hollow_markers(h100):
    results.append(_linear_rows(), columns=profile.NCU_COLUMNS, name=profile.NCU)
    op = registry.get("linear").op("linear")
    s = profile.parse_shape_label(LINEAR)
    flops, formula = op.flops(s, torch.float32), op.nbytes(s, torch.float32)
    assert (flops, formula) == (2 * 1024 ** 3, (3 * 1024 * 1024 + 1024) * 4)
    measured = {"v1": 50e6, "v10": 16e6, "torch.tf32": 16e6}
    time_us = {"v1": 110.0, "v10": 20.0, "torch.tf32": 16.0}
    fig = plot.plot_roofline_measured("linear", "linear", device_name=H100, dtype="float32", save=False)
    ax = fig.axes[0]
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    marks = [ln for ln in ax.lines if ln.get_marker() not in (None, "None", "") and len(ln.get_xdata()) == 1]
    filled = [ln for ln in marks if ln.get_markerfacecolor() != "none"]
    hollow = [ln for ln in marks if ln.get_markerfacecolor() == "none"]
    for v in ("v1", "v10", "torch.tf32"):
        y = flops / (time_us[v] * 1e-6) / 1e12
        f = [ln for ln in filled if ln.get_xdata()[0] == pytest.approx(flops / measured[v])
             and ln.get_ydata()[0] == pytest.approx(y)]
        h = [ln for ln in hollow if ln.get_xdata()[0] == pytest.approx(flops / formula)
             and ln.get_ydata()[0] == pytest.approx(y)]
        assert len(f) == 1 and len(h) == 1, v
        assert f[0].get_color() == h[0].get_color()                # one version, one color, joined by a line
        assert any(len(ln.get_xdata()) == 2 and sorted(ln.get_xdata()) == sorted([flops / measured[v], flops / formula])
                   for ln in ax.lines), v
    labels = [ln.get_label() for ln in ax.lines]
    assert any(lab.startswith("copy roof 3,000 GB/s") for lab in labels)
    assert any(lab.startswith("cuBLAS float32 51") for lab in labels)   # v1's ceiling
    assert any(lab.startswith("cuBLAS tf32 370") for lab in labels)     # v10's and the baseline's
    fig.canvas.draw()
    footer = [t for t in fig.texts if "commit abc1234" in t.get_text()]
    assert footer and _inside(fig, footer[0]) and _inside(fig, ax.title) and _inside(fig, ax.get_legend())
    matplotlib.pyplot.close(fig)
    table = profile.measured_bytes_table("linear", "linear").splitlines()
    assert table[2].split()[:7] == ["v1", "2", "110.00", "50.000", f"{formula / 1e6:.3f}",
                                    f"{50e6 / formula:.2f}", f"{50e6 / 110e-6 / 1e9:.0f}"]


def test_lab_plot_draws_the_measured_figures_of_a_device_with_ncu_rows(h100):
    results.append(_linear_rows(), columns=profile.NCU_COLUMNS, name=profile.NCU)
    paths = plot.plot_all(device_name=H100)
    names = sorted(p.name for p in paths if p.name.endswith("_measured.png"))
    assert names == ["embedding_forward_float32_measured.png", "linear_linear_float32_measured.png"]
    assert all(p.parent == h100 / "plots" for p in paths)
