"""Write and execute the walkthrough notebooks (`notebooks/NN_<family>.ipynb`).

    python -m lab.notebooks run all            # execute every notebook into results/<device>/notebooks/
    python -m lab.notebooks run --in-place all # over notebooks/*.ipynb (on the H100: the outputs we commit)
    python -m lab.notebooks run 01_cuda_basics # one notebook
    python -m lab.notebooks check              # execute into a scratch copy (the CI test; outputs not kept)

Notebooks define nothing reusable: they import from `lab` and show kernel sources read from disk.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from . import env

NB_DIR = env.ROOT / "notebooks"


def new(path: Path | str, cells: list[tuple[str, str]]) -> Path:
    """Write a notebook from [("md"|"code", source), ...] (no outputs)."""
    import nbformat  # optional (the [test] and [notebooks] extras): only the notebook commands need it
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    for kind, src in cells:
        src = src.strip("\n")
        nb.cells.append(nbformat.v4.new_markdown_cell(src) if kind == "md" else nbformat.v4.new_code_cell(src))
    path = Path(path)
    nbformat.write(nb, path)
    return path


def source_span(path: str, start: str | None = None, end: str | None = None) -> tuple[list[str], int, int]:
    """(lines of the file, i0, i1): the first line containing `start` (else the first line) through the next line
    after it containing `end` (else the last line). A marker that is given and not found raises ValueError: an
    excerpt whose function was renamed must fail, not quietly print the file's head."""
    p = env.ROOT / path
    lines = p.read_text().splitlines()
    i0 = next((i for i, ln in enumerate(lines) if start in ln), None) if start else 0
    if i0 is None:
        raise ValueError(f"show_source: no line of {path} contains {start!r}")
    i1 = next((i for i, ln in enumerate(lines) if i > i0 and end in ln), None) if end else len(lines) - 1
    if i1 is None:
        raise ValueError(f"show_source: no line of {path} after line {i0 + 1} contains {end!r}")
    return lines, i0, i1


def show_source(path: str, start: str | None = None, end: str | None = None) -> None:
    """Print a kernel source from disk (or the part between the lines containing `start` and `end`)."""
    lines, i0, i1 = source_span(path, start, end)
    print(f"// {path}, lines {i0 + 1}-{i1 + 1}")
    for i in range(i0, i1 + 1):
        print(f"{i + 1:4d}  {lines[i]}")


def notebooks(names: list[str] | None = None) -> list[Path]:
    allnb = sorted(NB_DIR.glob("*.ipynb"))
    if not names or names == ["all"]:
        return allnb
    out = []
    for n in names:
        hits = [p for p in allnb if p.stem == n or p.stem.startswith(n) or n in p.stem]
        if not hits:
            raise SystemExit(f"no notebook matches {n!r}; notebooks: {', '.join(p.stem for p in allnb)}")
        out += hits
    return out


def execute(path: Path, out_path: Path | None = None, timeout: int = 1800) -> Path:
    """Execute a notebook top to bottom with nbclient (cwd = notebooks/) and write it (in place by default)."""
    import nbformat  # optional, as above
    from nbclient import NotebookClient
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(NB_DIR)}})
    t0 = time.perf_counter()
    client.execute()
    out_path = out_path or path
    nbformat.write(nb, out_path)
    print(f"[lab] executed {path.name} in {time.perf_counter() - t0:.0f} s -> {out_path}", flush=True)
    return out_path


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m lab.notebooks")
    p.add_argument("cmd", choices=["run", "check"],
                   help="run: execute and keep the outputs (in results/<device>/notebooks/, or in place with "
                        "--in-place); check: execute into a scratch copy")
    p.add_argument("names", nargs="*")
    p.add_argument("--in-place", action="store_true",
                   help="write the executed notebooks over notebooks/*.ipynb (the committed ones hold the H100's "
                        "outputs: do this only on the machine whose outputs they should show)")
    return p.parse_intermixed_args(argv)   # `run --in-place 03_gru` as README writes it, or `--in-place run ...`


def main(argv=None) -> int:
    a = parse_args(argv)
    paths = notebooks(a.names)
    failed = []
    keep = env.results_dir() / "notebooks"
    with tempfile.TemporaryDirectory() as tmp:
        for nb in paths:  # one failing notebook does not stop the others
            try:
                if a.cmd == "check":
                    out = Path(tmp) / nb.name
                elif a.in_place:
                    out = None
                else:
                    keep.mkdir(parents=True, exist_ok=True)
                    out = keep / nb.name
                execute(nb, out)
            except Exception as e:  # nbclient's CellExecutionError carries the cell and the traceback
                failed.append(nb.name)
                print(f"[lab] FAILED {nb.name}: {type(e).__name__}: {str(e)[-1500:]}", flush=True)
    print(f"[lab] notebooks: {len(paths) - len(failed)}/{len(paths)} ran" + (f"; failed: {failed}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
