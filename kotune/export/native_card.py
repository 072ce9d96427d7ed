"""What a native export (kotune/export/native.py) says of itself, read without loading it: its
manifest's kind, and the task its model card names (README.md's tags: ``kotune``, the task, the
head). Light on purpose: kotune/cli/checkpoint_overrides.py asks before a config is composed."""
from __future__ import annotations

import json
import os

from kotune.core.atomic_dir import MANIFEST

NATIVE_KIND = "native-export"  # the manifest's kind (kotune/export/native.py writes it)


def is_native_export(path: str) -> bool:
    try:
        with open(os.path.join(path, MANIFEST), encoding="utf-8") as f:
            return json.load(f).get("kind") == NATIVE_KIND
    except (OSError, ValueError, AttributeError):
        return False


def card_tags(path: str) -> list[str]:
    """The tags of the export's model card (README.md's YAML front matter), [] without one."""
    import yaml

    try:
        with open(os.path.join(path, "README.md"), encoding="utf-8") as f:
            text = f.read()
        if not text.startswith("---"):
            return []
        data = yaml.safe_load(text.split("---", 2)[1]) or {}
        return [str(t) for t in data.get("tags") or []]
    except (OSError, ValueError, IndexError, AttributeError, yaml.YAMLError):
        return []


def card_task(path: str) -> str | None:
    """The task preset the export's model card names, or None (not a preset of conf/ or a plug-in's)."""
    from kotune.plugins import preset_names

    tags = card_tags(path)
    return next((t for t in tags[1:2] if t in preset_names("task")), None) if tags[:1] == ["kotune"] else None
