"""Write and execute the walkthrough notebooks (`notebooks/NN_<family>.ipynb`).

    python -m lab.notebooks run all            # execute every notebook in place (on the H100: commits its outputs)
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
    import nbformat
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    for kind, src in cells:
        src = src.strip("\n")
        nb.cells.append(nbformat.v4.new_markdown_cell(src) if kind == "md" else nbformat.v4.new_code_cell(src))
    path = Path(path)
    nbformat.write(nb, path)
    return path


def show_source(path: str, start: str | None = None, end: str | None = None) -> None:
    """Print a kernel source from disk (or the part between the lines containing `start` and `end`)."""
    p = env.ROOT / path
    lines = p.read_text().splitlines()
    i0 = next((i for i, ln in enumerate(lines) if start in ln), 0) if start else 0
    i1 = next((i for i, ln in enumerate(lines) if i > i0 and end in ln), len(lines) - 1) if end else len(lines) - 1
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
    import nbformat
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


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m lab.notebooks")
    p.add_argument("cmd", choices=["run", "check"])
    p.add_argument("names", nargs="*")
    a = p.parse_args(argv)
    paths = notebooks(a.names)
    failed = []
    with tempfile.TemporaryDirectory() as tmp:
        for nb in paths:  # one failing notebook does not stop the others
            try:
                execute(nb, None if a.cmd == "run" else Path(tmp) / nb.name)
            except Exception as e:  # nbclient's CellExecutionError carries the cell and the traceback
                failed.append(nb.name)
                print(f"[lab] FAILED {nb.name}: {type(e).__name__}: {str(e)[-1500:]}", flush=True)
    print(f"[lab] notebooks: {len(paths) - len(failed)}/{len(paths)} ran" + (f"; failed: {failed}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
