"""%load_ext lab: %%lab_source writes the cell to the file on disk and rebuilds (a build error shows with its line
marked); %lab_check prints the CLI's table."""
import pytest

pytest.importorskip("IPython", reason="IPython not installed (pip install -e '.[test]')")


def test_lab_source_writes_the_file_rebuilds_and_marks_errors(faulty, capsys):
    from IPython.core.interactiveshell import InteractiveShell
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "lab")
    path = faulty["root"] / "cpp_src" / "faulty" / "cpu.cpp"
    good = path.read_text()
    bad = good.replace("y[i] = 2.0f * x[i];", "y[i] = 2.0f * x[i] +;")
    shell.run_cell_magic("lab_source", "cpp_src/faulty/cpu.cpp", bad)
    out = capsys.readouterr().out
    assert path.read_text() == bad                                  # the file on disk is the truth
    assert "cpp_src/faulty/cpu.cpp:10: error:" in out and "  >   10 |" in out, out
    shell.run_cell_magic("lab_source", "cpp_src/faulty/cpu.cpp", good.replace("2.0f * x[i]", "2.0f * x[i] + 0.0f"))
    out = capsys.readouterr().out
    assert "faulty ready in" in out, out
    shell.run_line_magic("lab_check", "faulty --device cpu --version cpu --seeds 1")
    out = capsys.readouterr().out
    assert "scale" in out and "2/2 passed" in out, out
    shell.run_cell_magic("lab_source", "notebooks/x.cu", "int x;")
    assert "writes kernel sources only" in capsys.readouterr().out
