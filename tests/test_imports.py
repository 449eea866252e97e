"""lab's own import graph, read statically (ast over lab/**/*.py; imports inside functions count): no cycle; the
harness stands in layers that only import downwards and never reaches a family, a model or a study; lab/kernels/
never imports lab/models/ or lab/studies/; and no lab module is imported inside a function (STYLE.md: "the harness
never imports a family, and no import hides inside a function to dodge a cycle").

Runtime discovery is not an import: lab.registry finds the families with importlib.import_module on names it builds
from the folder listing, which no static walk sees, and that is the point (the registry lists families, it does not
depend on one).
"""
from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

LAB = Path(__file__).resolve().parent.parent / "lab"

# The harness, bottom to top: a module imports only modules of lower layers (never one of its own layer or above).
# Every module directly in lab/ is harness unless FACADES names it; a new one must be placed here.
LAYERS: list[set[str]] = [
    {"lab.env", "lab.registry", "lab.timing"},          # no lab import: paths and machine, the family registry, timing
    {"lab.build", "lab.results", "lab.notebooks"},      # sources -> modules; the tidy table
    {"lab.verify", "lab.profile"},                       # references, tolerances (records checks into results);
                                                         # profiler, kernel tables and ncu (records into results)
    {"lab.ceilings"},                                    # copy / GEMM / FMA ceilings, timed with lab.timing
    {"lab.bench"},                                       # the sweep over an op: timing / ceilings -> rows
    {"lab.isolate", "lab.plot"},                         # versions in worker processes; figures from the rows
    {"lab.steps"},                                       # check / bench / profile an op: what report and CLI share
    {"lab.buildtime", "lab.watcher"},                    # the edit-and-rerun benchmark (and its figure); watch
    {"lab.page", "lab.compare"},                         # every device's results on one page; what got slower
    {"lab.report"},                                      # the main job
    {"lab.__main__"},                                    # the CLI
    {"lab.magic"},                                       # the notebook magics (they call the CLI)
]
# Modules of lab/ that are not harness: what a user imports by name (they sit on top of the families), and studies
# not yet under lab/studies/. The package itself imports lazily (`import lab` stays cheap): its functions may import.
FACADES = {
    "lab": "the package: lab.load, lab.family, lab.watch; imports lazily on purpose",
    "lab.optim": "drop-in optimizers: re-exports lab.kernels.optim's Adam and AdamW",
    "lab.kron": "the kron study's command line (python -m lab.kron)",
}
FAMILY_SIDE = ("lab.kernels", "lab.models", "lab.studies", "lab.nn")   # families and what is built on them
LAZY_OK = {"lab"}   # modules whose functions may import lab modules (see FACADES)


@dataclass(frozen=True)
class Edge:
    src: str
    dst: str
    line: int
    in_function: bool


def _modules(root: Path) -> dict[str, Path]:
    pkg = root.name
    return {".".join((pkg,) + p.relative_to(root).with_suffix("").parts).removesuffix(".__init__"): p
            for p in sorted(root.rglob("*.py"))}


def _function_nodes(tree: ast.AST) -> set[int]:
    """ids of the import nodes that sit inside a function (at any depth)."""
    inside: set[int] = set()
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            inside.update(id(n) for n in ast.walk(fn) if isinstance(n, (ast.Import, ast.ImportFrom)))
    return inside


def import_edges(root: Path = LAB) -> tuple[dict[str, Path], list[Edge]]:
    """Every import of a module of the package by a module of the package: module level, inside functions and
    classes, under `if`/`try` alike. `from . import x` is an edge to the submodule x when there is one, else to the
    package; `from .x import y` to x (and to x.y when y is a submodule)."""
    mods = _modules(root)
    edges: list[Edge] = []
    for m, p in mods.items():
        tree = ast.parse(p.read_text(), str(p))
        in_fn = _function_nodes(tree)
        pkg = m.split(".") if p.name == "__init__.py" else m.split(".")[:-1]
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                for a in node.names:   # `import lab.x.y` imports lab.x.y (its parents are the package's own)
                    targets.append(a.name)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    assert node.level <= len(pkg), f"{p}:{node.lineno}: relative import above the package"
                    base = pkg[: len(pkg) - node.level + 1] + (node.module.split(".") if node.module else [])
                else:
                    base = node.module.split(".")
                base_name = ".".join(base)
                subs = [f"{base_name}.{a.name}" for a in node.names if f"{base_name}.{a.name}" in mods]
                targets += subs
                if len(subs) < len(node.names):   # names that are attributes of base_name
                    targets.append(base_name)
            else:
                continue
            for t in targets:
                if t in mods and t != m:
                    edges.append(Edge(m, t, node.lineno, id(node) in in_fn))
    return mods, edges


def _graph(edges: list[Edge]) -> dict[str, set[str]]:
    g: dict[str, set[str]] = {}
    for e in edges:
        g.setdefault(e.src, set()).add(e.dst)
    return g


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as [a, b, ..., a], or None."""
    state: dict[str, int] = {}   # 1: on the current path, 2: done
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for t in sorted(graph.get(m, ())):
            if state.get(t) == 1:
                return path[path.index(t):] + [t]
            if t not in state:
                c = visit(t)
                if c:
                    return c
        path.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state:
            c = visit(m)
            if c:
                return c
    return None


def _reach(graph: dict[str, set[str]], start: str) -> dict[str, list[str]]:
    """Every module reachable from start through static imports, with one path to it."""
    seen = {start: [start]}
    todo = [start]
    while todo:
        m = todo.pop()
        for t in sorted(graph.get(m, ())):
            if t not in seen:
                seen[t] = seen[m] + [t]
                todo.append(t)
    return seen


MODS, EDGES = import_edges()
GRAPH = _graph(EDGES)


def _harness() -> list[str]:
    return sorted(m for m in MODS if m.count(".") == 1 and not m.startswith(FAMILY_SIDE) and m not in FACADES)


def test_the_walk_sees_the_edges_it_should():
    g = GRAPH
    assert "lab.timing" in g["lab.bench"] and "lab.ceilings" in g["lab.bench"]   # from .timing import time_fn
    assert "lab.build" in g["lab.kernels.basics"]                                 # from .. import build
    assert "lab.registry" in g["lab.kernels.basics"]                              # from ..registry import Family
    assert "lab.registry" in g["lab"]                                             # inside a function, still an edge
    assert not any(e.dst == "lab" for e in EDGES if e.src != "lab")               # `from . import x` is x, not lab


def test_no_import_cycle():
    cycle = find_cycle(GRAPH)
    assert cycle is None, "import cycle among lab's modules: " + " -> ".join(cycle)


def test_no_lab_import_inside_a_function():
    hidden = [f"{MODS[e.src].relative_to(LAB.parent)}:{e.line} imports {e.dst}" for e in EDGES
              if e.in_function and e.src not in LAZY_OK]
    assert not hidden, ("lab modules imported inside a function (move them to the top of the module; a cycle that "
                        "forces this means a helper belongs in a lower layer):\n  " + "\n  ".join(hidden))


def test_every_harness_module_has_a_layer():
    placed = set().union(*LAYERS)
    missing = [m for m in _harness() if m not in placed]
    assert not missing, f"harness modules in no layer of tests/test_imports.py LAYERS: {missing}"
    gone = sorted(placed - set(MODS))
    assert not gone, f"LAYERS names modules that do not exist: {gone}"


@pytest.mark.parametrize("mod", _harness())
def test_harness_imports_only_lower_layers(mod):
    layer = {m: i for i, ms in enumerate(LAYERS) for m in ms}
    if mod not in layer:
        pytest.skip("not placed (test_every_harness_module_has_a_layer says so)")
    up = [f"{t} (layer {layer[t]})" for t in sorted(GRAPH.get(mod, ())) if t in layer and layer[t] >= layer[mod]]
    assert not up, f"{mod} (layer {layer[mod]}) imports {', '.join(up)}: the harness imports downwards only"
    other = [t for t in sorted(GRAPH.get(mod, ())) if t not in layer]
    assert not other, f"{mod} imports {other}, which are not harness"


@pytest.mark.parametrize("mod", _harness())
def test_harness_never_reaches_a_family(mod):
    """Directly or through another module: the harness works on whatever the registry found."""
    def family_side(m):
        return m.startswith(FAMILY_SIDE) or m in FACADES
    bad = {t: p for t, p in _reach(GRAPH, mod).items() if family_side(t) and not any(map(family_side, p[:-1]))}
    assert not bad, "the harness imports a family: " + "; ".join(" -> ".join(p) for p in bad.values())


def test_kernels_never_import_models_or_studies():
    up = [f"{e.src} -> {e.dst} (line {e.line})" for e in EDGES
          if e.src.startswith("lab.kernels") and e.dst.startswith(("lab.models", "lab.studies", "lab.nn"))]
    assert not up, f"lab/kernels/ imports what is built on the families: {up}"


def test_models_never_import_studies():
    up = [f"{e.src} -> {e.dst} (line {e.line})" for e in EDGES
          if e.src.startswith("lab.models") and e.dst.startswith("lab.studies")]
    assert not up, f"lab/models/ imports a study: {up}"


def test_the_checks_fail_on_a_planted_cycle_and_a_hidden_import(tmp_path):
    """The walk on a toy package: a -> b at module level, b -> a inside a function."""
    pkg = tmp_path / "toy"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from . import b\nfrom .sub import c\n")
    (pkg / "b.py").write_text("def f():\n    from .a import thing\n    return thing\n")
    (pkg / "sub" / "c.py").write_text("from .. import b as _b\nimport toy.a\n")
    mods, edges = import_edges(pkg)
    g = _graph(edges)
    assert g == {"toy.a": {"toy.b", "toy.sub.c"}, "toy.b": {"toy.a"}, "toy.sub.c": {"toy.b", "toy.a"}}
    assert find_cycle(g) in (["toy.a", "toy.b", "toy.a"], ["toy.a", "toy.sub.c", "toy.a"])
    assert [(e.src, e.dst, e.line) for e in edges if e.in_function] == [("toy.b", "toy.a", 2)]
    assert find_cycle({"x": {"y"}, "y": set()}) is None
