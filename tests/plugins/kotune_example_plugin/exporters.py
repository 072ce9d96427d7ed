"""An export format of the plug-in's own: ``export.format=npz`` writes every weight of a saved model into
one NumPy archive, with the labels beside it (for a reader without torch)."""
from __future__ import annotations

import json
import os

import numpy as np

import kotune
from kotune.core.atomic_dir import written_whole


@kotune.register_exporter("npz")
class NpzExporter(kotune.Exporter):
    default_dir = "npz"

    def export(self, model_dir: str, out_dir: str, options: dict, finish) -> dict:
        from heads.model.kotune_model import KotuneModel

        model = KotuneModel.load(model_dir)
        res = {"export_dir": out_dir, "native_class": "numpy.lib.npyio.NpzFile", "format": "npz",
               "num_labels": len(model.meta.get("labels") or [])}
        with written_whole(out_dir, "npz-export") as staging:  # the directory appears whole or not at all
            np.savez(os.path.join(staging, "weights.npz"),
                     **{name: value.detach().cpu().numpy() for name, value in model.state_dict().items()})
            with open(os.path.join(staging, "labels.json"), "w", encoding="utf-8") as f:
                json.dump(model.meta.get("labels"), f, ensure_ascii=False)
            finish(res, staging)
        return res

    def usage(self, res: dict, out_dir: str) -> str:
        return f"numpy.load(\"{out_dir}/weights.npz\")"
