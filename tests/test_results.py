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
