"""Metrics of sentence embeddings, as pure functions of plain lists (vectors as lists of floats):

- scored pairs: Spearman and Pearson correlation of the pair's cosine similarity with the gold
  score, sentence-transformers' ``EmbeddingSimilarityEvaluator`` definitions (``scipy.stats``'
  ``spearmanr`` / ``pearsonr`` of the gold scores against the cosines), ×100 as kotune's other
  correlations (tests/test_sentence_embedding.py checks them equal to the evaluator's);
- a query → relevant documents set: recall@k and MRR@10 of ranking every document of the corpus by
  cosine similarity, its ``InformationRetrievalEvaluator`` definitions (ties broken by the
  document's position, as it breaks them by corpus id).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

RECALL_AT = (1, 5, 10)
MRR_AT = 10


def unit_rows(vectors: Sequence[Sequence[float]]) -> np.ndarray:
    """Each row scaled to length 1 (a zero row stays zero)."""
    array = np.asarray(vectors, dtype=np.float64)
    return array / np.maximum(np.linalg.norm(array, axis=-1, keepdims=True), 1e-12)


def paired_cosines(first: Sequence[Sequence[float]], second: Sequence[Sequence[float]]) -> list[float]:
    """cos(first[i], second[i]) for each i."""
    if len(first) != len(second):
        raise ValueError(f"{len(first)} first vectors, {len(second)} second")
    return [float(c) for c in (unit_rows(first) * unit_rows(second)).sum(-1)]


def similarity_scores(cosines: list[float], golds: list[float]) -> dict[str, float]:
    """Spearman and Pearson (×100) of the cosines against the gold scores; NaN where one side is constant."""
    from scipy.stats import spearmanr

    from tasks.metrics import pearson  # KLUE STS's Pearson (scipy's pearsonr ×100), one definition for both tasks

    if len(cosines) != len(golds):
        raise ValueError(f"{len(cosines)} similarities, {len(golds)} gold scores")
    if len(golds) < 2 or len(set(golds)) < 2 or len(set(cosines)) < 2:
        return {"spearman": float("nan"), "pearson": float("nan")}
    return {"spearman": 100.0 * float(spearmanr(golds, cosines)[0]), "pearson": pearson(cosines, golds)}


def retrieval_scores(query_vectors: Sequence[Sequence[float]], document_vectors: Sequence[Sequence[float]],
                     relevant: list[set[int]], recall_at: Sequence[int] = RECALL_AT,
                     mrr_at: int = MRR_AT) -> dict[str, float]:
    """recall@k (the share of a query's relevant documents in its top k, averaged over queries) and
    MRR@``mrr_at`` (1 / rank of the first relevant document within the top ``mrr_at``, else 0), ×100.
    ``relevant[q]``: indices into ``document_vectors`` of query q's relevant documents (never empty)."""
    if len(query_vectors) != len(relevant):
        raise ValueError(f"{len(query_vectors)} queries, {len(relevant)} relevant sets")
    if any(not docs for docs in relevant):
        raise ValueError("a query without relevant documents")
    cosines = unit_rows(query_vectors) @ unit_rows(document_vectors).T
    depth = max([mrr_at, *recall_at])
    recall = {k: 0.0 for k in recall_at}
    reciprocal = 0.0
    for q, docs in enumerate(relevant):
        ranked = np.argsort(-cosines[q], kind="stable")[:depth].tolist()  # ties: the earlier document first
        for k in recall_at:
            recall[k] += sum(1 for d in ranked[:k] if d in docs) / len(docs)
        first = next((rank for rank, d in enumerate(ranked[:mrr_at]) if d in docs), None)
        reciprocal += 0.0 if first is None else 1.0 / (first + 1)
    n = len(relevant)
    out = {f"recall@{k}": 100.0 * recall[k] / n for k in recall_at}
    out[f"mrr@{mrr_at}"] = 100.0 * reciprocal / n
    return out
