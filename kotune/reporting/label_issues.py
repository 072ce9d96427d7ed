"""Label issues from out-of-fold probabilities (cleanlab's confident learning), for
``action=label_issues`` (kotune/actions/label_issues.py reads the runs and writes the files): the
flagged rows, lowest label quality first, and cleanlab's estimate of each class's label noise."""
from __future__ import annotations

import numpy as np

from kotune.core.errors import ConfigError, DataError

FIELDS = ("rank", "id", "text", "text_pair", "given_label", "suggested_label", "label_quality",
          "given_probability", "suggested_probability", "fold")


def find_issues(task, examples: list[dict], records: dict[str, dict], where: str) -> dict:
    ids = [str(ex["id"]) for ex in examples]
    missing = [i for i in ids if i not in records]
    if missing:
        raise ConfigError(f"{where}: {len(missing)} of {len(ids)} training rows have no out-of-fold prediction "
                          f"(e.g. {missing[0]}): the folds do not cover the training file")
    extra = set(records) - set(ids)
    if extra:
        raise ConfigError(f"{where}: {len(extra)} predictions are of rows not in the training file "
                          f"(e.g. {min(extra)}): the training file changed since the runs?")
    labels = list(records[ids[0]]["probabilities"])
    index = {label: j for j, label in enumerate(labels)}
    probs = np.zeros((len(ids), len(labels)))
    for i, row_id in enumerate(ids):
        p = records[row_id]["probabilities"]
        if set(p) != set(labels):
            raise DataError(where, row_id, f"probabilities of labels {sorted(p)}, not {sorted(labels)}")
        probs[i] = [float(p[label]) for label in labels]
    multi = getattr(task, "multi_label", False) or isinstance(examples[0].get("label"), list)
    given = [ex["label"] for ex in examples]
    for row_id, g in zip(ids, given):
        for label in (g if multi else [g]):
            if label not in index:
                raise DataError(where, row_id, f"label '{label}' has no probability (labels: {', '.join(labels)})")
    if multi:
        return _multi_label(examples, records, labels, index, probs, given)
    return _single_label(examples, records, labels, index, probs, given)


def _single_label(examples, records, labels, index, probs, given) -> dict:
    from cleanlab.dataset import rank_classes_by_label_quality
    from cleanlab.filter import find_label_issues
    from cleanlab.rank import get_label_quality_scores

    probs = probs / probs.sum(1, keepdims=True).clip(min=1e-12)
    y = np.array([index[g] for g in given])
    absent = [labels[j] for j in range(len(labels)) if not (y == j).any()]
    if absent:
        raise ConfigError(f"label_issues: no training row is labelled {', '.join(absent)}: cleanlab needs every class")
    flagged = find_label_issues(y, probs, n_jobs=1)
    quality = get_label_quality_scores(y, probs)
    per = rank_classes_by_label_quality(labels=y, pred_probs=probs)
    per_class = {labels[int(r["Class Index"])]: {"n": int((y == r["Class Index"]).sum()),
                                                   "issues": int(r["Label Issues"]),
                                                   "noise": round(float(r["Label Noise"]), 4),
                                                   "quality": round(float(r["Label Quality Score"]), 4)}
                 for _, r in per.iterrows()}
    rows = []
    for i in np.flatnonzero(flagged):
        ex, j = examples[i], int(probs[i].argmax())
        rows.append({"id": str(ex["id"]), "text": ex.get("text"), "text_pair": ex.get("text_pair"),
                     "given_label": given[i], "suggested_label": labels[j],
                     "label_quality": round(float(quality[i]), 6),
                     "given_probability": round(float(probs[i, y[i]]), 6),
                     "suggested_probability": round(float(probs[i, j]), 6),
                     "fold": records[str(ex["id"])].get("fold")})
    return _ranked(rows, len(examples), per_class, "single-label")


def _multi_label(examples, records, labels, index, probs, given) -> dict:
    from cleanlab.multilabel_classification.dataset import (
        rank_classes_by_multilabel_quality,
    )
    from cleanlab.multilabel_classification.filter import find_label_issues
    from cleanlab.multilabel_classification.rank import get_label_quality_scores

    y = [sorted(index[g] for g in gs) for gs in given]
    onehot = np.zeros_like(probs, dtype=int)
    for i, js in enumerate(y):
        onehot[i, js] = 1
    flagged = find_label_issues(y, probs, n_jobs=1)
    quality = get_label_quality_scores(y, probs)
    per = rank_classes_by_multilabel_quality(labels=y, pred_probs=probs)
    per_class = {labels[int(r["Class Index"])]: {"n": int(onehot[:, int(r["Class Index"])].sum()),
                                                   "issues": int(r["Label Issues"]),
                                                   "noise": round(float(r["Label Noise"]), 4),
                                                   "quality": round(float(r["Label Quality Score"]), 4)}
                 for _, r in per.iterrows()}
    rows = []
    for i in np.flatnonzero(flagged):
        ex = examples[i]
        decided = records[str(ex["id"])].get("prediction")  # the fold model's set, at its task.threshold
        suggested = list(decided) if isinstance(decided, list) else [labels[j] for j in range(len(labels))
                                                                     if probs[i, j] >= 0.5]
        rows.append({"id": str(ex["id"]), "text": ex.get("text"), "text_pair": ex.get("text_pair"),
                     "given_label": list(given[i]), "suggested_label": suggested,
                     "label_quality": round(float(quality[i]), 6),
                     "given_probability": None, "suggested_probability": None,
                     "fold": records[str(ex["id"])].get("fold")})
    return _ranked(rows, len(examples), per_class, "multi-label")


def _ranked(rows: list[dict], n: int, per_class: dict, kind: str) -> dict:
    rows.sort(key=lambda r: (r["label_quality"], r["id"]))
    for rank, row in enumerate(rows, 1):
        row["rank"] = rank
    return {"kind": kind, "n_rows": n, "n_issues": len(rows), "share": round(len(rows) / n, 4) if n else 0.0,
            "per_class": per_class, "rows": [{k: row[k] for k in FIELDS} for row in rows]}
