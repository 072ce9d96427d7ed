"""``task=sentence_embedding``: a bi-encoder, one vector per text, trained with sentence-transformers'
losses (kotune/embeddings/); this module reads the data and scores the vectors (no torch).

A file's *shape* comes from its columns, and picks the loss and the metrics:

- **scored pairs** (``sentence1``, ``sentence2`` and a numeric ``score``, KLUE STS's ``labels.real-label``
  or a numeric ``label``; KorSTS, KLUE STS): CoSENT (``task.loss=cosine`` for cosine-similarity
  regression on scores / ``task.max_score``); Spearman and Pearson of the cosines;
- **triplets** (``anchor``, ``positive``, optional ``negative``: a hard negative): multiple-negatives
  ranking with in-batch negatives; recall@k and MRR@10 of each anchor retrieving its positive
  among every positive and negative of the file;
- **NLI pairs** (a pair with ``gold_label``/``label`` entailment | neutral | contradiction; KorNLI,
  KLUE NLI): each premise's entailed hypothesis is its positive and its contradiction the hard
  negative, and the other way round (sentence-transformers' NLI recipe; SimCSE, KoSBERT); neutral
  pairs are not used; then as triplets;
- **queries** (``query`` and ``relevant``: a list of relevant document texts, or ``positive``; an
  optional ``negative``): as triplets, the documents of all rows forming the corpus.

``action=predict`` reads single texts (an embedding per row) or pairs (their cosine similarity).
"""
from __future__ import annotations

import os
from typing import Any, Iterable

from kotune.core.errors import ConfigError, DataError
from kotune.core.log import log
from kotune.core.registry import register_task
from tasks.base import EncodeSettings, Task, TaskOption
from tasks.embedding_metrics import paired_cosines, retrieval_scores, similarity_scores
from tasks.io import KNOWN_PAIR_COLUMNS, KNOWN_TEXT_COLUMNS, column_names, conventional_columns, read_records

NLI_LABELS = ("entailment", "neutral", "contradiction")
SCORE_COLUMNS = ("score", "labels", "gold_label", "label")  # a pair's gold, looked up in this order
SHAPES = ("scored", "triplet", "nli", "retrieval")
LOSSES = ("auto", "cosent", "cosine", "mnrl")
SIMILARITY_METRICS = ("spearman", "pearson")
RETRIEVAL_METRICS = ("recall@1", "recall@5", "recall@10", "mrr@10")
VECTOR_DIGITS = 6  # an embedding's values in predictions and answers, rounded


@register_task("sentence_embedding")
class SentenceEmbeddingTask(Task):
    """Texts → vectors; pairs, triplets and queries (module docstring) → a loss and metrics."""

    head = "bi_encoder"
    pair = True  # it reads pairs (and triplets, queries; single texts to predict)
    label_fields: tuple[str, ...] = ()  # the loss is sentence-transformers', on texts: no label tensors
    runner = "sentence_transformers"  # its actions run in kotune/embeddings/ (SentenceTransformerTrainer)
    saved_options = {"loss": "saved"}
    own_options = {"loss": TaskOption((None, "auto"), "a sentence-transformers loss for the bi-encoder"),
                   "max_score": TaskOption((None,), "the top of a scored pair's scale (task.loss=cosine)"),
                   "stages": TaskOption((None,), "training files one after another (the two-stage recipe)"),
                   "validation_file": TaskOption((None,), "a preset's validation file where data.validation_file is unset")}

    def __init__(self, cfg):
        super().__init__(cfg)
        self.loss = str(cfg.get("loss") or "auto")
        if self.loss not in LOSSES:
            raise ConfigError(f"task.loss={self.loss}: choose one of {', '.join(LOSSES)}")

    # ---- reading -------------------------------------------------------------------------
    def read_file(self, path: str, labelled: bool = True) -> list[dict]:
        records = read_records(path, self.cfg.get("format") or self.reading.format, self.reading.quoting)
        if not records:
            return []
        present = column_names(records)
        where0 = records[0][0]
        cols = self.columns()
        if cols["anchor"] in present:
            return self._triplets(path, records, cols)
        if cols["query"] in present:
            return self._queries(path, records, cols)
        if cols["text"] not in present or (cols["text_pair"] not in present and cols["text_pair"] == "sentence2"):
            cols["text"], cols["text_pair"] = conventional_columns(
                path, present, (cols["text"], cols["text_pair"]), KNOWN_PAIR_COLUMNS,
                ("data.text_column", "data.text_pair_column"))
        if cols["text"] not in present:  # single texts (to embed): text, sentence or document
            cols["text"] = conventional_columns(path, present, (cols["text"],), tuple((n,) for n in KNOWN_TEXT_COLUMNS),
                                                ("data.text_column",))[0]
        if cols["text"] not in present:
            raise DataError(path, where0, f"no text column: a file of texts has '{cols['text']}' (data.text_column=), "
                                          f"pairs add '{cols['text_pair']}', triplets are anchor/positive[/negative], "
                                          f"queries query/relevant (columns: {', '.join(present[:12])})")
        if cols["text_pair"] not in present:
            if labelled:
                raise DataError(path, where0, f"single texts train nothing: a bi-encoder learns from pairs "
                                              f"('{cols['text']}', '{cols['text_pair']}' and a score or label), "
                                              "triplets (anchor, positive[, negative]) or queries (query, relevant)")
            return [{"id": self._id(path, where, row, cols), "shape": "texts",
                     "text": self._text(path, where, row, cols["text"])} for where, row in records]
        gold = cols["label"] or next((c for c in SCORE_COLUMNS if c in present), None)
        if not labelled:
            return [{"id": self._id(path, where, row, cols), "shape": "pair",
                     "text": self._text(path, where, row, cols["text"]),
                     "text_pair": self._text(path, where, row, cols["text_pair"])} for where, row in records]
        if gold is None or gold.split(".")[0] not in present:
            raise DataError(path, where0, f"a sentence pair needs a score or a label: no column "
                                          f"{gold or ' / '.join(SCORE_COLUMNS)} (columns: {', '.join(present[:12])}; "
                                          "set data.label_column=)")
        pairs = [self._pair(path, where, row, cols, gold) for where, row in records]
        if all(isinstance(p["score"], str) for p in pairs):
            return nli_triplets(path, pairs)
        wrong = next((p for p in pairs if isinstance(p["score"], str)), None)
        if wrong is not None:
            raise DataError(path, wrong["where"], f"'{gold}' is {wrong['score']!r} where other rows hold numbers")
        return [{k: v for k, v in p.items() if k != "where"} | {"shape": "scored"} for p in pairs]

    def columns(self) -> dict[str, str | None]:
        """Role → column: ``task.columns`` (``data.<role>_column`` replaces text, text_pair, label, id)."""
        given = dict(self.cfg.get("columns") or {})
        names = {"id": None, "text": "sentence1", "text_pair": "sentence2", "label": None, "anchor": "anchor",
                 "positive": "positive", "negative": "negative", "query": "query", "relevant": "relevant"}
        return {**names, **{k: v for k, v in given.items() if v is not None or k in ("id", "label")}}

    def _id(self, path: str, where: str, row: dict, cols: dict) -> str:
        return str(row.get(cols["id"] or "guid", f"{os.path.basename(path)}:{where}"))

    @staticmethod
    def _text(path: str, where: str, row: dict, column: str) -> str:
        value = row.get(column)
        if not isinstance(value, str) or not value.strip():
            raise DataError(path, where, f"the '{column}' text is empty or missing")
        return value

    def _pair(self, path: str, where: str, row: dict, cols: dict, gold: str) -> dict:
        value: Any = row
        for part in gold.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        if isinstance(value, dict):  # KLUE STS: labels.real-label
            value = value.get("real-label", value.get("label"))
        if value is None or (isinstance(value, str) and not value.strip()):
            raise DataError(path, where, f"no score or label in column '{gold}'")
        try:
            score: Any = float(value)
        except (TypeError, ValueError):
            score = str(value).strip()
            if score not in NLI_LABELS:
                raise DataError(path, where, f"'{gold}' is {score!r}: a score is a number, an NLI label one of "
                                             f"{', '.join(NLI_LABELS)}") from None
        return {"id": self._id(path, where, row, cols), "where": where, "score": score,
                "text": self._text(path, where, row, cols["text"]),
                "text_pair": self._text(path, where, row, cols["text_pair"])}

    def _triplets(self, path: str, records: list, cols: dict) -> list[dict]:
        out = []
        for where, row in records:
            ex = {"id": self._id(path, where, row, cols), "shape": "triplet"}
            for side in ("anchor", "positive", "negative"):
                value = row.get(cols[side])
                if side == "negative" and cols[side] not in row:
                    continue
                if not isinstance(value, str) or not value.strip():
                    raise DataError(path, where, f"the triplet's {side} ('{cols[side]}') is empty")
                ex[side] = value
            out.append(ex)
        if len({"negative" in ex for ex in out}) > 1:
            raise DataError(path, None, "some rows have a negative and others not: give every row one, or none")
        return out

    def _queries(self, path: str, records: list, cols: dict) -> list[dict]:
        out = []
        for where, row in records:
            query = self._text(path, where, row, cols["query"])
            relevant = row.get(cols["relevant"], row.get(cols["positive"]))
            relevant = [relevant] if isinstance(relevant, str) else relevant
            if not isinstance(relevant, list) or not [d for d in relevant if isinstance(d, str) and d.strip()]:
                raise DataError(path, where, f"query {query[:40]!r} has no relevant documents "
                                             f"('{cols['relevant']}' or '{cols['positive']}' is empty or missing)")
            if not all(isinstance(d, str) and d.strip() for d in relevant):
                raise DataError(path, where, f"a relevant document of query {query[:40]!r} is empty or not text")
            negative = row.get(cols["negative"])
            out.append({"id": self._id(path, where, row, cols), "shape": "retrieval", "anchor": query,
                        "positive": relevant[0], "relevant": relevant,
                        **({"negative": negative} if isinstance(negative, str) and negative.strip() else {})})
        return out

    def read_hub(self, rows, path: str) -> list[dict]:
        raise ConfigError("task=sentence_embedding reads local files (data.train_file, data.validation_file) or "
                          "data=sample")

    def training_texts(self, examples: list[dict]) -> Iterable[str]:
        return unique_texts(examples)

    # ---- encoding: the distinct texts, each once --------------------------------------------
    def encode(self, examples: list[dict], tokenizer, settings: EncodeSettings):
        import datasets

        enc = tokenizer(unique_texts(examples), truncation=True, max_length=settings.max_length,
                        return_token_type_ids=settings.token_type_ids)
        return datasets.Dataset.from_dict(dict(enc))

    def head_kwargs(self) -> dict:
        return {}

    # ---- scoring -------------------------------------------------------------------------
    def metric_names(self, examples: list[dict]) -> tuple[str, ...]:
        return SIMILARITY_METRICS if shape_of(examples) == "scored" else RETRIEVAL_METRICS

    def check_main_metric(self, examples: list[dict], where: str) -> None:
        names = self.metric_names(examples)
        if self.main_metric not in names:
            raise ConfigError(f"task.main_metric={self.main_metric}: {where} holds {shape_of(examples)} rows, "
                              f"scored by {', '.join(names)}: set task.main_metric={names[0]}")

    def score_vectors(self, vectors: list, examples: list[dict]) -> dict[str, float]:
        """Metrics of the vectors of :func:`unique_texts` (row i = text i) on ``examples``."""
        index = {text: i for i, text in enumerate(unique_texts(examples))}
        if shape_of(examples) == "scored":
            cosines = paired_cosines([vectors[index[ex["text"]]] for ex in examples],
                                     [vectors[index[ex["text_pair"]]] for ex in examples])
            return similarity_scores(cosines, [float(ex["score"]) for ex in examples])
        queries, relevant = retrieval_sets(examples)
        documents = corpus_of(examples)
        position = {text: i for i, text in enumerate(documents)}
        return retrieval_scores([vectors[index[q]] for q in queries], [vectors[index[d]] for d in documents],
                                [{position[d] for d in docs} for docs in relevant])

    def decode(self, predictions, features, examples: list[dict]) -> list[dict]:
        """The model's vectors of :func:`unique_texts` (row i = text i) → per example its embedding
        (a text) or its cosine similarity (a pair): what action=predict, serve and kotune.load answer."""
        index = {text: i for i, text in enumerate(unique_texts(examples))}
        rows = [[float(v) for v in row] for row in predictions]
        if "text_pair" not in (examples[0] if examples else {}):
            return [{"embedding": [round(v, VECTOR_DIGITS) for v in rows[index[ex["text"]]]]} for ex in examples]
        cosines = paired_cosines([rows[index[ex["text"]]] for ex in examples],
                                 [rows[index[ex["text_pair"]]] for ex in examples])
        return [{"similarity": c} for c in cosines]

    def prediction_records(self, outputs: list[Any], examples: list[dict]) -> list[dict]:
        return [{"id": ex["id"], **out} for out, ex in zip(outputs, examples)]

    serve_paths = ("/predict", "/embed")

    @property
    def request_fields(self) -> tuple[str, ...]:
        return ("text",)

    def request_examples(self, items: list[dict[str, str]], source: str = "request") -> list[dict]:
        out = []
        for n, item in enumerate(items):
            text = item.get("text")
            if not isinstance(text, str) or not text.strip():
                raise DataError(source, f"item {n}", "'text' is empty or not text")
            out.append({"id": str(n), "shape": "texts", "text": text})
        return out


def shape_of(examples: list[dict]) -> str:
    return examples[0]["shape"] if examples else "texts"


def unique_texts(examples: list[dict]) -> list[str]:
    """Every text of the examples once, in order of first appearance: what is encoded."""
    seen: dict[str, None] = {}
    for ex in examples:
        for key in ("text", "text_pair", "anchor", "positive", "negative"):
            if key in ex:
                seen.setdefault(ex[key], None)
        for doc in ex.get("relevant", ()):
            seen.setdefault(doc, None)
    return list(seen)


def corpus_of(examples: list[dict]) -> list[str]:
    """The documents the queries (anchors) are ranked against: every positive, relevant and negative text."""
    seen: dict[str, None] = {}
    for ex in examples:
        for doc in (*ex.get("relevant", (ex["positive"],)), *([ex["negative"]] if "negative" in ex else [])):
            seen.setdefault(doc, None)
    return list(seen)


def retrieval_sets(examples: list[dict]) -> tuple[list[str], list[set[str]]]:
    """The distinct queries (anchors), each with the union of its rows' relevant documents."""
    relevant: dict[str, set[str]] = {}
    for ex in examples:
        relevant.setdefault(ex["anchor"], set()).update(ex.get("relevant", (ex["positive"],)))
    return list(relevant), list(relevant.values())


def nli_triplets(path: str, pairs: list[dict]) -> list[dict]:
    """Labelled NLI pairs → triplets as sentence-transformers' NLI recipe (training_nli_v2) builds
    them: each pair counts in both directions (a hypothesis is also an anchor, the premise its
    entailed or contradicted text), and each anchor with both an entailed text e and a contradicted
    one c gives (anchor, e, c) and (e, anchor, c). Per anchor, its i-th entailment goes with its i-th
    contradiction (the shorter list cycled; the recipe draws one of each at random); anchors without
    both are left out (premises counted in the log)."""
    by_anchor: dict[str, dict[str, dict[str, str]]] = {}  # anchor → label → text → the pair's id (texts deduplicated)
    for p in pairs:
        for anchor, other in ((p["text"], p["text_pair"]), (p["text_pair"], p["text"])):
            by_anchor.setdefault(anchor, {label: {} for label in NLI_LABELS})[p["score"]].setdefault(other, p["id"])
    premises = {p["text"] for p in pairs}
    out, left_out = [], 0
    for anchor, texts in by_anchor.items():
        positives, negatives = list(texts["entailment"].items()), list(texts["contradiction"].items())
        if not positives or not negatives:
            left_out += anchor in premises  # a hypothesis is seldom an anchor: not worth a word
            continue
        for i in range(max(len(positives), len(negatives))):
            (pos, pair_id), (neg, _) = positives[i % len(positives)], negatives[i % len(negatives)]
            out.append({"id": pair_id, "shape": "nli", "anchor": anchor, "positive": pos, "negative": neg})
            out.append({"id": f"{pair_id}:reversed", "shape": "nli", "anchor": pos, "positive": anchor, "negative": neg})
    if left_out:
        log(f"{path}: {left_out} premise(s) without both an entailed and a contradicted hypothesis left out")
    if not out:
        raise DataError(path, None, "no premise has both an entailment and a contradiction: no NLI triplets")
    return out
