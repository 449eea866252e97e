"""Every walkthrough notebook runs top to bottom on this machine (CI: CPU only; GPU cells say why they skip).

Executed into a scratch copy: the committed notebooks keep their H100 outputs. Results go to a scratch results
directory seeded with the committed tables, so plotting cells have data and nothing in results/ changes.
"""
import shutil

import pytest

nbclient = pytest.importorskip("nbclient", reason="nbclient not installed (pip install -e '.[test]')")
pytest.importorskip("ipykernel", reason="ipykernel not installed (pip install -e '.[test]')")

from lab import env, notebooks  # noqa: E402

NBS = sorted((env.ROOT / "notebooks").glob("*.ipynb"))


@pytest.mark.parametrize("nb", NBS, ids=[p.stem for p in NBS])
def test_notebook_runs(nb, tmp_path, monkeypatch):
    res = tmp_path / "results"
    res.mkdir()
    committed = sorted(d for d in (env.ROOT / "results").iterdir() if d.is_dir())
    for d in committed:           # each device's committed tables, not its figures or profiles
        (res / d.name).mkdir()
        for f in ("results.csv", "ceilings.json", "build_times.csv"):
            if (d / f).exists():
                shutil.copy(d / f, res / d.name / f)
    monkeypatch.setenv("LAB_RESULTS_DIR", str(res))
    out = notebooks.execute(nb, tmp_path / nb.name, timeout=1200)
    import nbformat
    ran = nbformat.read(out, as_version=4)
    errors = [o for c in ran.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors, errors[0].get("ename", "") + ": " + errors[0].get("evalue", "")


def test_notebook_command_line_takes_in_place_after_run():
    """README and .ci/gpu write `python -m lab.notebooks run --in-place NAME` (it once failed: 'unrecognized
    arguments')."""
    from lab import notebooks
    for argv in (["run", "--in-place", "03_gru", "07_rope"], ["--in-place", "run", "03_gru", "07_rope"]):
        a = notebooks.parse_args(argv)
        assert (a.cmd, a.in_place, a.names) == ("run", True, ["03_gru", "07_rope"])
    assert notebooks.parse_args(["check"]).names == []
