"""A task kind of the plug-in's own: single-text classification read by the mean_linear head, with an
option of its own (``task.min_chars``: shorter texts are refused in one line)."""
from __future__ import annotations

import kotune
from kotune.core.errors import DataError


@kotune.register_task("keyword")
class KeywordTask(kotune.ClassificationTask):
    head = "mean_linear"
    own_options = {**kotune.ClassificationTask.own_options,
                   "min_chars": kotune.TaskOption((None, 0), "the shortest text a keyword task reads")}

    def read_file(self, path: str, labelled: bool = True) -> list[dict]:
        examples = super().read_file(path, labelled)
        shortest = int(self.cfg.get("min_chars") or 0)
        for ex in examples:
            if len(ex["text"]) < shortest:
                raise DataError(path, ex["id"], f"text of {len(ex['text'])} characters, under task.min_chars={shortest}")
        return examples
