"""Write docs/reference/config.md: every key of conf/, its default and its meaning, read from the
YAML files and their comments.

    python scripts/config_reference.py            # regenerate the page
    python scripts/config_reference.py --check    # exit 1 when the committed page is stale
    python scripts/config_reference.py --missing  # the keys that have no meaning yet

A key's meaning is its comment: the comment on its line (and the indented comment lines that continue
it), or the comment lines right above it. A key without one means what the same key means in the file
its defaults list builds on (conf/task/dp_klue.yaml on dp.yaml), else in its group's default file
(``data.text_column`` in conf/data/demo.yaml means what it means in conf/data/hub.yaml, the default
``data``); the keys inside a commented mapping are explained by the mapping's row. A file's
opening comment describes the file. tests/test_docs.py compares the committed page with a fresh
generation and fails on a key without a meaning, so the page cannot drift from conf/.
"""
from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
CONF = ROOT / "conf"
PAGE = ROOT / "docs" / "reference" / "config.md"
# the groups in the order a user meets them (conf/config.yaml first); any other folder follows, sorted
GROUP_ORDER = (".", "task", "model", "mode", "train", "data", "hparams_search", "hydra/launcher")
LONG_LIST = 8  # a list longer than this shows its first items and its length


@dataclass
class Key:
    path: str      # dotted: "hub.columns"
    default: str   # as written in the file, on one line ("" for a mapping's own row)
    meaning: str
    group: bool = False  # a mapping's own row (its keys follow)
    own: bool = False    # the meaning is this file's own comment, not inherited

    def __post_init__(self) -> None:
        self.own = bool(self.meaning)


@dataclass
class ConfFile:
    rel: str              # conf-relative, without .yaml: "task/nli"
    about: str            # the file's opening comment
    defaults: list[str]   # its Hydra defaults list, as written
    package: str | None   # its "# @package" directive
    keys: list[Key]


def comment_text(line: str) -> str | None:
    """The text of a comment-only line, else None."""
    stripped = line.strip()
    return stripped[1:].strip() if stripped.startswith("#") else None


def indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def trailing_comment(line: str, column: int) -> str:
    """The comment after the value that ends at ``column`` of ``line`` ("" when there is none)."""
    match = re.match(r"\s*#\s?(.*)$", line[column:])
    return match.group(1).strip() if match else ""


def join(above: str, same_line: str) -> str:
    """The comment above a key and the one on its line, as one text."""
    if above and same_line:
        return f"{above}{'' if above[-1] in '.;:' else ';'} {same_line}"
    return above or same_line


def one_line(node: yaml.Node, lines: list[str]) -> str:
    """A value on one line: scalars and flow collections as written, block collections in flow style,
    long lists as their first items and their length."""
    if isinstance(node, yaml.SequenceNode):
        items = [one_line(item, lines) for item in node.value]
        if len(items) > LONG_LIST:
            return f"[{', '.join(items[:3])}, … ({len(items)} items)]"
        if not node.flow_style:
            return f"[{', '.join(items)}]"
    if isinstance(node, yaml.MappingNode) and not node.flow_style:
        return "{" + ", ".join(f"{k.value}: {one_line(v, lines)}" for k, v in node.value) + "}"
    start, end = node.start_mark, node.end_mark
    if start.line == end.line:
        return lines[start.line][start.column:end.column].strip()
    parts = [lines[start.line][start.column:], *lines[start.line + 1:end.line], lines[end.line][:end.column]]
    return " ".join(p.strip() for p in parts if p.strip())


def comments_above(lines: list[str], line_no: int, column: int) -> list[str]:
    """The comment-only lines directly above ``line_no``, at the key's own indentation."""
    out: list[str] = []
    for line in reversed(lines[:line_no]):
        text = comment_text(line)
        if text is None or indent(line) != column or text.startswith("@package"):
            break
        out.insert(0, text)
    return out


def comments_below(lines: list[str], line_no: int, column: int) -> list[str]:
    """The comment-only lines indented past the key that continue its same-line comment."""
    out: list[str] = []
    for line in lines[line_no + 1:]:
        text = comment_text(line)
        if text is None or indent(line) <= column:
            break
        out.append(text)
    return out


def read_file(path: Path, conf: Path) -> ConfFile:
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    package = next((m.group(1) for m in re.finditer(r"^# @package (\S+)", text, re.M)), None)
    opening: list[str] = []
    for line in lines:
        if comment_text(line) is None:
            break
        if not comment_text(line).startswith("@package"):
            opening.append(comment_text(line))
    about_len = len(opening)
    keys: list[Key] = []
    defaults: list[str] = []

    def walk(node: yaml.MappingNode, prefix: str) -> None:
        nonlocal about_len
        for k, v in node.value:
            line_no, column = k.start_mark.line, k.start_mark.column
            path_ = prefix + str(k.value)
            if path_ == "defaults" and isinstance(v, yaml.SequenceNode):
                defaults.extend(one_line(item, lines).strip("{}") for item in v.value)
                continue
            above = comments_above(lines, line_no, column)
            # "# learning_rate: 1e-3 when…" names its key: from there on the lines are the key's
            named = next((i for i, c in enumerate(above) if c.startswith(f"{k.value}:")), None)
            first = not keys and not prefix
            if named is not None:
                if first and len(above) == len(opening):
                    about_len = named
                above = above[named:]
            elif first and len(above) == len(opening):
                above = []  # the file's opening comment, not this key's
            if isinstance(v, yaml.MappingNode) and not v.flow_style:
                own = trailing_comment(lines[line_no], k.end_mark.column + 1)
                keys.append(Key(path_, "", join(" ".join(above), own), group=True))
                walk(v, path_ + ".")
                continue
            end = v.end_mark
            if isinstance(v, yaml.SequenceNode) and not v.flow_style:  # a block list: its key's line
                end_line, end_col = line_no, k.end_mark.column + 1
            elif end.column or end.line == v.start_mark.line:
                end_line, end_col = end.line, end.column
            else:  # a multi-line value ends at column 0 of the line after it
                end_line, end_col = end.line - 1, len(lines[end.line - 1])
            same = trailing_comment(lines[end_line], end_col)
            below = comments_below(lines, end_line, column) if same else []
            keys.append(Key(path_, one_line(v, lines), join(" ".join(above), " ".join([same] + below).strip())))

    root = yaml.compose(text)
    if root is not None:
        walk(root, "")
    return ConfFile(path.relative_to(conf).with_suffix("").as_posix(), " ".join(opening[:about_len]),
                    defaults, package, keys)


def group_defaults(conf: Path) -> dict[str, str]:
    """conf/config.yaml's defaults list: group → the file chosen when the command line names none."""
    entries = (yaml.safe_load((conf / "config.yaml").read_text(encoding="utf-8")) or {}).get("defaults", [])
    return {g: str(v) for e in entries if isinstance(e, dict) for g, v in e.items() if v is not None}


def parents(f: ConfFile) -> list[str]:
    """The files of f's own group that its defaults list builds on (``- dp``, ``- _finetune``)."""
    return [d for d in f.defaults if ":" not in d and d != "_self_" and "/" not in d]


def conf_groups(conf: Path = CONF) -> list[tuple[str, list[ConfFile]]]:
    """(group, its files) in GROUP_ORDER. A key without a comment takes the meaning of the same key
    in the files its defaults list builds on, else in the group's default file (conf/config.yaml)."""
    found: dict[str, list[Path]] = {}
    for path in sorted(conf.rglob("*.yaml")):
        found.setdefault(path.parent.relative_to(conf).as_posix(), []).append(path)
    rank = {g: i for i, g in enumerate(GROUP_ORDER)}
    chosen = group_defaults(conf)
    groups = []
    for group in sorted(found, key=lambda g: (rank.get(g, len(rank)), g)):
        files = {Path(f.rel).name: f for f in (read_file(p, conf) for p in found[group])}
        own = {name: {k.path: k.meaning for k in f.keys if k.meaning} for name, f in files.items()}

        def inherited(name: str, path: str, seen: frozenset = frozenset()) -> str:
            for base in parents(files[name]) + ([chosen[group]] if group in chosen else []):
                if base in files and base not in seen | {name}:
                    meaning = own[base].get(path) or inherited(base, path, seen | {name})
                    if meaning:
                        return meaning
            return ""

        for name, f in files.items():
            for key in f.keys:
                key.meaning = key.meaning or inherited(name, key.path)
        groups.append((group, list(files.values())))
    return groups


def explained(f: ConfFile, key: Key) -> bool:
    """A key has a meaning, or sits in a commented mapping none of whose keys has a comment of its
    own (``hub:`` explains ``hub.path`` and ``hub.name``; a ``score.id_column`` beside commented
    ``score.*`` keys needs its own)."""
    if key.meaning:
        return True
    parent = key.path.rpartition(".")[0]
    while parent:
        row = next((k for k in f.keys if k.group and k.path == parent), None)
        siblings = [k for k in f.keys if k.path.startswith(parent + ".") and not k.group]
        if row is not None and row.meaning and not any(k.own for k in siblings):
            return True
        parent = parent.rpartition(".")[0]
    return False


def missing_meanings(conf: Path = CONF) -> list[str]:
    """'conf/FILE.yaml: key' for every key that has no meaning."""
    return [f"conf/{f.rel}.yaml: {k.path}" for _, files in conf_groups(conf) for f in files
            for k in f.keys if not k.group and not explained(f, k)]


def escape(text: str) -> str:
    """Markdown for a table cell: code spans kept; elsewhere * _ [ ] | escaped, < as &lt;."""
    out = []
    for i, part in enumerate(re.split(r"(`[^`]*`)", text)):
        if i % 2:
            out.append(part.replace("|", "\\|"))
        else:
            part = re.sub(r"([\\*_\[\]|])", r"\\\1", part)
            out.append(part.replace("<", "&lt;"))
    return "".join(out)


def code(value: str) -> str:
    if not value:
        return ""
    fence = "``" if "`" in value else "`"
    return f"{fence}{value.replace('|', chr(92) + '|')}{fence}"


def render(conf: Path = CONF) -> str:
    out = ["# Configuration reference", "",
           "<!-- generated from conf/ by scripts/config_reference.py: do not edit by hand -->", "",
           "Every key of `conf/`, its default as written in its YAML file, and what it means (the file's "
           "comments). Any key can be set on the command line (`python run.py task=nli "
           "train.learning_rate=3e-5`); a group's file is chosen by its name (`task=nli` reads "
           "`conf/task/nli.yaml`). Values such as `${oc.select:task.recipe.epochs,3}` are resolved when "
           "the run starts: add `--cfg job` to a command to print its resolved config. This page is "
           "generated: after changing `conf/`, run `python scripts/config_reference.py`.", ""]
    for group, files in conf_groups(conf):
        level = "##" if group == "." else "###"
        if group != ".":
            names = ", ".join(f"`{Path(f.rel).name}`" for f in files)
            out += [f"## {group}", "", f"Chosen with `{group}=NAME`, one of: {names}.", ""]
        for f in files:
            out += [f"{level} `conf/{f.rel}.yaml`", ""]
            if f.about:
                out += [escape(f.about), ""]
            notes = ([f"Package `{f.package}`: its keys sit at that place in the config."] if f.package else []) + \
                    ([f"Defaults list: {', '.join(code(d) for d in f.defaults)}."] if f.defaults else [])
            if notes:
                out += [" ".join(notes), ""]
            rows = [k for k in f.keys if not k.group or k.meaning]
            if rows:
                out += ["| key | default | meaning |", "| --- | --- | --- |"]
                out += [f"| `{k.path}` | {code(k.default)} | {escape(k.meaning)} |" for k in rows]
                out.append("")
    return "\n".join(out).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write docs/reference/config.md from conf/.")
    parser.add_argument("--check", action="store_true", help="exit 1 if the committed page is stale")
    parser.add_argument("--missing", action="store_true", help="list the keys without a meaning")
    args = parser.parse_args(argv)
    if args.missing:
        missing = missing_meanings()
        print("\n".join(missing) or "every key has a meaning")
        return 1 if missing else 0
    page = render()
    if args.check:
        if not PAGE.exists() or PAGE.read_text(encoding="utf-8") != page:
            print(f"{PAGE.relative_to(ROOT)} is stale: run python scripts/config_reference.py", file=sys.stderr)
            return 1
        return 0
    PAGE.parent.mkdir(parents=True, exist_ok=True)
    PAGE.write_text(page, encoding="utf-8")
    print(f"wrote {PAGE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
