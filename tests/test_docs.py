"""The documentation as CI checks it: the site builds with ``mkdocs build --strict`` (no broken
link, anchor or page left out of nav), the configuration reference is what
scripts/config_reference.py generates from conf/ today and explains every key, the README
stays short with links that resolve, and every list of actions, modes, task or model presets the
README and the site show names what the registries hold."""
from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import yaml
from conftest import ROOT

README_MAX_LINES = 200


def generator():
    spec = importlib.util.spec_from_file_location("config_reference", ROOT / "scripts" / "config_reference.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def write_conf(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(textwrap.dedent(text), encoding="utf-8")
    return root


def rows(page: str) -> dict[tuple[str, str], tuple[str, str]]:
    """(file section, key) → (default, meaning) from the generated tables."""
    out, section = {}, None
    for line in page.splitlines():
        if line.startswith("#") and "`conf/" in line:
            section = line.split("`")[1]
        elif line.startswith("| `") and section:
            key, default, meaning = (c.strip() for c in line.strip("|").split(" | "))
            out[(section, key.strip("`"))] = (default.strip("`"), meaning)
    return out


def test_the_config_reference_is_generated_from_conf_as_it_is():
    committed = (ROOT / "docs" / "reference" / "config.md").read_text(encoding="utf-8")
    assert committed == generator().render(), \
        "docs/reference/config.md is stale: run python scripts/config_reference.py and commit it"


def test_every_config_key_has_a_meaning():
    missing = generator().missing_meanings()
    assert not missing, ("config keys without a comment (add one on the key's line or above it, "
                         f"then run python scripts/config_reference.py): {missing}")


def test_the_generator_reads_each_kind_of_comment(tmp_path):
    """Same-line comments and their indented continuation, comments above a key, the file's
    opening comment, a mapping's row explaining its uncommented keys, and meanings taken from the
    file a defaults list builds on or from the group's default file — but never from an unrelated
    sibling."""
    conf = write_conf(tmp_path, {
        "config.yaml": """\
            # the top file
            defaults:
              - task: a
            action: train      # what to do
                               # (continued)
            # the cache, above its key
            cache_dir: /tmp
            """,
        "task/a.yaml": """\
            # task a's opening comment
            name: a            # the task's name
            hub:               # the hub dataset
              path: x/y
              name: a
            labels: [p, q]
            """,
        "task/b.yaml": """\
            # task b
            name: b
            labels: [r, s]     # b's own labels
            """,
        "task/b_plus.yaml": """\
            defaults:
              - b
              - _self_
            labels: [r, s, t]
            """,
    })
    g = generator()
    table = rows(g.render(conf))
    assert table[("conf/config.yaml", "action")] == ("train", "what to do (continued)")
    assert table[("conf/config.yaml", "cache_dir")] == ("/tmp", "the cache, above its key")
    assert table[("conf/task/b.yaml", "name")] == ("b", "the task's name")          # from task a, the default
    assert table[("conf/task/b_plus.yaml", "labels")] == ("[r, s, t]", "b's own labels")  # from its base, b
    assert table[("conf/task/a.yaml", "hub")] == ("", "the hub dataset")
    assert "task a's opening comment" in g.render(conf)
    assert "task a's opening comment" not in table[("conf/task/a.yaml", "name")][1]
    # a's labels have no comment: b's (not a's base, not the default) must not lend its own
    assert table[("conf/task/a.yaml", "labels")] == ("[p, q]", "")
    assert g.missing_meanings(conf) == ["conf/task/a.yaml: labels"]  # hub.path/hub.name: the hub row


def test_the_site_builds_strict(tmp_path):
    """``mkdocs build --strict``: a broken link or anchor, a nav entry without a page or a page
    left out of nav fails (mkdocs.yml's validation settings)."""
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, NO_MKDOCS_2_WARNING="1"))
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:] + \
        "\n(mkdocs-material comes with pip install -e '.[dev]')"
    assert (tmp_path / "site" / "reference" / "config" / "index.html").is_file()


def test_every_page_closes_its_code_blocks():
    """An unclosed ``` fence swallows the rest of a page without any build warning."""
    open_fences = [str(p.relative_to(ROOT)) for p in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
                   if sum(line.startswith("```") for line in p.read_text(encoding="utf-8").splitlines()) % 2]
    assert not open_fences


def test_the_readme_is_short_and_its_links_resolve():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= README_MAX_LINES
    targets = [t for t in re.findall(r"\]\(([^)\s]+)\)", text) if "://" not in t and not t.startswith("#")]
    assert len(targets) >= 10  # the README points into docs/
    assert not [t for t in targets if not (ROOT / t.split("#")[0]).exists()]


def test_the_generator_script_tells_a_stale_page(tmp_path, monkeypatch):
    """``--check`` passes on the committed page and fails, naming the command, on a stale one."""
    g = generator()
    assert g.main(["--check"]) == 0
    stale = tmp_path / "config.md"
    stale.write_text(g.render().replace("| `seed` |", "| `seed_old` |"), encoding="utf-8")
    monkeypatch.setattr(g, "PAGE", stale)
    monkeypatch.setattr(g, "ROOT", tmp_path)
    assert g.main(["--check"]) == 1


# ---- the lists of actions, modes, task and model presets, against their registries ---------------
def code_names(text: str) -> list[str]:
    """The first word of every `code` span."""
    return [span.split()[0] for span in re.findall(r"`([^`]+)`", text) if span.split()]


def bullet(page: str, start: str | tuple[str, ...]) -> str:
    """The bullet of ``page`` whose line starts with ``start``, with its indented continuation."""
    lines = (ROOT / page).read_text(encoding="utf-8").splitlines()
    first = next((i for i, line in enumerate(lines) if line.startswith(start)), None)
    assert first is not None, f"{page}: no line starts with {start!r}"
    end = next((i for i in range(first + 1, len(lines)) if not lines[i].startswith("  ")), len(lines))
    return "\n".join(lines[first:end])


def table_keys(page: str, header: str) -> set[str]:
    """The `code` names in the first cell of each row of the table whose header starts ``header``."""
    lines = (ROOT / page).read_text(encoding="utf-8").splitlines()
    first = next((i for i, line in enumerate(lines) if line.startswith(header)), None)
    assert first is not None, f"{page}: no table headed {header!r}"
    keys: set[str] = set()
    for line in lines[first + 2:]:  # past the header and its --- row
        if not line.startswith("|"):
            break
        keys |= set(code_names(line.strip("|").split(" | ")[0]))
    return keys


def registries() -> dict[str, set[str]]:
    from kotune.actions import ACTIONS

    return {"actions": set(ACTIONS), **{kind: {p.stem for p in (ROOT / "conf" / kind).glob("*.yaml")}
                                        for kind in ("mode", "task", "model")}}


def listed_in_docs() -> list[tuple[str, str, set[str]]]:
    """(where, registry, the names listed there): every list of them the README and the site show."""
    layout = bullet("docs/development/layout.md", "  actions/<name>.py").splitlines()[0]  # in a code block
    config = bullet("conf/config.yaml", "action:").splitlines()[0]  # the comment docs/reference/config.md shows
    return [
        ("conf/config.yaml: action's comment", "actions", {a.strip() for a in config.split("#", 1)[1].split("|")}),
        ("docs/index.md: the Actions bullet", "actions", set(code_names(bullet("docs/index.md", "- [Actions]")))),
        ("docs/index.md: the Modes bullet", "mode", set(code_names(bullet("docs/index.md", ("- Modes", "- [Modes]"))))),
        ("docs/development/layout.md: actions/<name>.py", "actions", set(layout.split("per action:")[1].split())),
        ("README.md: Documentation, Actions", "actions",
         set(re.findall(r"\[([^\]]+)\]\(", bullet("README.md", "- Actions:")))),
        ("README.md: the mode= table", "mode", table_keys("README.md", "| `mode=`")),
        ("README.md: the task table", "task", table_keys("README.md", "| task |")),
        ("docs/tasks/index.md: the task table", "task", table_keys("docs/tasks/index.md", "| task |")),
        ("README.md: the model table", "model", table_keys("README.md", "| preset |")),
        ("docs/models/index.md: the model table", "model", table_keys("docs/models/index.md", "| preset |")),
    ]


def mismatches(known: dict[str, set[str]]) -> dict[str, dict[str, list[str]]]:
    """Per list that differs from its registry: the names it lacks and the names it has beyond."""
    return {where: {"missing": sorted(known[kind] - names), "unknown": sorted(names - known[kind])}
            for where, kind, names in listed_in_docs() if names != known[kind]}


def test_the_docs_list_every_action_mode_and_preset_and_nothing_else():
    """The README's and the site's lists of actions (kotune.actions.ACTIONS), modes
    (conf/mode/), task presets (conf/task/) and model presets (conf/model/) name exactly what the
    registries hold: a new action, mode or preset fails here until the lists mention it."""
    wrong = mismatches(registries())
    assert not wrong, f"lists in the docs that differ from the registries: {wrong}"


def test_the_actions_page_and_the_nav_introduce_every_action():
    """docs/actions/index.md (the Actions section's first page): each action opens a bullet or a
    clause of one, in a `code` span; the site's nav has an entry titled by each in its Actions
    section (which also holds pages on more than one action: those titles are not checked)."""
    from kotune.actions import ACTIONS

    page = (ROOT / "docs" / "actions" / "index.md").read_text(encoding="utf-8")
    opened = {m.split()[0] for m in re.findall(r"(?:^- \[?|;\s+)`([^`]+)`", page, re.M)}
    assert set(ACTIONS) <= opened, f"docs/actions/index.md does not introduce {sorted(set(ACTIONS) - opened)}"
    nav = next(section["Actions"] for section in yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))["nav"]
               if isinstance(section, dict) and "Actions" in section)
    titled = {title.split(":")[0] for entry in nav if isinstance(entry, dict) for title in entry}
    assert set(ACTIONS) <= titled, f"mkdocs.yml's Actions section has no entry for {sorted(set(ACTIONS) - titled)}"


def test_the_docs_list_check_sees_a_new_name():
    """The check reads every list: an action, a mode, a task and a model preset the registries
    gain are reported missing from each list of their kind, and nowhere else."""
    known = registries()
    new = {"actions": "quantize", "mode": "adapter", "task": "summarize", "model": "kobert"}
    wrong = mismatches({kind: names | {new[kind]} for kind, names in known.items()})
    assert {where: lists["missing"] for where, lists in wrong.items()} == \
        {where: [new[kind]] for where, kind, _ in listed_in_docs()}
    assert all(not lists["unknown"] for lists in wrong.values())
