"""The embedding study (lab/studies/embedding.py) on the CPU: goals and their margins from bench-shaped rows, the
tables, kernel grouping, the figure, and the determinism probe with the CPU version."""
import pytest
import torch

from lab.kernels import embedding as E
from lab.registry import shape_label
from lab.studies import embedding as S

COPY = 3000.0   # GB/s the synthetic rows are read against


def _row(op, version, mode, dist, us, dtype="float32", tokens=65536, torch_us=None):
    s = E.make_shape(tokens, 1024, E.VOCAB, dist)
    dt = getattr(torch, dtype)
    nb = (E._bytes_fwd if op == "forward" else E._bytes_bwd)(s, dt)
    gbps = nb / (us * 1e-6) / 1e9
    return {"family": "embedding", "op": op, "version": version, "shape": shape_label(s), "size": tokens,
            "dtype": dtype, "precision": dtype, "mode": mode, "median_us": us, "p20_us": us, "p80_us": us,
            "gbps": gbps, "pct_copy_bw": 100 * gbps / COPY, "speedup": (torch_us / us) if torch_us else None,
            "device": "cuda", "device_name": "Test GPU", "torch": "2.x", "cuda": "12.x", "commit": "abc",
            "timestamp": "2025-01-01T00:00:00"}


def _rows():
    rows = []
    for mode in ("events", "graph"):
        for dist in ("uniform", "zipf"):
            fwd_t = 200.0                                    # 537 MB in 200 us = 2684 GB/s, 89% of 3000
            rows += [_row("forward", "torch", mode, dist, fwd_t, torch_us=fwd_t),
                     _row("forward", "v4", mode, dist, 185.0 if mode == "graph" else 195.0, torch_us=fwd_t)]
            tb = 900.0
            rows += [_row("backward", "torch", mode, dist, tb, torch_us=tb),
                     _row("backward", "v1", mode, dist, 250.0, torch_us=tb),
                     _row("backward", "v4", mode, dist, 200.0 if dist == "uniform" else 400.0, torch_us=tb)]
    return rows


def test_goals_values_status_and_margins():
    gs = {g["goal"]: g for g in S.goals(_rows(), {"v2": True, "v3": True, "v4": True, "v1": False},
                                       dtypes=("float32",))}
    f = gs["forward float32 uniform: % of copy (graph)"]
    assert f["value"] == pytest.approx(100 * 2 * 65536 * 1024 * 4 / 185e-6 / 1e9 / COPY)
    assert f["met"] is True and f["margin"] == pytest.approx(f["value"] / 95.0)
    b = gs["backward float32 uniform: speedup over torch (graph)"]
    assert b["value"] == pytest.approx(4.5) and b["met"] and "v4" in b["detail"]
    z = gs["backward float32 zipf: speedup over torch (graph)"]
    assert z["value"] == pytest.approx(900 / 250) and "v1" in z["detail"]        # the best version, atomics too
    d = gs["deterministic backward float32 zipf: speedup (graph)"]
    assert d["value"] == pytest.approx(900 / 400) and d["met"] and "v4" in d["detail"]   # v1 is not deterministic
    fl = gs["backward float32 zipf: time / memory floor (graph)"]
    floor_us = (65536 + E.VOCAB) * 1024 * 4 / (COPY * 1e9) * 1e6
    assert fl["value"] == pytest.approx(250.0 / floor_us) and fl["margin"] == pytest.approx(2.0 * floor_us / 250.0)
    bits = gs["deterministic backward: bit-for-bit identical run to run"]
    assert bits["met"] and bits["value"] == 3                                      # v1 is not held to it
    assert "backward float32 uniform: speedup over torch (eager)" in gs


def test_goals_without_rows_say_so():
    gs = S.goals([], dtypes=("float32",))
    assert gs and all(g["met"] is None for g in gs)
    assert "no rows" in S.goals_table(gs)


def test_missed_goal_reads_missed():
    rows = [r for r in _rows() if not (r["op"] == "backward" and r["version"] == "v1")]
    gs = {g["goal"]: g for g in S.goals(rows, dtypes=("float32",))}
    z = gs["backward float32 zipf: speedup over torch (graph)"]
    assert z["met"] is False and z["margin"] == pytest.approx(900 / 400 / 3)
    assert "MISSED" in S.goals_table(list(gs.values()))


def test_tables_print_every_row():
    rows = _rows()
    t = S.table(rows)
    assert len([ln for ln in t.splitlines() if ln.startswith(("forward", "backward"))]) == len(rows)
    assert "v4 (graph)" in t
    e = S.eager_minus_graph(rows)
    assert "forward   float32   uniform" in e and "10.0" in e                   # 195 - 185


def test_copy_rate_is_recovered_from_the_rows():
    assert S.copy_gbps_of(_rows()) == pytest.approx(COPY)


def test_group_kernels_by_stage():
    times = {"void cub::DeviceRadixSortOnesweepKernel<...>": 10.0, "void embedding::sort_inputs<long>": 1.0,
             "void embedding::rows_from_runs<float, 4, int>": 50.0, "void embedding::long_run_pieces<...>": 5.0,
             "void embedding::csr_offsets<unsigned int, 1>": 2.0, "Memcpy DtoH (Device -> Pageable)": 0.5,
             "void at::native::elementwise_kernel<...>": 3.0}
    g = S.group_kernels(times)
    assert g == {"rows_from_runs": 50.0, "sort": 11.0, "long_run_pieces": 5.0, "other": 3.0, "csr_offsets": 2.0,
                 "memcpy/memset": 0.5}
    assert list(g)[0] == "rows_from_runs"


def test_plot_ladder_draws_from_rows(tmp_path):
    rows = _rows() + [_row("forward", "v4", "graph", d, 60.0, tokens=16384) for d in ("uniform", "zipf")]
    p = S.plot_ladder(rows, path=tmp_path / "ladder.png")
    assert p is not None and p.exists() and p.stat().st_size > 10_000
    assert S.plot_ladder([r for r in rows if r["mode"] == "events"], path=tmp_path / "none.png") is None


def test_determinism_probe_on_cpu():
    d = S.determinism("cpu", ["cpu", "torch"], runs=3, tokens=3000, dim=8, vocab=50)
    assert d["cpu"]["identical"] and d["cpu"]["elements"] == 50 * 8
    assert set(d["torch"]) == {"identical", "max_elements_differing", "elements"}


def test_check_cost_times_both_settings(monkeypatch):
    # the GPU timer replaced by one call and a fixed time: the probe's calls run (CPU version), both settings timed
    calls = []

    class T:
        def __init__(self, fn):
            fn()
            calls.append(fn)
            self.median_us = 10.0 * len(calls)

    monkeypatch.setattr(S, "time_cuda", T)
    rows = S.check_cost("cpu", versions=("cpu",), tokens=64, dim=8, vocab=20)
    assert [(r["op"], r["version"]) for r in rows] == [("forward", "cpu"), ("backward", "cpu")]
    assert len(calls) == 4 and all(r["checked_us"] < r["unchecked_us"] for r in rows)
