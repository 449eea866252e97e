"""lab.watch: a save rebuilds, re-checks and re-times the versions it touches; a build error is shown as
path:LINE and the watcher goes on with the last good build."""
import threading
import time

from lab import watcher


def _edit_later(path, old, new, delay):
    def go():
        time.sleep(delay)
        path.write_text(path.read_text().replace(old, new))
    t = threading.Thread(target=go, daemon=True)
    t.start()
    return t


def test_watch_rebuilds_checks_and_survives_a_build_error(faulty):
    src = faulty["root"] / "cpp_src" / "faulty" / "cpu.cpp"
    lines: list[str] = []
    stop = threading.Event()

    def out(line):
        lines.append(line)
        if "watching" in line:      # the first measurement is done: now save twice, as a person would
            _edit_later(src, "y[i] = 2.0f * x[i];", "y[i] = 2.0f * x[i] +;", 1.0)
        if "build failed" in line:
            _edit_later(src, "y[i] = 2.0f * x[i] +;", "y[i] = 3.0f * x[i];", 1.0)

    hist = watcher.watch("faulty", op="scale", versions=["cpu"], device="cpu", isolate=True, timeout=60,
                         max_events=2, duration=600, stop=stop, out=out)
    text = "\n".join(lines)
    assert len(hist) == 2, text
    assert not hist[0]["built"] and "cpp_src/faulty/cpu.cpp:10: error:" in hist[0]["error"], text
    assert hist[1]["built"], text
    # the first measurement passed; after the edit to 3x the check fails, compared with the run before
    first = [ln for ln in lines if ln.startswith("[watch] cpu")]
    assert first[0].split()[2] == "ok", text
    assert "FAIL" in first[-1] and "(was 0.0e+00)" in first[-1], text


def test_a_unit_named_like_a_version_touches_only_that_version(faulty):
    cu = faulty["root"] / "cuda_src" / "faulty"
    assert watcher.affected_versions("faulty", [cu / "v1.cu"], ["v1", "v2", "cpu"]) == ["v1"]
    assert watcher.affected_versions("faulty", [faulty["root"] / "cpp_src" / "faulty" / "cpu.cpp"],
                                     ["v1", "cpu"]) == ["cpu"]
    assert watcher.affected_versions("faulty", [cu / "faulty.cu"], ["v1", "cpu"]) == ["v1", "cpu"]
