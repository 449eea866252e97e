"""pyproject.toml, environment.yml and the build agree on the oldest torch the lab builds with; lab's imports form
layers without a cycle."""
import re
import tomllib

from lab import build, env


def _floor(spec: str) -> tuple[int, int]:
    m = re.search(r"torch\s*>=\s*(\d+)\.(\d+)", spec)
    assert m, f"no torch>=X.Y in {spec!r}"
    return int(m.group(1)), int(m.group(2))


def test_torch_floor_is_the_same_everywhere():
    deps = tomllib.loads((env.ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    py = _floor(next(d for d in deps if d.startswith("torch")))
    yml = (env.ROOT / "environment.yml").read_text()
    conda = _floor(next(ln for ln in yml.splitlines() if re.match(r"\s*-\s*torch\s*>=", ln)))
    assert py == conda == build.MIN_TORCH


def test_environment_names_a_compiler_and_the_cuda_of_the_measurements():
    yml = (env.ROOT / "environment.yml").read_text()
    assert re.search(r"^\s*-\s*cxx-compiler\b", yml, re.M)
    nvcc = re.search(r"^\s*-\s*cuda-nvcc=(\d+\.\d+)", yml, re.M)
    index = re.search(r"download\.pytorch\.org/whl/cu(\d+)", yml)
    assert nvcc and index and nvcc.group(1).replace(".", "") == index.group(1)  # nvcc matches torch's CUDA


def _import_graph() -> dict[str, set[str]]:
    """lab's modules -> the lab modules each imports, at module level or inside a function alike (an import moved
    into a function to dodge a cycle is still an edge)."""
    import ast
    lab_dir = env.ROOT / "lab"
    mods = {".".join(("lab",) + p.relative_to(lab_dir).with_suffix("").parts).removesuffix(".__init__"): p
            for p in lab_dir.rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for m, p in mods.items():
        pkg = m if p.name == "__init__.py" else m.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = pkg.split(".")[: len(pkg.split(".")) - (node.level - 1)] if node.level else []
                target = ".".join(base + ([node.module] if node.module else [])) if node.level else node.module
                subs = [f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in mods]
                graph[m].update(t for t in (subs or [target]) if t in mods and t != m)
            elif isinstance(node, ast.Import):
                graph[m].update(a.name for a in node.names if a.name in mods and a.name != m)
    return graph


def test_lab_imports_have_no_cycle_and_layers_point_down():
    graph = _import_graph()
    assert "lab.bench" in graph and "lab.build" in graph["lab.bench"]      # the walk sees the edges it should
    state: dict[str, int] = {}

    def visit(m, path):
        state[m] = 1
        for t in sorted(graph[m]):
            assert state.get(t) != 1, "import cycle: " + " -> ".join(path + [t])
            if t not in state:
                visit(t, path + [t])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    up = [(m, t) for m, ts in graph.items() for t in ts if m.startswith("lab.kernels") and t.startswith("lab.models")]
    assert not up, f"lab/kernels/ imports lab/models/: {up}"
    harness = {"lab.bench", "lab.build", "lab.env", "lab.results", "lab.registry", "lab.verify"}
    down = [(m, t) for m in harness for t in graph[m] if t.startswith(("lab.kernels", "lab.models"))]
    assert not down, f"the harness imports a family: {down}"
