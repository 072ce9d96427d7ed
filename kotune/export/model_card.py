"""The model card written with every export (README.md in the export directory, the Hugging Face
Hub's format: YAML front matter read by ``huggingface_hub.ModelCard``, then markdown), built from
the training run's results.json (metrics, resolved config, versions, data fingerprints), and the
upload of an export directory to the Hub (``export.push_to_hub``)."""
from __future__ import annotations

import json
import os
from typing import Any

from omegaconf import OmegaConf

from kotune.core.backends import Exporter
from kotune.core.errors import ConfigError
from tasks.io import hub_reachable
from kotune.core.redact import mask_credentials



def pipeline_tag(head: str) -> str | None:
    """The Hub's pipeline tag of a head kind (``Head.pipeline_tag``; an older kind through its alias)."""
    from heads.registry import HEADS, resolve

    kind = resolve(head, {})[0]
    return HEADS.get(kind).pipeline_tag if kind in HEADS else None


def training_results(checkpoint: str) -> tuple[dict | None, str | None]:
    """The training run's results.json (beside ``checkpoint=``, or one level up from its model/)
    and its run directory; (None, None) when the model was copied without it."""
    for run_dir in (checkpoint, os.path.dirname(os.path.abspath(checkpoint))):
        path = os.path.join(run_dir, "results.json")
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                results = json.load(f)
            if results.get("status") == "ok" and results.get("action") == "train":
                return results, run_dir
    return None, None


def training_command(run_dir: str | None) -> str | None:
    """``python run.py`` with the run's overrides, as Hydra recorded them (.hydra/overrides.yaml)."""
    path = os.path.join(run_dir, ".hydra", "overrides.yaml") if run_dir else None
    if not path or not os.path.exists(path):
        return None
    overrides = OmegaConf.load(path)
    return " ".join(["python run.py", *(str(o) for o in overrides)])


def _hub_id(name: Any) -> str | None:
    """A Hub repository id (``beomi/kcbert-base``), not a local directory."""
    return str(name) if name and "/" in str(name) and not os.path.exists(os.path.expanduser(str(name))) else None


def _data_rows(data: dict) -> list[str]:
    """A table row per split: the file (or hub dataset) and its fingerprint (sha256 or revision)."""
    rows = []
    for split, src in (data or {}).items():
        where = os.path.basename(str(src["file"])) if src.get("file") else f"{src.get('hub')} ({src.get('name')}, {src.get('split')})"
        rows.append(f"| {split} | `{where}` | `{src.get('sha256') or 'revision ' + str(src.get('revision'))}` |")
    return rows


def onnx_usage(export: dict) -> list[str]:
    """The card's "Use" section for ``export.format=onnx`` (kotune/export/onnx.py)."""
    where = export["export_dir"]
    return ["```bash", f"python run.py action=predict checkpoint={where} data.predict_file=FILE",
            f"python run.py action=serve checkpoint={where}   # POST /predict on 127.0.0.1:8000", "```",
            f"or onnxruntime directly: `onnxruntime.InferenceSession(\"{where}/{export['model_file']}\")` with the "
            "tokenizer of this directory (inputs: input_ids, attention_mask[, token_type_ids])."]


def sentence_transformers_usage(export: dict) -> list[str]:
    """The card's "Use" section for ``export.format=sentence_transformers`` (kotune/embeddings/export.py)."""
    return ["```python", "from sentence_transformers import SentenceTransformer", "",
            f"embeddings = SentenceTransformer(\"{export['export_dir']}\").encode([\"문장 하나\", \"문장 둘\"])", "```",
            f"{export.get('dim')}-dimensional vectors: layers {export.get('layers')}, {export.get('pooling')} pooling "
            "(in 1_Pooling/config.json and the modules before it)."]


def native_usage(export: dict) -> list[str]:
    """The card's "Use" section for the native transformers class (kotune/export/native.py)."""
    where = export["export_dir"]
    if export.get("pipeline"):
        return ["```python", "import transformers",
                f"pipe = transformers.pipeline(\"{export['pipeline']}\", model=\"{where}\")", "```"]
    return ["```python", "import transformers",
            f"model = transformers.{export['native_class']}.from_pretrained(\"{where}\")", "```"]


def card_text(export: dict, meta: dict, head: str, results: dict | None, command: str | None,
              license_id: str, version: str | None, name: str, usage: list[str], library: str | None) -> str:
    """README.md: the Hub's front matter (ModelCardData) and a body for people; ``usage`` and ``library``
    are the export format's (``Exporter.card_usage``, ``Exporter.library``: kotune/core/backends.py)."""
    from huggingface_hub import EvalResult, ModelCardData

    config = (results or {}).get("config") or {}
    task = str(meta.get("task") or (results or {}).get("task") or "kotune")
    metrics = (results or {}).get("metrics") or {}
    data = (results or {}).get("data") or {}
    model_cfg = config.get("model") or {}
    base = _hub_id(model_cfg.get("name_or_path")) if model_cfg.get("init") == "pretrained" else None
    datasets = sorted({src["hub"] for src in data.values() if src.get("hub")})
    onnx = export.get("format") == "onnx"
    split = data.get("validation") or {}
    dataset = split.get("hub") or os.path.basename(str(split.get("file") or "validation"))
    card = ModelCardData(
        language="ko", license=license_id,
        library_name=library,
        tags=["kotune", task, head, *(["onnx"] if onnx else []), *(["int8"] if export.get("model_file") == "model_int8.onnx" else [])],
        base_model=base, datasets=datasets or None, metrics=sorted(metrics) or None, pipeline_tag=pipeline_tag(head),
        model_name=name, eval_results=[
            EvalResult(task_type=pipeline_tag(head) or "other", dataset_type=str(dataset), dataset_name=str(dataset),
                       dataset_split="validation", metric_type=k, metric_value=float(v))
            for k, v in sorted(metrics.items()) if isinstance(v, (int, float))] or None)
    labels = meta.get("labels") or []
    lines = [f"# {name}", "",
             f"A Korean {task} model ({head} head" + (f", `{export['native_class']}`" if export.get("native_class") else "")
             + f") trained with kotune"
             f"{' ' + version if version else ''}" + (f" from `{model_cfg.get('name_or_path')}`" if model_cfg.get("name_or_path") else "")
             + (" (exported to ONNX" + (", int8 weights)" if "int8" in card.tags else ")") if onnx else "") + ".", ""]
    if export.get("input_note"):
        lines += [f"**Input:** {export['input_note']}", ""]
    lines += ["## Use", "", *usage, ""]
    if labels:
        lines += ["## Labels", "", "| id | label |", "| --- | --- |", *(f"| {i} | {lab} |" for i, lab in enumerate(labels)), ""]
    lines += ["## Results", ""]
    if metrics:
        main = (results or {}).get("main_metric")
        lines += [f"On the validation split ({dataset}, {results.get('n_eval')} examples; * main metric):", "",
                  "| metric | value |", "| --- | --- |",
                  *(f"| {k}{' *' if k == main else ''} | {v:.2f} |" for k, v in sorted(metrics.items())
                    if isinstance(v, (int, float))), ""]
    else:
        lines += ["No results.json beside the checkpoint: metrics, command and data are unknown.", ""]
    if results:
        lines += ["## Training", "", "```bash", command or "# not recorded (the run was not started from the command line)",
                  "```", "", "<details><summary>resolved config</summary>", "", "```yaml",
                  OmegaConf.to_yaml(OmegaConf.create(config)).rstrip(), "```", "", "</details>", "",
                  "## Data", "", "| split | source | sha256 / revision |", "| --- | --- | --- |", *_data_rows(data), "",
                  "## Versions", "", "| package | trained with | exported with |", "| --- | --- | --- |",
                  *(f"| {k} | {v} | {(export.get('versions') or {}).get(k, '')} |" for k, v in results.get("versions", {}).items()), ""]
    if onnx:
        lines += ["## Files", "", *(f"- `{f}` ({mb} MB)" for f, mb in export.get("onnx_mb", {}).items()), ""]
    return f"---\n{card.to_yaml()}\n---\n\n" + "\n".join(lines)


def write_model_card(export: dict, meta: dict, head: str, checkpoint: str, license_id: str,
                     repo_id: str | None = None, folder: str | None = None, exporter: Exporter | None = None) -> str:
    """README.md in the export directory (``folder``: where it is being written, before it takes its
    name); the model's name is the Hub repository's when pushed. ``exporter``: the format that wrote it,
    whose card usage and library the card shows (None: a plain code block naming the directory, no library)."""
    from kotune.cli.job import versions

    results, run_dir = training_results(checkpoint)
    export = {**export, "versions": versions()}
    name = repo_id.split("/")[-1] if repo_id else f"kotune-{meta.get('model') or 'model'}-{meta.get('task') or head}"
    exporter = exporter or Exporter()
    text = card_text(export, meta, head, results, training_command(run_dir), license_id, versions().get("kotune"), name,
                     exporter.card_usage(export, export["export_dir"]), exporter.library)
    path = os.path.join(folder or export["export_dir"], "README.md")
    with open(path, "w", encoding="utf-8") as f:
        f.write(masked_card(text))
    return path


def masked_card(text: str) -> str:
    """The card with every secret met masked in its body (the training command may name a storage
    URL; the card is pushed), its YAML front matter as built: structured fields that hold no secret,
    and which a mask would break (a value starting ``***`` is a YAML alias, so a secret piece such as
    "question" in ``pipeline_tag: question-answering`` left the card unreadable and its task unknown)."""
    front, sep, body = text.partition("\n---\n\n")
    if not (text.startswith("---\n") and sep):
        return mask_credentials(text)
    return front + sep + mask_credentials(body)


def push_to_hub(folder: str, repo_id: str, private: bool = False) -> str:
    """Upload an export directory (model, tokenizer, model card) to ``repo_id`` on the Hub."""
    if not hub_reachable():
        raise ConfigError(f"export.push_to_hub={repo_id}: the Hugging Face hub is unreachable; the export is in "
                          f"{folder} (upload it later: hf upload {repo_id} {folder})")
    from huggingface_hub import HfApi

    api = HfApi()
    api.create_repo(repo_id, private=private, exist_ok=True)
    return str(api.upload_folder(repo_id=repo_id, folder_path=folder, commit_message="kotune export"))
