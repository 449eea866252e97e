"""Lines of code per version, read from the sources on disk: a Triton kernel (lab/kernels/_triton/<family>.py) beside
a CUDA unit (cuda_src/<family>/<unit>.cu, or one __global__ function of it), for the notebooks' comparison of what
each costs to write (issue 17: lines of code, time, % of ceiling).

A line of code is a line with code on it: blank lines, comment-only lines and (Python) docstrings do not count; a
line with code and a trailing comment counts once. Shared headers (.cuh) are not counted with a unit unless named.

    triton_lines("linear")                  {"linear_kernel": n, "linear": n}: the @triton.jit kernels, the launchers
    cuda_lines("linear", "v8_v9.cu")        the whole unit
    cuda_lines("basics", "vector_add.cu", "vector_add_v2")    one __global__ function (signature to closing brace)
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

from .. import env

TRITON_DIR = env.ROOT / "lab" / "kernels" / "_triton"


def python_code_lines(source: str) -> int:
    """Lines with code in a piece of Python source (docstrings, comments and blank lines left out)."""
    tree = ast.parse(source)
    doc_lines: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            doc_lines.update(range(body[0].lineno, body[0].end_lineno + 1))
    n = 0
    for i, line in enumerate(source.splitlines(), 1):
        s = line.strip()
        if s and not s.startswith("#") and i not in doc_lines:
            n += 1
    return n


def c_code_lines(source: str) -> int:
    """Lines with code in C/C++/CUDA source (// and /* */ comments and blank lines left out)."""
    no_block = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), source, flags=re.S)
    return sum(1 for line in no_block.splitlines() if line.split("//", 1)[0].strip())


def _is_jit(fn: ast.FunctionDef) -> bool:
    return any("jit" in ast.unparse(d) for d in fn.decorator_list)


def triton_lines(family: str, folder: Path = TRITON_DIR) -> dict[str, int]:
    """Code lines of each top-level function of the family's Triton module: the @triton.jit kernels (decorators
    included) and the launchers. The module's docstring, imports and constants are not counted."""
    path = folder / f"{family}.py"
    src = path.read_text()
    lines = src.splitlines()
    out: dict[str, int] = {}
    for node in ast.parse(src).body:
        if isinstance(node, ast.FunctionDef):
            start = min([d.lineno for d in node.decorator_list] + [node.lineno])
            out[node.name] = python_code_lines("\n".join(lines[start - 1:node.end_lineno]))
    return out


def triton_kernels(family: str, folder: Path = TRITON_DIR) -> list[str]:
    """Names of the @triton.jit functions of the family's Triton module."""
    tree = ast.parse((folder / f"{family}.py").read_text())
    return [n.name for n in tree.body if isinstance(n, ast.FunctionDef) and _is_jit(n)]


def _function_text(source: str, name: str) -> str:
    """The text of the __global__ function `name`, from its signature to its matching closing brace."""
    m = re.search(r"__global__[^;{]*?\b" + re.escape(name) + r"\s*\(", source)
    if not m:
        raise KeyError(f"no __global__ function {name!r}")
    start = source.rfind("\n", 0, m.start()) + 1
    while start > 0:   # take a template<...> line just above along
        prev = source.rfind("\n", 0, start - 1) + 1
        if source[prev:start].strip().startswith("template"):
            start = prev
        else:
            break
    depth, i = 0, source.index("{", m.end())
    for j in range(i, len(source)):
        if source[j] == "{":
            depth += 1
        elif source[j] == "}":
            depth -= 1
            if depth == 0:
                return source[start:j + 1]
    raise ValueError(f"unbalanced braces in {name!r}")


def cuda_lines(family: str, unit: str, kernel: str | None = None, root: Path | None = None) -> int:
    """Code lines of cuda_src/<family>/<unit> (a .cu or .cuh), or of one __global__ function in it."""
    src = ((root or env.CUDA_SRC) / family / unit).read_text()
    return c_code_lines(_function_text(src, kernel) if kernel else src)


def triton_against_rungs(rows: list[dict], device: str = "") -> str:
    """At each shape: every Triton row against the fastest of our CUDA rungs (vN) of the same op, shape, dtype,
    precision and timing mode, from bench rows. Faster or slower where their p20..p80 ranges do not overlap, level
    where they do; one line per Triton row (the notebooks print it: issue 17 asks them to say where Triton is faster,
    from the rows, not in typed prose)."""
    tri_rows = [r for r in rows if r["version"].startswith("triton")]
    lines = []
    for t in tri_rows:
        same = [r for r in rows if re.fullmatch(r"v\d+", r["version"])
                and all(r[k] == t[k] for k in ("op", "shape", "dtype", "precision", "mode"))]
        if not same:
            lines.append(f"{t['op']} {t['version']} {t['shape']}: no CUDA rung of this precision timed beside it")
            continue
        best = min(same, key=lambda r: r["median_us"])
        verdict = ("Triton is FASTER" if t["p80_us"] < best["p20_us"] else
                   "Triton is slower" if t["p20_us"] > best["p80_us"] else "level (p20..p80 ranges overlap)")
        ratio = t["median_us"] / best["median_us"]
        lines.append(f"{t['op']} {t['precision']:<8} {t['shape']:<40} {t['version']:<11} {t['median_us']:9.1f} us | "
                     f"best rung {best['version']:<3} {best['median_us']:9.1f} us | Triton takes {ratio:.2f}x its "
                     f"time: {verdict}")
    if not tri_rows:
        lines.append(f"no triton rows on this machine ({device}): nothing to compare (the cells above say why)")
    return "\n".join(lines)
