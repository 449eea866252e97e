"""The notebooks' source excerpts (lab.notebooks.show_source) point at lines that exist: a renamed function or an
edited comment must fail here, not quietly turn an excerpt into the file's first lines (notebook 03's gru.cpp excerpt
once printed lines 1-76 after `void layer_cuda` became `bool layer_cuda`)."""
import ast
import json

import pytest

from lab import env, notebooks

NBS = sorted((env.ROOT / "notebooks").glob("*.ipynb"))


def _excerpts(nb) -> list[tuple]:
    """(path, start, end) of every show_source call with literal arguments in a notebook's code cells."""
    calls = []
    for c in json.loads(nb.read_text())["cells"]:
        if c["cell_type"] != "code":
            continue
        code = "".join(ln for ln in "".join(c["source"]).splitlines(keepends=True)
                       if not ln.lstrip().startswith(("%", "!")))   # IPython magics and shell lines
        for node in ast.walk(ast.parse(code)):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "show_source":
                args = [ast.literal_eval(a) for a in node.args]
                kw = {k.arg: ast.literal_eval(k.value) for k in node.keywords}
                calls.append((args[0], args[1] if len(args) > 1 else kw.get("start"),
                              args[2] if len(args) > 2 else kw.get("end")))
    return calls


@pytest.mark.parametrize("nb", NBS, ids=[p.stem for p in NBS])
def test_every_excerpt_finds_its_markers(nb):
    for path, start, end in _excerpts(nb):
        lines, i0, i1 = notebooks.source_span(path, start, end)
        assert start is None or start in lines[i0]
        assert end is None or (end in lines[i1] and i1 > i0)


def test_the_excerpts_are_found():
    # the parser above sees the calls (else the test before could pass on nothing)
    counts = {nb.stem: len(_excerpts(nb)) for nb in NBS}
    assert counts["03_gru"] >= 7 and counts["09_embedding"] >= 10 and counts["05_kronecker_layer"] >= 6, counts


def test_a_missing_marker_raises():
    with pytest.raises(ValueError, match=r"show_source: no line of cpp_src/gru/gru.cpp contains 'no such line'"):
        notebooks.show_source("cpp_src/gru/gru.cpp", "no such line")
    with pytest.raises(ValueError, match=r"show_source: no line of cpp_src/gru/gru.cpp after line \d+ contains 'zzz'"):
        notebooks.show_source("cpp_src/gru/gru.cpp", "bool layer_cuda", "zzz")
