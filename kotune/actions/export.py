"""``action=export checkpoint=RUN``: the model in the registered export format ``export.format`` names
(kotune/core/backends.py's Exporter; a plug-in adds one with ``kotune.register_exporter``): by default as
its architecture's native transformers class in ``export.dir`` (default: beside the checkpoint, RUN/hf;
kotune/export/native.py, a one-line refusal for a head with no exact native equivalent), or with
``export.format=onnx`` as an ONNX Runtime directory (default: RUN/onnx; ``export.quantize=int8`` adds onnxruntime's dynamic
int8 model; kotune/export/onnx.py).
Every export gets a model card (README.md, kotune/export/model_card.py); ``export.push_to_hub=USER/NAME``
uploads the directory. The directory appears whole or not at all, with ``kotune_manifest.json``
(kotune/core/atomic_dir.py); one that exists and is not empty is refused unless ``export.overwrite=true``."""
from __future__ import annotations

import os

from omegaconf import DictConfig

from kotune.core.backends import SHARED_OPTIONS, Exporter
from kotune.loading.checkpoint import checkpoint_model_dir, read_spec
from kotune.export.model_card import push_to_hub, write_model_card
from kotune.core.errors import ConfigError
from kotune.core.log import log
from kotune.core.registry import EXPORTERS


def exporter_for(cfg_export) -> Exporter:
    """The registered format ``export.format`` names (kotune/core/backends.py's Exporter), after the one-line
    refusal of an unknown format or of an option only other formats read (``export.quantize`` without
    ``export.format=onnx``)."""
    import kotune.export.native  # noqa: F401  (each module registers its format: kotune.register_exporter)
    import kotune.export.onnx  # noqa: F401
    import kotune.embeddings.export  # noqa: F401  (export.format=sentence_transformers)

    fmt = str(cfg_export.get("format") or "native")
    if fmt not in EXPORTERS:
        raise ConfigError(f"export.format must be one of {', '.join(EXPORTERS)}, got '{fmt}'")
    exporter = EXPORTERS.get(fmt)()
    for key in cfg_export:
        value = cfg_export.get(key)
        if value is None or key in SHARED_OPTIONS or key in exporter.options:
            continue
        owners = [name for name, other in EXPORTERS.items() if key in other.options]
        if owners:
            raise ConfigError(f"export.{key}={value} {EXPORTERS.get(owners[0]).options[key]}: "
                              f"add export.format={owners[0]}")
    return exporter


def run(cfg: DictConfig, run_dir: str) -> dict:
    if not cfg.get("checkpoint"):
        raise ConfigError("action=export needs checkpoint=RUN_DIR (a directory written by action=train)")
    exporter = exporter_for(cfg.export)
    model_dir = checkpoint_model_dir(cfg.checkpoint)
    out_dir = str(cfg.export.get("dir") or default_export_dir(model_dir, exporter))
    check_destination(out_dir, model_dir, bool(cfg.export.get("overwrite")))
    saved = read_spec(model_dir)

    def finish(res: dict, folder: str) -> None:  # the card goes in before the export appears whole
        summary(exporter, res, out_dir)
        card = write_model_card(res, saved["meta"], saved["head"], str(cfg.checkpoint),
                                str(cfg.export.get("license") or "unknown"), cfg.export.get("push_to_hub"), folder=folder,
                                exporter=exporter)
        res["model_card"] = os.path.join(out_dir, os.path.basename(card))

    res = summary(exporter, exporter.export(model_dir, out_dir, {k: cfg.export.get(k) for k in exporter.options}, finish),
                  out_dir)
    what = res.get("native_class") or f"the model as {res['format']}"  # a format with no class of its own
    log(f"exported {what} to {out_dir}: {exporter.usage(res, out_dir)}")
    if cfg.export.get("push_to_hub"):
        res["pushed"] = push_to_hub(out_dir, str(cfg.export.push_to_hub), bool(cfg.export.get("private")))
        log(f"pushed {out_dir} to {res['pushed']}")
    return {**res, "checkpoint": cfg.checkpoint, "metrics": {}}


def summary(exporter: Exporter, res, out_dir: str) -> dict:
    """An exporter's summary (kotune/core/backends.py's contract) with what kotune knows filled in:
    ``export_dir`` and ``format``; anything but a dict is one line naming the exporter."""
    if not isinstance(res, dict):
        raise ConfigError(f"export.format={exporter.registered_name}: {type(exporter).__module__}."
                          f"{type(exporter).__qualname__}.export returned {type(res).__name__}, not the summary dict "
                          "results.json keeps (docs/development/plugins.md)")
    res.setdefault("export_dir", out_dir)
    res.setdefault("format", exporter.registered_name)
    return res


def default_export_dir(model_dir: str, exporter: Exporter) -> str:
    """Where an export goes without ``export.dir``: beside the checkpoint, ``RUN/<the format's folder>``
    (RUN/hf, RUN/onnx) for ``checkpoint=RUN`` or ``RUN/model``, so the next command can name it
    (``action=serve checkpoint=RUN/onnx``); a model folder of another name gets a sibling, NAME-onnx."""
    model_dir = os.path.normpath(model_dir)
    if os.path.basename(model_dir) == "model":
        return os.path.join(os.path.dirname(model_dir), exporter.default_dir)
    return f"{model_dir}-{exporter.default_dir}"


def check_destination(out_dir: str, model_dir: str, overwrite: bool) -> None:
    """An export directory that exists and is not empty is refused unless ``export.overwrite=true``
    (the new export then replaces it whole: no file of the old one stays); one that holds the
    checkpoint itself is refused always."""
    if not os.path.lexists(out_dir):
        return
    out, model = os.path.realpath(out_dir), os.path.realpath(model_dir)
    if os.path.commonpath([out, model]) == out:
        raise ConfigError(f"export.dir={out_dir} holds the checkpoint {model_dir}: an export replaces its directory "
                          "whole; choose another export.dir")
    if not os.path.isdir(out_dir):
        raise ConfigError(f"export.dir={out_dir} is a file, not a directory; choose another export.dir")
    if os.listdir(out_dir) and not overwrite:
        raise ConfigError(f"export.dir={out_dir} exists and is not empty: set export.overwrite=true to replace it "
                          "whole (its files are removed), or choose another export.dir")
