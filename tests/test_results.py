import csv

import pytest

from lab import registry, results


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
    # Another machine's GPU (not the H100: on the H100 machine that is one of this machine's devices).
    other = "NVIDIA Elsewhere GPU (another machine)"
    results.append([_timing(other, "v2", n, n / 1e3) for n in (1 << 20, 1 << 22)])
    elsewhere = tmp_path / "nvidia-elsewhere-gpu-another-machine"
    assert env.device_dir(other) == elsewhere and (elsewhere / "results.csv").exists()
    before = (elsewhere / "results.csv").read_text()
    results.append([_timing(here, v, n, n / 5e2, "cpu") for v in ("cpu", "torch") for n in (1 << 10, 1 << 12)])
    assert (elsewhere / "results.csv").read_text() == before
    assert (env.device_dir(here) / "results.csv").exists() and env.device_dir(here) != elsewhere
    assert {r["device_name"] for r in results.read()} == {other, here}        # reading: every device's table
    assert {r["device_name"] for r in results.read(env.device_dir(here) / "results.csv")} == {here}
    figs = plot.plot_all()
    assert figs and all(p.parent == env.device_dir(here) / "plots" for p in figs)   # (this machine's GPU has no rows)
    assert not (elsewhere / "plots").exists()
    assert plot.plot_all(other) and (elsewhere / "plots").is_dir()               # named: that device's own folder


def test_cpu_rows_are_keyed_by_the_cpu_model():
    from lab import env
    name = env.device_name("cpu")
    assert name not in ("x86_64", "aarch64", "") and env.slug(name) == env.device_dir(name).name
    assert env.slug("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"


def test_status_headlines_compare_within_one_mode_and_precision():
    """README's status table: per op and dtype, our fastest kernel against the fastest baseline of the same precision
    in the same mode — a graph replay is never divided into an eager baseline, TF32 never into strict fp32."""
    from lab import report
    rows = [dict(_timing(H100, v, 1 << 20, us), mode=mode, precision=prec, family="linear", op="linear",
                 shape="M=8", size=8)
            for v, mode, prec, us in [("torch", "events", "float32", 100.0), ("torch", "graph", "float32", 60.0),
                                      ("v8", "events", "float32", 80.0), ("v8", "graph", "float32", 50.0),
                                      ("torch.tf32", "events", "tf32", 20.0), ("v12", "events", "tf32", 25.0)]]
    hs = {h["precision"]: h for h in report.headlines(rows)}
    o, b = hs["float32"]["modes"]["events"]
    assert (o["version"], b["version"], b["median_us"] / o["median_us"]) == ("v8", "torch", 1.25)
    o, b = hs["float32"]["modes"]["graph"]
    assert (o["version"], b["mode"], b["median_us"] / o["median_us"]) == ("v8", "graph", 1.2)
    o, b = hs["tf32"]["modes"]["events"]
    assert (o["version"], b["version"]) == ("v12", "torch.tf32") and "graph" not in hs["tf32"]["modes"]


def test_status_headlines_take_the_sweeps_largest_shape_not_a_rerun_of_a_smaller_one():
    """A later commit that timed a smaller shape again, or one version at the largest (`lab compare --rerun`, an
    A/B), does not replace the sweep's largest shape and its versions in README's table; a later run of them does."""
    from lab import report
    sizes = sorted(s["n"] for s in registry.get("basics").op("square").bench_shapes)
    def row(commit, ts, n, v, us):
        return dict(_timing(H100, v, n, us), commit=commit, timestamp=ts, run_id=commit)
    sweep = [row("aaa", "2026-11-26T10:00", n, v, us) for n in sizes for v, us in (("torch", 9.0), ("v2", 8.0))]
    rerun = [row("bbb", "2026-11-26T12:00", sizes[0], v, 7.0) for v in ("torch", "v2")] + \
        [row("bbb", "2026-11-26T12:00", sizes[-1], "v2", 7.5)]                 # a rerun of one version there
    (h,) = report.headlines(sweep + rerun)
    assert h["shape"] == f"n={sizes[-1]}" and h["modes"]["events"][0]["commit"] == "aaa"
    later = [row("ccc", "2026-11-26T14:00", sizes[-1], v, 5.0) for v in ("torch", "v2")]
    (h,) = report.headlines(sweep + rerun + later)
    assert h["shape"] == f"n={sizes[-1]}" and h["modes"]["events"][0]["commit"] == "ccc"


def test_status_headlines_pick_a_run_per_precision():
    """A later run that timed only the TF32 rung (and its baselines) at the sweep's largest shape adds a TF32 line; the
    strict-fp32 line still comes from the earlier run that timed the strict-fp32 kernels there."""
    from lab import report
    def row(commit, v, prec, us):
        return dict(_timing(H100, v, 1 << 20, us), commit=commit, timestamp=f"2026-11-26T1{len(commit)}:00",
                    run_id=commit, precision=prec, family="linear", op="linear", shape="M=8", size=8)
    strict = [row("aaa", v, "float32", us) for v, us in (("torch", 100.0), ("v8", 80.0), ("v7", 90.0))]
    tf32 = [row("bbbb", v, "tf32", us) for v, us in (("torch.tf32", 20.0), ("v11", 25.0))] + \
        [row("bbbb", "torch", "float32", 101.0)]           # its strict baseline, timed beside it
    hs = {h["precision"]: h for h in report.headlines(strict + tf32)}
    assert set(hs) == {"float32", "tf32"}
    o, b = hs["float32"]["modes"]["events"]
    assert (o["version"], o["commit"], b["commit"]) == ("v8", "aaa", "aaa")
    o, b = hs["tf32"]["modes"]["events"]
    assert (o["version"], b["version"], o["commit"]) == ("v11", "torch.tf32", "bbbb")


def test_build_times_go_to_their_device_and_an_old_table_is_migrated(tmp_path, monkeypatch):
    from lab import buildtime
    monkeypatch.setenv("LAB_RESULTS_DIR", str(tmp_path))
    h = tmp_path / "nvidia-h100-80gb-hbm3"
    h.mkdir()
    (h / "build_times.csv").write_text("family,flavor,event,seconds,device_name,cpus,torch,commit,timestamp\n"
                                       f"basics,cuda,cold_build,14.1,{H100},16,2.11,x,2026\n")
    row = dict(family="basics", flavor="cpu", event="edit_unit", target="a.cu", seconds=1.0, cpus=2, torch="t",
               commit="c", timestamp="2026", run_id="r")
    buildtime.append([dict(row, device_name="Some CPU"), dict(row, device_name=H100, flavor="cuda")])
    got = results.read(h / "build_times.csv", numeric={"seconds"})
    assert [(r["event"], r["target"], r["seconds"]) for r in got] == [("cold_build", None, 14.1),
                                                                      ("edit_unit", "a.cu", 1.0)]
    assert [r["device_name"] for r in results.read(tmp_path / "some-cpu" / "build_times.csv")] == ["Some CPU"]


def test_build_time_table_puts_together_the_newest_run_of_each_family():
    """The lent H100 runs a few families per call: README's table takes the newest measurement of each edit (not only
    the newest run's families or targets), and the cold build from the run that built the most families."""
    from lab import buildtime

    def row(run, ts, fam, ev, s, target=""):
        return dict(family=fam, flavor="cuda", event=ev, target=target, seconds=str(s), device_name=H100, cpus="16",
                    torch="2.11", commit=run, timestamp=ts, run_id=run)
    from lab.build import families_on_disk
    rows = [row("a", "2026-01-01T00:00", "(all)", "cold_build_all", 38.0, ",".join(families_on_disk())),
            row("a", "2026-01-01T00:00", "linear", "edit_unit", 4.0, "cuda_src/linear/v1.cu"),
            row("a", "2026-01-01T00:00", "gru", "edit_unit", 9.0, "cuda_src/gru/v3.cu"),
            row("b", "2026-01-02T00:00", "(all)", "cold_build_all", 20.0, "gru"),
            row("a", "2026-01-01T00:00", "gru", "edit_binding", 20.0, "cpp_src/gru/gru.cpp"),
            row("b", "2026-01-02T00:00", "(all)", "cold_build_all", 20.0, "gru"),
            row("b", "2026-01-02T00:00", "gru", "edit_binding", 8.0, "cpp_src/gru/gru.cpp")]
    got = {(r["family"], r["event"]): r["seconds"] for r in buildtime.latest_run(rows, H100)}
    assert got == {("linear", "edit_unit"): "4.0", ("gru", "edit_unit"): "9.0", ("gru", "edit_binding"): "8.0",
                   ("(all)", "cold_build_all"): "38.0"}
    md = buildtime.readme_table(rows)
    assert "| gru | 9.0 s (v3.cu) | – | – | 8.0 s" in md and "| linear | 4.0 s (v1.cu)" in md and "every family 38.0 s" in md


def test_compare_flags_only_real_slowdowns_and_maps_old_names():
    from lab import compare
    def row(version, commit, ts, med, p20, p80, family="kron", op="forward", shape="batch=8 factors=64x64"):
        return {"device_name": "GPU", "family": family, "op": op, "version": version, "dtype": "float32",
                "shape": shape, "mode": "events", "commit": commit, "timestamp": ts, "median_us": str(med),
                "p20_us": str(p20), "p80_us": str(p80)}
    rows = [
        row("v3", "old1111", "2026-11-20T10:00:00", 100, 99, 101),                    # kron's old v3 = today's v1
        # (rows before lab/renames.json's renamed_at are read in today's names; newer ones as they are)
        row("v1", "new2222", "2026-11-25T10:00:00", 120, 119, 121),                    # 20% slower, bands apart
        row("v4", "old1111", "2026-11-20T10:00:00", 100, 90, 110),                     # old v4 = today's v2
        row("v2", "new2222", "2026-11-25T10:00:00", 108, 95, 112),                     # 8% slower, bands overlap: noise
        row("v1", "old1111", "2026-11-20T10:00:00", 50, 49, 51),                       # old v1 = today's torch
        row("torch", "new2222", "2026-11-25T10:00:00", 49, 48, 50),
    ]
    es = {e["version"]: e for e in compare.compare(rows)}
    assert set(es) == {"v1", "v2", "torch"}
    assert es["v1"]["slower"] and es["v1"]["base_us"] == 100 and abs(es["v1"]["ratio"] - 1.2) < 1e-9
    assert not es["v2"]["slower"] and not es["torch"]["slower"]
    assert "1 slower" in compare.report(list(es.values()))


def test_compare_takes_each_rows_base_from_just_before_it_so_an_ab_run_compares_on_one_machine():
    # An A/B run (issue 13): the base commit's tree and the new one timed alternately on one GPU, after the new
    # commit had rows of its own earlier that day. Each new row is set against the base row timed just before it.
    from lab import compare
    def row(commit, ts, med):
        return {"device_name": "GPU", "family": "rope", "op": "rope", "version": "v2", "dtype": "float16",
                "shape": "seq=512", "mode": "events", "commit": commit, "timestamp": ts, "median_us": str(med),
                "p20_us": str(med - 0.1), "p80_us": str(med + 0.1)}
    rows = [row("base", "2026-11-26T13:00:00", 24.9),     # the base commit, on another machine
            row("new", "2026-11-26T18:00:00", 27.7),      # the new commit, on this one
            row("base", "2026-11-26T18:30:00", 27.7),     # A: the base commit's tree, this machine
            row("new", "2026-11-26T18:31:00", 27.6)]      # B: the new tree, just after
    es = sorted(compare.compare(rows, new="new", base="base"), key=lambda e: e["new_us"])
    assert [(e["base_us"], e["new_us"]) for e in es] == [(27.7, 27.6), (24.9, 27.7)]
    assert not es[0]["slower"] and es[1]["slower"]


def test_old_rows_are_read_in_todays_names_and_new_rows_as_recorded():
    from lab import results
    before, _ = results._renames()
    old = {"family": "kron", "op": "forward", "version": "v3", "dtype": "float32", "timestamp": "2026-11-20T10:00:00",
           "baseline": "v2 (graph)"}
    assert old["timestamp"] < before
    r = results.current_names(old)
    assert (r["version"], r["baseline"]) == ("v1", "torch.bmm (graph)")
    newer = dict(old, timestamp="2099-01-01T00:00:00")
    assert results.current_names(newer) == newer
    gemv = {"family": "linear", "op": "fc_out", "version": "v14", "dtype": "float32", "timestamp": "2026-11-22T12:46:45"}
    assert (results.current_names(gemv)["op"], results.current_names(gemv)["version"]) == ("gemv", "v1")


def test_status_marks_a_percentage_above_its_ceiling_and_says_why(tmp_path):
    """A byte formula that counts L2 hits as DRAM traffic (Zipf embedding lookups) reads above the copy rate: the
    status table marks such a cell and explains it; a cell within the ceiling gets no mark."""
    from lab import report
    rows = [dict(_timing(H100, v, 1 << 20, us), pct_copy_bw=pct)
            for v, us, pct in [("v1", 50.0, 135.4), ("torch", 60.0, 112.0)]]
    results.append(rows, tmp_path / results.TABLE)
    text = report.readme_status(tmp_path)
    assert "135.4% of copy †" in text and "† above the copy rate" in text
    rows = [dict(_timing(H100, v, 1 << 20, us), pct_copy_bw=pct) for v, us, pct in [("v1", 50.0, 95.0)]]
    (tmp_path / results.TABLE).unlink()
    results.append(rows, tmp_path / results.TABLE)
    text = report.readme_status(tmp_path)
    assert "95.0% of copy |" in text and "†" not in text


def test_merging_a_gpu_runs_tables_appends_new_rows_stamped_with_the_commit_sent(tmp_path):
    """.ci/merge_results.py: the lent machine's copy of a table holds the old rows and this run's; only this run's are
    appended, stamped with the sha sent (the lent copy's stale .git stamped them "b9efbe748a+dirty")."""
    import importlib.util
    import pathlib
    spec = importlib.util.spec_from_file_location(
        "merge_results", pathlib.Path(__file__).resolve().parent.parent / ".ci" / "merge_results.py")
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    old = dict(_timing(H100, "v1", 8, 1.0), commit="abc1234")
    new = dict(_timing(H100, "v2", 8, 2.0), commit="b9efbe748a+dirty")
    dst, src = tmp_path / "dst.csv", tmp_path / "src.csv"
    results.append([old], dst)
    results.append([old, new], src)
    assert m.merge_table(src, dst, "d465051abcdef", dry=False) == (1, 2)
    rows = results.read(dst)
    assert [(r["version"], r["commit"]) for r in rows] == [("v1", "abc1234"), ("v2", "d465051")]
    assert m.merge_table(src, dst, "d465051abcdef", dry=False) == (0, 2)      # a second merge adds nothing
    assert m.merge_table(src, dst, "d465051abcdef", dry=True) == (0, 2)       # and a dry run says so
    # a checkout's table from before columns were added takes a newer run's rows under the newer header
    older = tmp_path / "older.csv"
    results.append([old], older, results.COLUMNS[:-2])
    assert m.merge_table(src, older, "d465051abcdef", dry=True) == (1, 2)     # (a dry run changes nothing)
    with open(older, newline="") as f:
        assert next(csv.reader(f)) == results.COLUMNS[:-2]
    assert m.merge_table(src, older, "d465051abcdef", dry=False) == (1, 2)
    with open(older, newline="") as f:
        got = list(csv.DictReader(f))
    assert list(got[0]) == results.COLUMNS and [r["version"] for r in got] == ["v1", "v2"]


def test_compare_explains_a_slowdown_by_the_baselines_the_graph_row_or_the_timing_rule():
    """Five of our rows 2x slower: a baseline that moved as much (machine), a steady graph row of the same call or a
    steady GPU part (host time), a base timed before host time counted with a baseline slower too (rule), and one
    nothing explains -- the only one that fails `lab compare`."""
    from lab import compare
    def row(version, commit, ts, med, mode="events", shape="n=1"):
        return {"device_name": "GPU", "family": "basics", "op": "square", "version": version, "dtype": "float32",
                "shape": shape, "mode": mode, "commit": commit, "timestamp": ts, "median_us": str(med),
                "p20_us": str(med * 0.99), "p80_us": str(med * 1.01)}
    old, new = ("o", "2026-11-26T00:00:00"), ("n", "2026-11-27T00:00:00")   # both after the rule
    before = ("b", "2026-11-20T00:00:00")                                      # before it
    rows = [row("v1", *old, 10, shape="n=1"), row("v1", *new, 20, shape="n=1"),          # machine: torch 2x too
            row("torch", *old, 10, shape="n=1"), row("torch", *new, 20, shape="n=1"),
            row("v1", *old, 10, shape="n=2"), row("v1", *new, 20, shape="n=2"),          # host: graph row steady
            row("v1", *new, 10, mode="graph", shape="n=2"),
            row("v1", *before, 10, shape="n=3"), row("v1", *new, 20, shape="n=3"),       # rule
            row("torch", *before, 10, shape="n=3"), row("torch", *new, 13, shape="n=3"),
            row("v1", *old, 10, shape="n=4"), row("v1", *new, 20, shape="n=4"),          # unexplained
            row("torch", *old, 10, shape="n=4"), row("torch", *new, 10, shape="n=4"),
            row("v1", *before, 10, shape="n=5"), dict(row("v1", *new, 20, shape="n=5"), gpu_us="10.2"),  # GPU part
            # a base since the rule without gpu_us: its whole time bounds its GPU part (n=6 within it, n=7 above it)
            row("v1", *old, 10, shape="n=6"), dict(row("v1", *new, 20, shape="n=6"), gpu_us="3"),
            row("v1", *old, 10, shape="n=7"), dict(row("v1", *new, 20, shape="n=7"), gpu_us="19"),
            # a fixed cost per call: torch (same scale) grew by as many us, a smaller ratio (n=8: machine); a long
            # baseline's few percent as many us explains nothing (n=9)
            row("v1", *old, 5, shape="n=8"), row("v1", *new, 7, shape="n=8"),
            row("torch", *old, 15, shape="n=8"), row("torch", *new, 17, shape="n=8"),
            row("v1", *old, 5, shape="n=9"), row("v1", *new, 10, shape="n=9"),
            row("torch", *old, 100, shape="n=9"), row("torch", *new, 106, shape="n=9")]
    es = compare.explain(compare.compare(rows, new="n"))
    why = {e["shape"]: e["why"] for e in es if e["version"] == "v1"}
    assert why == {"n=1": "machine", "n=2": "host", "n=3": "rule", "n=4": "", "n=5": "host", "n=6": "host", "n=7": "",
                   "n=8": "machine", "n=9": ""}
    text = compare.report(es)
    assert "of ours: 3 unexplained, 2 where a baseline moved as much (machine), 3 whose GPU part or graph row is " \
           "steady (host time), 1 timed before de761d0 where a baseline got slower too (rule)" in text
    assert text.splitlines()[1].split()[1:3] == ["basics.square", "v1"] and "n=" in text.splitlines()[1]   # first
    # the unexplained rows (n=4, n=7) as `lab bench` commands, one per measurement; the explained ones not
    assert sorted(compare.rerun_commands(es)) == [
        "python -m lab bench basics --op square --dtype float32 --size n=4 --version v1",
        "python -m lab bench basics --op square --dtype float32 --size n=7 --version v1",
        "python -m lab bench basics --op square --dtype float32 --size n=9 --version v1"]


def test_a_table_written_before_columns_were_added_is_upgraded_not_shifted(tmp_path):
    old_cols = results.COLUMNS[:-2]
    path = tmp_path / results.TABLE
    results.append([{"family": "basics", "op": "square", "version": "v1", "median_us": 5.0}], path, old_cols)
    results.append([{"family": "basics", "op": "square", "version": "v2", "median_us": 4.0, "gpu_us": 3.0,
                     "host_us": 4.0}], path)
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == results.COLUMNS
    assert (rows[0]["version"], rows[0]["median_us"], rows[0]["gpu_us"]) == ("v1", "5", "")
    assert (rows[1]["version"], rows[1]["gpu_us"], rows[1]["host_us"]) == ("v2", "3", "4")
    other = tmp_path / "other.csv"
    other.write_text("family,median_us,op\nbasics,1,square\n")
    with pytest.raises(ValueError, match="is not a prefix of the columns written now"):
        results.append([{"family": "basics"}], other)
