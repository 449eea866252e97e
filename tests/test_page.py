"""results/index.html: one self-contained page of every device's results, opened in a real headless browser."""
import re
import shutil
import subprocess

import pytest

from lab import env, page


@pytest.fixture
def committed(tmp_path, monkeypatch):
    """A scratch results root holding a copy of the committed device tables (no figures)."""
    for d in sorted(p for p in (env.ROOT / "results").iterdir() if p.is_dir()):
        (tmp_path / d.name).mkdir()
        for f in ("results.csv", "checks.csv", "build_times.csv", "ceilings.json"):
            if (d / f).exists():
                shutil.copy(d / f, tmp_path / d.name / f)
    monkeypatch.setenv("LAB_RESULTS_DIR", str(tmp_path))
    return tmp_path


def _groups(root) -> set:
    """(device section, family, op, dtype): the page draws one chart per (family, op, dtype) in each device's section,
    its sections in the order of the device folders (dev0, dev1, ...)."""
    from lab import results
    dirs = [d for d in env.device_dirs() if (d / results.TABLE).exists()]
    return {(n, r["family"], r["op"], r["dtype"]) for n, d in enumerate(dirs) for r in results.read(d / results.TABLE)
            if r["median_us"] and r["mode"] != "wall"}


def test_page_has_every_family_and_a_chart_per_op_and_dtype(committed):
    path = page.write()
    text = path.read_text()
    assert path == committed / "index.html"
    assert "http://" not in text and "https://" not in text and "<script src" not in text   # self-contained
    groups = _groups(committed)
    assert groups and text.count('<figure class="chart"') == len(groups)
    for n, fam in {g[:2] for g in groups}:
        assert f'<h3 class="family" id="dev{n}-{fam}">' in text
    assert "<title>" in text and "median" in text                                          # hover text


def test_page_loads_in_a_headless_browser_without_errors(committed, tmp_path):
    exe = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if not exe:
        pytest.skip("no chromium on this machine (.ci/run installs Debian's chromium package)")
    path = page.write()
    base = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--enable-logging=stderr",
            "--v=0", "--window-size=1300,2400"]
    r = subprocess.run(base + ["--dump-dom", path.as_uri()], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    ran = re.search(r'data-charts="(\d+)"', r.stdout)                  # the page's script ran to its last line
    assert ran and int(ran.group(1)) == len(_groups(committed))
    console = [ln for ln in r.stderr.splitlines() if "CONSOLE" in ln or "Uncaught" in ln]
    assert not console, console
    shot = tmp_path / "page.png"
    r = subprocess.run(base + [f"--screenshot={shot}", path.as_uri()], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and shot.stat().st_size > 50_000, r.stderr[-2000:]
