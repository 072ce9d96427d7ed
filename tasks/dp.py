"""KLUE DP: dependency parsing of eojeol (words): a head word and a relation label per word.

* reading: KLUE's official TSV, one word per line ``INDEX WORD_FORM LEMMA POS HEAD DEPREL``,
  ``##`` comment lines (the ``## guid<TAB>sentence`` line opens a sentence), a blank line between
  sentences. WORD_FORM, HEAD and DEPREL are used, and POS with ``task.pos=true``. A file to
  predict (``action=predict``) may lack HEAD and DEPREL (``INDEX WORD_FORM LEMMA POS``, or
  ``INDEX WORD_FORM``), or be just one word per line.
* POS features (``task.pos``): as KLUE-baseline (``convert_examples_to_features`` in
  klue_baseline/data/klue_dp.py) a word's tag is the *last* of its morphemes' tags (``NNG+JKS`` →
  ``JKS``: the particle or ending that marks the word's function), an id in its tag list
  (``get_pos_labels``, ``POS_TAGS`` here); a tag outside it, or a missing one (``_``, ``-``, empty),
  gets the id ``UNKNOWN_POS`` (the reference would crash) and is counted in the log.
* encoding: the words joined by spaces are tokenized with offsets; each token knows its word
  (``token_word``, -100 for specials) through the character alignment NER uses (tasks/ner.py), so
  it holds for every tokenizer. The head (heads/dependency.py) builds a state per word (its first
  subword, the mean of its subwords, or its first and last ones, ``task.word_pooling``; with
  ``task.pos`` its tag's embedding; with ``task.lstm`` a word-level LSTM on top) and [CLS] stands
  for the root.
  Gold heads are word numbers (0 = root); a word lost to truncation or without any subword has no
  state: it is not trained on (-100), and neither is a word whose gold head is such a word.
* decoding: the head predicts per word the best-scoring head and the label at that head (at
  inference, the label of the *predicted* head); a word without a state gets a fixed guess (the
  next word as its head, the last word the root; Korean is head-final), label ``labels[0]``.
  Each sentence's output also says how many of its last words were cut by ``max_length``
  (``truncated_words``).
* scoring: KLUE-baseline's UAS and LAS, macro and micro F1 (tasks/metric_sets.klue_dp_scores).
  ``task.truncated_words``: ``guess`` scores every word, the cut ones with their guess; ``exclude``
  leaves the cut words out of the scores, as KLUE-baseline (its ``head_ids`` are truncated with the
  tokens), and reports how many (``n_words_excluded``).
* ``ceiling``: the gold heads and labels through this alignment and decoding.
"""
from __future__ import annotations

import os
from collections import Counter
from typing import Any, Iterable

import numpy as np

from kotune.core.registry import register_task
from tasks import metric_sets
from tasks.base import IGNORE, EncodeSettings, Task
from kotune.core.errors import ConfigError, DataError
from tasks.io import open_text, text_lines
from kotune.core.log import log
from tasks.tagging import Warnings, align, layout

WORD_POOLINGS = ("first", "mean", "first_last")
BIAFFINE_INITS = ("zero", "xavier")
TRUNCATED_WORDS = ("guess", "exclude")

COLUMNS = ("INDEX", "WORD_FORM", "LEMMA", "POS", "HEAD", "DEPREL")
POS_COLUMN = COLUMNS.index("POS")
# KLUE-baseline's POS tag list, in its order (get_pos_labels() in klue_baseline/data/klue_dp.py)
POS_TAGS = ("NNG", "NNP", "NNB", "NP", "NR", "VV", "VA", "VX", "VCP", "VCN", "MMA", "MMD", "MMN", "MAG",
            "MAJ", "JC", "IC", "JKS", "JKC", "JKG", "JKO", "JKB", "JKV", "JKQ", "JX", "EP", "EF", "EC",
            "ETN", "ETM", "XPN", "XSN", "XSV", "XSA", "XR", "SF", "SP", "SS", "SE", "SO", "SL", "SH",
            "SW", "SN", "NA")
UNKNOWN_POS = len(POS_TAGS)  # a tag outside the list, or none; the head adds the root's id after it
NUM_POS_IDS = len(POS_TAGS) + 2
MISSING_POS = ("", "_", "-")
POS_ID = {tag: k for k, tag in enumerate(POS_TAGS)}


def pos_id(pos: str | None) -> int:
    """A word's POS id: its last morpheme's tag (KLUE-baseline: ``pos.split("+")[-1]``)."""
    return POS_ID.get((pos or "").split("+")[-1], UNKNOWN_POS)


def word_of_tokens(words: list[str], offsets: list[tuple[int, int]], special: list[bool],
                   truncated: bool) -> tuple[list[int], int]:
    """Per token the (0-based) word it belongs to, -100 for specials; and the number of words
    before the truncation point (the rest are lost). No word numbered at or past the token count
    has a token: the head's word axis is the token axis (heads/dependency.py ``word_states``), and
    only a sentence with three or more words without a subword could number a word past it."""
    lay = layout(words, " ")
    al = align(lay.text, offsets, special, truncated)
    token_word = [IGNORE if s < 0 or lay.char_unit[s] >= len(offsets) else lay.char_unit[s] for s in al.token_start]
    kept = sum(1 for first in lay.unit_first if first < al.char_limit)
    return token_word, kept


def fallback_heads(n: int) -> list[int]:
    """The guess for words without a state: the next word, the last word the root."""
    return [k + 2 if k + 1 < n else 0 for k in range(n)]


@register_task("dp")
class DependencyTask(Task):
    """KLUE DP (``task=dp``)."""

    def abstention_refusal(self) -> str | None:  # predict.min_confidence (tasks/abstention.py)
        return "parses: a head and a relation per word, not one class with one probability"

    head = "dependency"
    label_fields = ("heads", "deprels")
    # which subword states make a word's state, whether POS ids are model inputs, the word LSTM
    saved_options = {"word_pooling": "error", "pos": "error", "lstm": "error"}

    def __init__(self, cfg):
        super().__init__(cfg)
        self.word_pooling = str(cfg.get("word_pooling", "first"))
        if self.word_pooling not in WORD_POOLINGS:
            raise ConfigError(f"task.word_pooling={self.word_pooling}: choose one of {', '.join(WORD_POOLINGS)}")
        self.biaffine_init = str(cfg.get("biaffine_init", "zero"))
        if self.biaffine_init not in BIAFFINE_INITS:
            raise ConfigError(f"task.biaffine_init={self.biaffine_init}: choose one of {', '.join(BIAFFINE_INITS)}")
        self.truncated_words = str(cfg.get("truncated_words", "guess"))
        if self.truncated_words not in TRUNCATED_WORDS:
            raise ConfigError(f"task.truncated_words={self.truncated_words}: choose one of {', '.join(TRUNCATED_WORDS)}")
        self.pos, self.lstm = bool(cfg.get("pos", False)), bool(cfg.get("lstm", False))
        self.pos_dim, self.lstm_size = int(cfg.get("pos_dim", 256)), int(cfg.get("lstm_size", 768))
        for option, value in (("pos_dim", self.pos_dim), ("lstm_size", self.lstm_size)):
            if value < 1:
                raise ConfigError(f"task.{option}={value}: must be a positive size")

    # ---- reading -------------------------------------------------------------------------
    def read_file(self, path: str, labelled: bool = True) -> list[dict]:
        examples: list[dict] = []
        cur: dict | None = None
        header: tuple[str, str] | None = None
        label_set = set(self.labels or [])

        def close():
            nonlocal cur, header
            if cur is not None:
                self._check_tree(path, cur)
                examples.append(cur)
            cur, header = None, None

        with open_text(path) as f:
            for n, raw in enumerate(text_lines(path, f), 1):
                line = raw.rstrip("\r\n")
                if line.startswith("#"):
                    parts = line.split("\t")
                    if len(parts) == 2:  # "## guid<TAB>sentence"; other comment lines are notes
                        close()
                        header = (parts[0].lstrip("#").strip(), parts[1].strip())
                    continue
                if not line.strip():
                    close()
                    continue
                row = [c.strip() for c in line.split("\t")]
                if cur is None:
                    guid = header[0] if header else f"{os.path.basename(path)}:{n}"
                    cur = {"id": guid, "source": path, "line": n, "words": [], "pos": [], "heads": [], "deprels": []}
                if len(row) == 1 and not labelled:  # a bare word per line
                    row = [str(len(cur["words"]) + 1), row[0]]
                self._check_columns(path, n, row, labelled)
                index, word = row[0], row[1]
                if not index.isdigit() or int(index) != len(cur["words"]) + 1:
                    raise DataError(path, n, f"word index {index!r}, expected {len(cur['words']) + 1}")
                if not word or any(ch.isspace() for ch in word):
                    raise DataError(path, n, f"word form {word!r} is empty or contains a space")
                cur["words"].append(word)
                cur["pos"].append(row[POS_COLUMN] if len(row) > POS_COLUMN else "")
                if labelled:
                    head, deprel = row[4], row[5]
                    if not head.isdigit():
                        raise DataError(path, n, f"head {head!r} is not a word number")
                    if self.labels is not None and deprel not in label_set:
                        raise DataError(path, n, f"unknown relation '{deprel}' (expected one of: "
                                                 f"{', '.join(self.labels)})")
                    cur["heads"].append(int(head))
                    cur["deprels"].append(deprel)
        close()
        if self.pos:
            self._check_pos(path, examples)
        return examples

    def _check_columns(self, path: str, n: int, row: list[str], labelled: bool) -> None:
        expected = " ".join(COLUMNS)
        if labelled and len(row) != len(COLUMNS):
            raise DataError(path, n, f"{len(row)} tab-separated columns, expected {len(COLUMNS)} ({expected})")
        if not labelled and len(row) > len(COLUMNS):
            raise DataError(path, n, f"{len(row)} tab-separated columns, expected at most {len(COLUMNS)} "
                                     f"({expected}; HEAD and DEPREL may be absent, or one word per line)")
        if self.pos and len(row) <= POS_COLUMN:
            raise DataError(path, n, f"no POS column (column {POS_COLUMN + 1} of {expected}) and task.pos=true: "
                                     "the model reads POS tags (a model trained with task.pos=false does not)")

    @staticmethod
    def _check_pos(path: str, examples: list[dict]) -> None:
        """With task.pos: a file with no tags at all is an error; unknown or missing tags are counted."""
        tags = [p for ex in examples for p in ex["pos"]]
        missing = sum(p in MISSING_POS for p in tags)
        if tags and missing == len(tags):
            raise DataError(path, None, "the POS column is empty ('_', '-' or blank) on every row and task.pos=true: "
                                        "set task.pos=false")
        unknown = Counter(p.split("+")[-1] for p in tags if p not in MISSING_POS and pos_id(p) == UNKNOWN_POS)
        if missing or unknown:
            log(f"{path}: {missing} word(s) without a POS tag and {sum(unknown.values())} with a tag outside "
                f"KLUE's list ({', '.join(t for t, _ in unknown.most_common(5)) or 'none'}) get the unknown-POS id")

    @staticmethod
    def _check_tree(path: str, ex: dict) -> None:
        if not ex["heads"]:  # an unlabelled sentence (action=predict)
            return
        n = len(ex["words"])
        for k, h in enumerate(ex["heads"]):
            if h > n or h == k + 1:
                raise DataError(path, ex["line"] + k, f"sentence {ex['id']}: word {k + 1} has head {h} "
                                                     f"(the sentence has {n} words; 0 is the root)")

    def read_hub(self, rows, path: str) -> list[dict]:
        raise ConfigError(f"task {self.name} reads KLUE's DP TSV: set data.train_file=... "
                          "(data.validation_file=... or data.validation_split=0.2), or data=sample")

    def fit_labels(self, train: list[dict]) -> None:
        if self.labels is None:
            self.labels = sorted({d for ex in train for d in ex["deprels"]})

    def training_texts(self, examples: list[dict]) -> Iterable[str]:
        return (" ".join(ex["words"]) for ex in examples)

    # ---- encoding ------------------------------------------------------------------------
    def outputs_from_predictions(self, values: list, examples: list[dict], path: str) -> list[dict]:
        """A head (word number, 0 = root) and a relation per word."""
        from tasks.outputs import check_labels

        outputs = [dependency_output(v, ex, path) for v, ex in zip(values, examples)]
        check_labels([d for out in outputs for d in out["deprels"]], list(self.labels), path, "relation")
        return outputs

    def head_kwargs(self) -> dict:
        return {"num_labels": len(self.labels), "word_pooling": self.word_pooling,
                "arc_dim": int(self.cfg.get("arc_dim", 512)), "label_dim": int(self.cfg.get("label_dim", 128)),
                "num_pos": NUM_POS_IDS if self.pos else 0, "pos_dim": self.pos_dim if self.pos else 0,
                "lstm_size": self.lstm_size if self.lstm else 0, "init": self.biaffine_init}

    def model_columns(self, features) -> list[str]:
        return super().model_columns(features) + ["token_word"] + (["pos_ids"] if self.pos else [])

    def encode(self, examples: list[dict], tokenizer, settings: EncodeSettings):
        import datasets

        if not getattr(tokenizer, "is_fast", False):
            raise ConfigError(f"task {self.name} aligns words by character offsets: it needs a fast "
                              f"tokenizer, got {type(tokenizer).__name__}")
        enc = tokenizer([" ".join(ex["words"]) for ex in examples], truncation=True,
                        max_length=settings.max_length, return_offsets_mapping=True,
                        return_token_type_ids=settings.token_type_ids)
        cols: dict[str, list] = {k: list(v) for k, v in enc.items() if k != "offset_mapping"}
        cols.update(token_word=[], n_words=[], truncated_words=[], represented=[], heads=[], deprels=[])
        if self.pos:
            cols["pos_ids"] = [[pos_id(p) for p in ex["pos"]] for ex in examples]
        label_id = {name: k for k, name in enumerate(self.labels)}
        lost = Counter()
        warnings = Warnings()
        for i, ex in enumerate(examples):
            special = [s is None for s in enc.sequence_ids(i)]
            truncated = len(enc["input_ids"][i]) >= settings.max_length
            token_word, kept = word_of_tokens(ex["words"], enc["offset_mapping"][i], special, truncated)
            has_state = set(t for t in token_word if t != IGNORE)
            n = len(ex["words"])
            width = max(has_state) + 1 if has_state else 0  # words past the last one with a state: dropped
            represented = [k in has_state for k in range(n)]
            for k in range(n):
                if not represented[k]:
                    why = ("past max_length" if k >= kept else "without a subword" if k < len(token_word)
                           else "numbered past the token count")
                    lost[why] += 1
                    warnings.warn(f"word {why}", f"{ex['source']}:{ex['line'] + k}",
                                  f"sentence {ex['id']}: word {k + 1} {ex['words'][k]!r} is {why}: it gets "
                                  f"the fallback guess{self._unscored(why)}")
            heads, deprels = [], []
            for k in range(width if ex["heads"] else 0):  # an unlabelled sentence: nothing to train on
                h = ex["heads"][k]
                ok = represented[k] and (h == 0 or represented[h - 1])
                heads.append(h if ok else IGNORE)
                deprels.append(label_id[ex["deprels"][k]] if ok else IGNORE)
            cols["token_word"].append(token_word)
            cols["n_words"].append(n)
            cols["truncated_words"].append(n - kept)
            cols["represented"].append(represented)
            cols["heads"].append(heads)
            cols["deprels"].append(deprels)
        warnings.summary(str(examples[0].get("source", "?")) if examples else "?")
        if lost:
            log(f"{sum(lost.values())} words have no state and get the fallback guess: "
                + ", ".join(f"{n} {why}{self._unscored(why)}" for why, n in lost.items()))
        return datasets.Dataset.from_dict(cols)

    def _unscored(self, why: str) -> str:
        excluded = why == "past max_length" and self.truncated_words == "exclude"
        return " (left out of the scores: task.truncated_words=exclude)" if excluded else ""

    # ---- decoding and scoring ------------------------------------------------------------
    def decode(self, predictions, features, examples: list[dict]) -> list[dict]:
        """Per sentence ``heads`` (word numbers, 0 = root) and ``deprels`` (names), one per word.
        ``predictions``: the head's (predicted heads, predicted label ids) per word slot."""
        pred_heads, pred_labels = (np.asarray(p) for p in predictions[:2])
        represented, truncated = features["represented"], features["truncated_words"]
        outputs = []
        for i, ex in enumerate(examples):
            n = len(ex["words"])
            heads, deprels = fallback_heads(n), [self.labels[0]] * n
            for k in range(n):
                if represented[i][k]:
                    heads[k] = int(pred_heads[i, k])
                    deprels[k] = self.labels[int(pred_labels[i, k])]
            outputs.append({"heads": heads, "deprels": deprels, "truncated_words": int(truncated[i])})
        return outputs

    def score(self, outputs: list[dict], examples: list[dict]) -> dict[str, float]:
        """UAS and LAS over every word, or (``truncated_words=exclude``) over the words not cut by
        ``max_length``, with ``n_words_excluded``."""
        gold_heads = [list(ex["heads"]) for ex in examples]
        excluded = 0
        if self.truncated_words == "exclude":
            for heads, out in zip(gold_heads, outputs):
                cut = int(out.get("truncated_words") or 0)
                heads[len(heads) - cut:] = [-1] * cut  # -1: unscored (KLUE-baseline's padding)
                excluded += cut
        scores = metric_sets.klue_dp_scores([o["heads"] for o in outputs], [o["deprels"] for o in outputs],
                                            gold_heads, [ex["deprels"] for ex in examples], self.labels)
        return {**scores, "n_words_excluded": excluded} if self.truncated_words == "exclude" else scores

    def prediction_records(self, outputs: list[dict], examples: list[dict]) -> list[dict]:
        return [{"id": ex["id"], "words": ex["words"], "heads": out["heads"], "deprels": out["deprels"],
                 "truncated_words": out["truncated_words"],
                 "gold_heads": ex["heads"] or None, "gold_deprels": ex["deprels"] or None}
                for out, ex in zip(outputs, examples)]

    # ---- pipeline ceiling ----------------------------------------------------------------
    def ceiling(self, features, examples: list[dict]) -> tuple[dict[str, float], dict]:
        """Gold heads and labels wherever the alignment lets a model express them (words with a
        state whose gold head has one too), the decode's fallback elsewhere."""
        width = max((len(ex["words"]) for ex in examples), default=1)
        heads = np.full((len(examples), width), IGNORE, dtype=np.int64)
        labels = np.full((len(examples), width), IGNORE, dtype=np.int64)
        fallback_used = unexpressible = 0
        for i, (ex, gold_h, gold_l) in enumerate(zip(examples, features["heads"], features["deprels"])):
            for k, (h, lab) in enumerate(zip(gold_h, gold_l)):
                heads[i, k], labels[i, k] = h, lab
            # a word with a state whose gold head has none: the best a model can do is some other word
            for k, rep in enumerate(features["represented"][i]):
                if not rep:
                    fallback_used += 1
                elif k >= len(gold_h) or gold_h[k] == IGNORE:
                    unexpressible += 1
                    heads[i, k], labels[i, k] = fallback_heads(len(ex["words"]))[k], 0
        outputs = self.decode((heads, labels), features, examples)
        n_words = sum(len(ex["words"]) for ex in examples)
        lines = [f"ceiling: {fallback_used} of {n_words} words have no state (fallback guess), "
                 f"{unexpressible} more have a gold head without one"]
        return self.score(outputs, examples), {"words": n_words, "without_state": fallback_used,
                                               "head_without_state": unexpressible, "lines": lines}


def dependency_output(value: Any, ex: dict, path: str) -> dict:
    """``{"heads": [...], "deprels": [...]}`` (or its JSON text) → the DP decode() output, checked."""
    from tasks.outputs import parse_tags

    if isinstance(value, str) and value.strip().startswith("{"):
        import json

        value = json.loads(value)
    if not isinstance(value, dict) or not {"heads", "deprels"} <= set(value):
        raise DataError(path, None, f"id {ex['id']!r}: a DP prediction needs heads and deprels (columns "
                                    "'heads' and 'deprels', as kotune's predictions.jsonl), got "
                                    f"{str(value)[:60]!r}")
    heads, deprels = parse_tags(value["heads"]), parse_tags(value["deprels"])
    n = len(ex["words"])
    if len(heads) != n or len(deprels) != n:
        raise DataError(path, None, f"id {ex['id']!r}: {len(heads)} heads and {len(deprels)} deprels for {n} words")
    if not all(h.isdigit() and int(h) <= n for h in heads):
        raise DataError(path, None, f"id {ex['id']!r}: heads {heads} are not word numbers 0..{n}")
    truncated = value.get("truncated_words") or 0
    if not (isinstance(truncated, int) and 0 <= truncated <= n):
        raise DataError(path, None, f"id {ex['id']!r}: truncated_words {truncated!r} is not a word count 0..{n}")
    return {"heads": [int(h) for h in heads], "deprels": deprels, "truncated_words": truncated}
