"""Label issues from out-of-fold probabilities (cleanlab's confident learning), for
``action=label_issues`` (kotune/actions/label_issues.py reads the runs and writes the files): the
flagged rows, lowest label quality first, and cleanlab's estimate of each class's label noise.
Token tasks (``cleanlab.token_classification``): a row per flagged sentence, its units in question
with their given and suggested tags, the sentence's quality its lowest unit's self-confidence."""
from __future__ import annotations

import numpy as np

from kotune.core.errors import ConfigError, DataError

FIELDS = ("rank", "id", "text", "text_pair", "given_label", "suggested_label", "label_quality",
          "given_probability", "suggested_probability", "fold")
TOKEN_FIELDS = ("rank", "id", "text", "units", "positions", "tokens", "given_tags", "suggested_tags",
                "token_quality", "label_quality", "fold")


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
    if getattr(task, "head", None) == "token":
        return _token(examples, records, ids, where)
    if not isinstance(records[ids[0]].get("probabilities"), dict):
        raise DataError(where, ids[0], "no per-class 'probabilities' (token predictions given to a "
                                       "classification task?)")
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
    per_class = class_summary(per, labels, lambda j: int((y == j).sum()))
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


def class_summary(per, labels: list[str], rows_of) -> dict:
    """cleanlab's per-class table (rank_classes_by_*quality) as {label: n, issues, noise, quality};
    ``rows_of(j)``: the rows labelled with class j."""
    return {labels[int(r["Class Index"])]: {"n": rows_of(int(r["Class Index"])), "issues": int(r["Label Issues"]),
                                            "noise": round(float(r["Label Noise"]), 4),
                                            "quality": round(float(r["Label Quality Score"]), 4)}
            for _, r in per.iterrows()}


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
    per_class = class_summary(per, labels, lambda j: int(onehot[:, j].sum()))
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


def _token(examples, records, ids, where) -> dict:
    """cleanlab's token_classification on each sentence's units that have probabilities (spaces
    and characters past max_length have none and are left out); the tags are the union of the
    folds' (a fold that never saw a tag gives it probability 0)."""
    from cleanlab.dataset import rank_classes_by_label_quality
    from cleanlab.token_classification.filter import find_label_issues
    from cleanlab.token_classification.rank import get_label_quality_scores

    for row_id in ids:
        if not isinstance(records[row_id].get("unit_probabilities"), dict):
            raise DataError(where, row_id, "no 'unit_probabilities': rerun the folds with task.unit_probabilities=true")
    tags = sorted({t for r in ids for t in records[r]["unit_probabilities"]["tags"]}
                  | {t for ex in examples for t in ex["tags"]})
    index = {t: j for j, t in enumerate(tags)}
    kept, labels, probs = [], [], []  # per sentence used: (example index, its unit positions), ...
    for i, (ex, row_id) in enumerate(zip(examples, ids)):
        unit_probs = records[row_id]["unit_probabilities"]
        if len(unit_probs["units"]) != len(ex["units"]):
            raise DataError(where, row_id, f"{len(unit_probs['units'])} units' probabilities for "
                                           f"{len(ex['units'])} units: the training file changed since the runs?")
        cols = [index[t] for t in unit_probs["tags"]]
        positions = [k for k, p in enumerate(unit_probs["units"]) if p is not None and not ex["units"][k].isspace()]
        if not positions:
            continue
        p = np.zeros((len(positions), len(tags)))
        for n, k in enumerate(positions):
            p[n, cols] = unit_probs["units"][k]
        kept.append((i, positions))
        labels.append(np.array([index[ex["tags"][k]] for k in positions]))
        probs.append(p / p.sum(1, keepdims=True).clip(min=1e-12))
    if not kept:
        raise DataError(where, None, "no unit has probabilities")
    issues = find_label_issues(labels, probs, n_jobs=1)
    sentence_quality, unit_quality = get_label_quality_scores(labels, probs)
    flat_y, flat_p = np.concatenate(labels), np.concatenate(probs)
    per_class = {}
    present = sorted(set(flat_y.tolist()))
    if len(present) > 1:  # cleanlab's per-class noise over every unit, for the tags some unit is given
        cols = np.array(present)
        remap = {j: n for n, j in enumerate(present)}
        sub = flat_p[:, cols]
        sub = sub / sub.sum(1, keepdims=True).clip(min=1e-12)
        per = rank_classes_by_label_quality(labels=np.array([remap[j] for j in flat_y]), pred_probs=sub)
        per_class = {tags[present[int(r["Class Index"])]]: {"n": int((flat_y == present[int(r["Class Index"])]).sum()),
                                                             "issues": int(r["Label Issues"]),
                                                             "noise": round(float(r["Label Noise"]), 4),
                                                             "quality": round(float(r["Label Quality Score"]), 4)}
                     for _, r in per.iterrows()}
    flagged: dict[int, list[int]] = {}
    for s, n in issues:
        flagged.setdefault(int(s), []).append(int(n))
    rows = []
    for s, ns in flagged.items():
        i, positions = kept[s]
        ex, row_id = examples[i], ids[i]
        ns = sorted(ns)
        rows.append({"id": row_id, "text": ex.get("text") or records[row_id].get("text"), "units": list(ex["units"]),
                     "positions": [positions[n] for n in ns], "tokens": [ex["units"][positions[n]] for n in ns],
                     "given_tags": [tags[labels[s][n]] for n in ns],
                     "suggested_tags": [tags[int(probs[s][n].argmax())] for n in ns],
                     "token_quality": [round(float(unit_quality[s][n]), 6) for n in ns],
                     "label_quality": round(float(sentence_quality[s]), 6), "fold": records[row_id].get("fold")})
    out = _ranked(rows, len(examples), per_class, "token", TOKEN_FIELDS)
    out.update(n_units=len(flat_y), n_unit_issues=len(issues), fields=TOKEN_FIELDS)
    return out


def _ranked(rows: list[dict], n: int, per_class: dict, kind: str, fields=FIELDS) -> dict:
    rows.sort(key=lambda r: (r["label_quality"], r["id"]))
    for rank, row in enumerate(rows, 1):
        row["rank"] = rank
    return {"kind": kind, "n_rows": n, "n_issues": len(rows), "share": round(len(rows) / n, 4) if n else 0.0,
            "per_class": per_class, "rows": [{k: row[k] for k in fields} for row in rows]}
