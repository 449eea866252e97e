"""Notebook magics: `%load_ext lab`, then

    %%lab_source cuda_src/basics/square.cu      the cell becomes that file on disk (the file stays the truth: the next
                                                cell, the CLI and `watch` all see it), the family is rebuilt, and a
                                                build error shows in the cell output with the offending line marked
    %lab_check basics --op square               the same table as `python -m lab check basics --op square`
    %lab_bench basics --op square --dry         the same as `python -m lab bench ...`
    %lab_watch basics --op square               `python -m lab watch ...` (interrupt the cell to stop)

A magic line takes the CLI's arguments. Errors are printed, never raised into a traceback of lab internals.
"""
from __future__ import annotations

import shlex
import time
from pathlib import Path

from . import build, env
from .__main__ import main


def family_of(path: Path) -> str:
    """The family a source file belongs to: cuda_src/<family>/x.cu, cpp_src/<family>/x.cpp, or <family>.cu/.cpp."""
    path = Path(path).resolve()
    for root in (env.CUDA_SRC.resolve(), env.CPP_SRC.resolve()):
        if path.is_relative_to(root):
            rel = path.relative_to(root)
            return rel.parts[0] if len(rel.parts) > 1 else rel.stem
    raise ValueError(f"{path} is not under {build._rel(env.CUDA_SRC)}/ or {build._rel(env.CPP_SRC)}/: "
                     "%%lab_source writes kernel sources only")


def write_source(path: str, text: str, verbose: bool = True) -> bool:
    """Write `text` to the source file `path` (relative to the repository), rebuild its family, and say what
    happened. Returns True when the family built."""
    p = Path(path)
    p = p if p.is_absolute() else env.SRC_ROOT / p
    fam = family_of(p)
    if not p.parent.exists():
        raise ValueError(f"{build._rel(p.parent)} does not exist: create the family's folder first")
    new = text if text.endswith("\n") else text + "\n"
    if p.exists() and p.read_text() == new:
        print(f"[lab] {build._rel(p)} unchanged")
    else:
        p.write_text(new)
        print(f"[lab] wrote {build._rel(p)} ({new.count(chr(10))} lines)")
    t0 = time.perf_counter()
    try:
        build.load(fam, verbose=verbose)
    except build.BuildError as e:
        print(f"[lab] build of {fam} failed; the last good build stays loaded:\n{e.summary}")
        return False
    print(f"[lab] {fam} ready in {time.perf_counter() - t0:.1f} s")
    return True


def _cli(cmd: str, line: str) -> int:
    try:
        return main([cmd] + shlex.split(line))
    except SystemExit as e:  # argparse's usage errors: printed already; keep the notebook alive
        return int(e.code or 0) if not isinstance(e.code, str) else (print(e.code) or 2)


def register(ipython) -> None:
    def lab_source(line, cell):
        path = line.strip()
        if not path:
            print("usage: %%lab_source cuda_src/<family>/<file>.cu")
            return
        try:
            write_source(path, cell)
        except ValueError as e:
            print(f"[lab] {e}")

    def lab_check(line):
        _cli("check", line)

    def lab_bench(line):
        _cli("bench", line)

    def lab_watch(line):
        _cli("watch", line)

    ipython.register_magic_function(lab_source, "cell", "lab_source")
    ipython.register_magic_function(lab_check, "line", "lab_check")
    ipython.register_magic_function(lab_bench, "line", "lab_bench")
    ipython.register_magic_function(lab_watch, "line", "lab_watch")
