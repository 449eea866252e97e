import pytest

from lab import results


def test_append_and_read_back(tmp_path):
    p = tmp_path / "r.csv"
    results.append([{"family": "f", "op": "o", "version": "v1", "shape": "n=3", "median_us": 1.5}], p)
    results.append([{"family": "f", "op": "o", "version": "v2", "shape": "n=3", "median_us": 0.5}], p)
    rows = results.read(p)
    assert [r["version"] for r in rows] == ["v1", "v2"]
    assert rows[1]["median_us"] == 0.5 and rows[0]["gbps"] is None
    assert p.read_text().count("family,op,version") == 1  # one header


def test_unknown_column_is_an_error_and_leaves_table_intact(tmp_path):
    p = tmp_path / "r.csv"
    results.append([{"family": "f", "op": "o"}], p)
    before = p.read_text()
    with pytest.raises(ValueError, match="unknown result columns"):
        results.append([{"family": "f", "typo_us": 1}], p)
    assert p.read_text() == before


def test_latest_keeps_newest_per_key():
    rows = [dict(family="f", op="o", version="v1", shape="s", dtype="d", device_name="g", mode="events",
                 timestamp=t, median_us=m) for t, m in (("2026-01-01", 2.0), ("2026-01-02", 1.0))]
    assert [r["median_us"] for r in results.latest(rows)] == [1.0]


H100 = "NVIDIA H100 80GB HBM3"


def _timing(device_name, version, size, us, device="cuda"):
    return dict(family="basics", op="square", version=version, shape=f"n={size}", size=size, dtype="float32",
                precision="float32", device=device, device_name=device_name, mode="events" if device == "cuda" else "cpu",
                median_us=us, p20_us=us, p80_us=us, reps=10, gbps=8 * size / us / 1e3, tflops=None, baseline=None,
                speedup=None, torch="2.11", cuda="13.0", commit="abc", timestamp="2026-11-24T10:00:00", run_id="r")


def test_each_device_has_its_own_folder_and_a_run_here_leaves_the_others_alone(tmp_path, monkeypatch):
    """A new user's run must not rewrite the H100's rows or figures: rows go to results/<their device>/, and `lab
    plot` (plot_all's default) draws only this machine's devices."""
    from lab import env, plot
    monkeypatch.setenv("LAB_RESULTS_DIR", str(tmp_path))
    here = env.device_name("cpu")
    results.append([_timing(H100, "v2", n, n / 1e3) for n in (1 << 20, 1 << 22)])
    h100 = tmp_path / "nvidia-h100-80gb-hbm3"
    assert env.device_dir(H100) == h100 and (h100 / "results.csv").exists()
    before = (h100 / "results.csv").read_text()
    results.append([_timing(here, v, n, n / 5e2, "cpu") for v in ("cpu", "torch") for n in (1 << 10, 1 << 12)])
    assert (h100 / "results.csv").read_text() == before
    assert (env.device_dir(here) / "results.csv").exists() and env.device_dir(here) != h100
    assert {r["device_name"] for r in results.read()} == {H100, here}        # reading: every device's table
    assert {r["device_name"] for r in results.read(env.device_dir(here) / "results.csv")} == {here}
    figs = plot.plot_all()
    assert figs and all(p.parent == env.device_dir(here) / "plots" for p in figs)
    assert not (h100 / "plots").exists()
    assert plot.plot_all(H100) and (h100 / "plots").is_dir()               # named: that device's own folder


def test_cpu_rows_are_keyed_by_the_cpu_model():
    from lab import env
    name = env.device_name("cpu")
    assert name not in ("x86_64", "aarch64", "") and env.slug(name) == env.device_dir(name).name
    assert env.slug("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"
