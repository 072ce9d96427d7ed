"""The project's shape, read from its own source: no import cycles (imports inside functions count),
imports point down (kotune → heads → tasks; tasks never build modules, heads never read text
files' machinery), each action is one file of kotune/actions, and kotune's modules stay small."""
from __future__ import annotations

import ast
from pathlib import Path

from conftest import ROOT

PACKAGES = ("kotune", "tasks", "heads", "hydra_plugins", "bench")
SCRIPTS = ("run.py", "report.py")
MAX_KOTUNE_LINES = 300


def project_modules() -> dict[str, Path]:
    """Dotted module name → file, for every project module outside tests/."""
    found = {path[:-3]: ROOT / path for path in SCRIPTS}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules a file imports anywhere (module level or inside functions)."""
    def known(dotted: str) -> str | None:
        while dotted and dotted not in modules:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: up level-1 packages from this one
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        out |= {t for t in map(known, targets) if t and t != name}
    return out


def import_graph() -> dict[str, set[str]]:
    modules = project_modules()
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each strongly connected group of more than one module (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_import_reader_sees_imports_inside_functions(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("def f():\n    from tasks import metrics\n    import heads.encoder\n")
    modules = {"x.m": path, "tasks": ROOT, "tasks.metrics": ROOT, "heads.encoder": ROOT}
    assert imports_of("x.m", path, modules) == {"tasks.metrics", "heads.encoder"}


def test_no_import_cycles():
    assert cycles(import_graph()) == []


def test_imports_point_down():
    """tasks import neither heads nor kotune; heads never import kotune; nothing imports the entry point."""
    graph = import_graph()
    for name, targets in graph.items():
        top = name.split(".")[0]
        below = {"tasks": ("heads", "kotune"), "heads": ("kotune",)}.get(top, ())
        wrong = sorted(t for t in targets if t.split(".")[0] in below or t == "run")
        assert not wrong, f"{name} imports {wrong}"


def test_each_action_is_one_file_and_kotune_modules_stay_small():
    from kotune.actions import ACTIONS

    files = {p.stem for p in (ROOT / "kotune" / "actions").glob("*.py")} - {"__init__"}
    assert files == set(ACTIONS)
    for path in (ROOT / "kotune").rglob("*.py"):
        lines = len(path.read_text(encoding="utf-8").splitlines())
        assert lines <= MAX_KOTUNE_LINES, f"{path.relative_to(ROOT)} has {lines} lines"
    assert len((ROOT / "run.py").read_text(encoding="utf-8").splitlines()) <= 20
