"""The project's shape, read from its own source: no import cycles (imports inside functions count),
imports point down (kotune → heads → tasks), tasks never build modules (no torch.nn, no nn.Module
subclass, no transformers model class in tasks/), heads never read files (file reads in heads/ only
where model directories and the frozen feature cache are saved and loaded, and no reader of tasks/),
each action is one file of kotune/actions, kotune's modules stay small, kotune/'s top level holds
few modules (a family of modules gets a folder named for it, and a module named for a folder's
feature lives in that folder), and the ground floor kotune.core imports without climbing."""
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
    path.write_text("def f():\n    from tasks import metrics\n    import heads.model.encoder\n")
    modules = {"x.m": path, "tasks": ROOT, "tasks.metrics": ROOT, "heads.model.encoder": ROOT}
    assert imports_of("x.m", path, modules) == {"tasks.metrics", "heads.model.encoder"}


def test_no_import_cycles():
    assert cycles(import_graph()) == []


FLOOR = "kotune.core"  # the ground floor: errors, log, files, registries; every layer may import it


def layer(module: str) -> str:
    """``floor`` for kotune.core, else the module's top-level package."""
    return "floor" if module == FLOOR or module.startswith(FLOOR + ".") else module.split(".")[0]


def test_imports_point_down():
    """The ground floor imports nothing of the project's; tasks import neither heads nor kotune (but
    the floor); heads never import kotune (but the floor); nothing imports the entry point."""
    graph = import_graph()
    for name, targets in graph.items():
        below = {"floor": ("tasks", "heads", "kotune", "bench", "hydra_plugins", "run", "report"),
                 "tasks": ("heads", "kotune"), "heads": ("kotune",)}.get(layer(name), ())
        wrong = sorted(t for t in targets if layer(t) in below or t == "run")
        assert not wrong, f"{name} imports {wrong}"


def test_each_action_is_one_file_and_kotune_modules_stay_small():
    from kotune.actions import ACTIONS

    files = {p.stem for p in (ROOT / "kotune" / "actions").glob("*.py")} - {"__init__"}
    assert files == set(ACTIONS)
    for path in (ROOT / "kotune").rglob("*.py"):
        lines = len(path.read_text(encoding="utf-8").splitlines())
        assert lines <= MAX_KOTUNE_LINES, f"{path.relative_to(ROOT)} has {lines} lines"
    assert len((ROOT / "run.py").read_text(encoding="utf-8").splitlines()) <= 20


# ---- tasks never build modules, heads never read files ----------------------------------------------
def dotted(node: ast.AST) -> str:
    """``a.b.c`` for a name or attribute chain ('' for anything else, e.g. a call's result)."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = dotted(node.value)
        return f"{base}.{node.attr}" if base else f"?.{node.attr}"
    return ""


def is_model_class(name: str) -> bool:
    """A transformers model class: ``BertModel``, ``AutoModel…``, ``…For<Task>`` (not a ``DataCollatorFor…``)."""
    return name.endswith("Model") or name.startswith("AutoModel") or (
        "For" in name and not name.startswith("DataCollator"))


def module_building(path: Path) -> list[str]:
    """What in a file builds or names neural-network modules: torch.nn in any form, a class derived
    from a ``Module``, a transformers model class."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [f"import {a.name}" for a in node.names if a.name == "torch.nn" or a.name.startswith("torch.nn.")]
        elif isinstance(node, ast.ImportFrom):
            names = [a.name for a in node.names]
            if node.module == "torch" and "nn" in names or (node.module or "").startswith("torch.nn"):
                found.append(f"from {node.module} import {', '.join(names)}")
            if node.module == "transformers":
                found += [f"from transformers import {n}" for n in names if is_model_class(n)]
        elif isinstance(node, ast.Attribute) and dotted(node) in ("torch.nn", "nn.Module"):
            found.append(dotted(node))
        elif isinstance(node, ast.ClassDef):
            found += [f"class {node.name}({dotted(b)})" for b in node.bases if dotted(b).split(".")[-1] == "Module"]
    return sorted(set(found))


FILE_READS = ("open", "read_text", "read_bytes", "load_file", "load_dataset", "load_from_disk", "reader", "DictReader")
MODULE_LOADS = ("json.load", "np.load", "numpy.load", "torch.load", "pickle.load")
# the documented file access of heads/: a model directory's save and load (its kotune.json read by
# KotuneModel.spec; an ONNX export's by OnnxModel; the look that tells a kotune model from an
# encoder; the check that a model directory's configs name no code), the frozen feature cache's store
HEADS_FILE_ACCESS = {("heads/model/kotune_model.py", "KotuneModel.save"), ("heads/model/kotune_model.py", "KotuneModel.load"),
                     ("heads/model/kotune_model.py", "KotuneModel.spec"), ("kotune/export/onnx.py", "OnnxModel.__init__"),
                     ("heads/model/encoder.py", "check_not_kotune_directory"), ("heads/model/feature_cache.py", "*"),
                     ("heads/model/artifact.py", "check_files"), ("heads/model/artifact.py", "safetensors_shapes")}


def file_reads(path: Path, rel: str) -> list[str]:
    """File access outside HEADS_FILE_ACCESS (``function: call``), and any reader imported from tasks/
    (a ``read_*``/``load_*`` function, ``sample_file``)."""
    found = []

    def visit(node: ast.AST, where: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                visit(child, f"{where}.{child.name}" if where else child.name)
                continue
            if isinstance(child, ast.Call):
                name = dotted(child.func)
                if (name.split(".")[-1] in FILE_READS or name in MODULE_LOADS) and \
                        (rel, where) not in HEADS_FILE_ACCESS and (rel, "*") not in HEADS_FILE_ACCESS:
                    found.append(f"{where or '<module>'}: {name}()")
            if isinstance(child, ast.ImportFrom) and (child.module or "").split(".")[0] == "tasks":
                found.extend(f"{where or '<module>'}: from {child.module} import {a.name}" for a in child.names
                             if a.name.startswith(("read_", "load_")) or a.name == "sample_file")
            visit(child, where)

    visit(ast.parse(path.read_text(encoding="utf-8")), "")
    return found


def test_the_module_and_file_checks_find_what_they_look_for(tmp_path):
    task = tmp_path / "task.py"
    task.write_text("import torch\nfrom torch import nn\nfrom transformers import AutoModel, AutoTokenizer\n"
                    "class Scorer(nn.Module):\n    pass\ndef f():\n    return torch.nn.Linear(2, 2)\n")
    assert module_building(task) == ["class Scorer(nn.Module)", "from torch import nn",
                                     "from transformers import AutoModel", "nn.Module", "torch.nn"]
    head = tmp_path / "head.py"
    head.write_text("import json\nfrom tasks.io import read_records, write_json_atomic\nclass Head:\n"
                    "    def forward(self, path):\n        return json.load(open(path)), path.read_text()\n"
                    "    def save(self, d):\n        open(d, 'w')\n")
    assert file_reads(head, "heads/head.py") == [
        "<module>: from tasks.io import read_records", "Head.forward: json.load()", "Head.forward: open()",
        "Head.forward: path.read_text()", "Head.save: open()"]
    assert file_reads(head, "heads/model/feature_cache.py") == ["<module>: from tasks.io import read_records"]


def test_tasks_never_build_modules():
    for path in sorted((ROOT / "tasks").rglob("*.py")):
        assert not module_building(path), f"{path.relative_to(ROOT)}: {module_building(path)}"


def test_heads_never_read_files_outside_model_directories_and_the_feature_cache():
    for path in sorted((ROOT / "heads").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        assert not file_reads(path, rel), f"{rel}: {file_reads(path, rel)}"


# ---- one room per feature; the ground floor inside kotune/ --------------------------------------
MAX_KOTUNE_TOP_LEVEL = 8  # kotune/'s own modules beside its folders (__init__.py counted)


def misplaced_feature_modules(package: Path) -> list[str]:
    """Modules of ``package`` named for one of its feature folders that live outside it: at the top
    level, ``distill.py`` or ``distill_teacher.py`` beside ``distill/``; in another folder,
    ``distill_teacher.py`` (a folder's own part named for what it does there, such as
    ``embeddings/export.py``, stays). kotune/actions/ is exempt (one file per action)."""
    folders = {p.name for p in package.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    found = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package)
        if rel.parts[0] == "actions" or path.stem == "__init__":
            continue
        for feature in folders:
            named = path.stem.startswith(feature + "_") or (path.stem == feature and len(rel.parts) == 1)
            if named and rel.parts[0] != feature:
                found.append(f"{package.name}/{rel.as_posix()} belongs in {package.name}/{feature}/")
    return found


def test_kotune_top_level_holds_few_modules_and_each_feature_its_folder():
    top = sorted(p.name for p in (ROOT / "kotune").glob("*.py"))
    assert len(top) <= MAX_KOTUNE_TOP_LEVEL, top
    for package in ("kotune", "heads"):
        assert misplaced_feature_modules(ROOT / package) == []


def test_the_feature_folder_check_finds_a_stray_module(tmp_path):
    (tmp_path / "distill").mkdir()
    (tmp_path / "distill" / "__init__.py").write_text("")
    (tmp_path / "distill" / "teacher.py").write_text("")
    (tmp_path / "distill_trainer.py").write_text("")
    (tmp_path / "actions").mkdir()
    (tmp_path / "actions" / "distill.py").write_text("")
    (tmp_path / "export").mkdir()
    (tmp_path / "export" / "__init__.py").write_text("")
    (tmp_path / "export" / "distill.py").write_text("")  # export's own part: stays
    (tmp_path / "export" / "distill_cache.py").write_text("")
    assert misplaced_feature_modules(tmp_path) == [
        f"{tmp_path.name}/distill_trainer.py belongs in {tmp_path.name}/distill/",
        f"{tmp_path.name}/export/distill_cache.py belongs in {tmp_path.name}/distill/"]


def test_the_ground_floor_imports_without_climbing():
    """kotune.core lives inside kotune/ (the package name users import), the documented exception
    to "tasks and heads import nothing of kotune": importing every module of tasks/ and heads/
    loads kotune's __init__ and its ground floor, nothing above them (kotune/__init__.py imports
    only kotune.core; its API loads on first use)."""
    import subprocess
    import sys

    modules = [name for name in project_modules() if name.split(".")[0] in ("tasks", "heads")]
    code = ("import importlib, sys\n"
            f"for m in {modules!r}: importlib.import_module(m)\n"
            "print(sorted(m for m in sys.modules if m == 'kotune' or m.startswith('kotune.')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    loaded = eval(out.stdout.strip().splitlines()[-1])  # noqa: S307 - our own subprocess's printed list
    assert loaded and all(m == "kotune" or m == FLOOR or m.startswith(FLOOR + ".") for m in loaded), loaded
