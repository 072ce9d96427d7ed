"""What kotune accepts in a saved model's ``kotune.json`` and an ONNX export's ``kotune_export.json``:
each key with its type, checked before any value is used. A checkpoint is data, never code: a
value is a plain JSON scalar or a list of them; a name (task, model, mode, option, column role) is a
plain name, never a path; a file name has no separator; a string holds no ``${`` (OmegaConf would
resolve it) and no control character. Weights are read from safetensors only: a pickle-format
file (``*.bin``, ``*.pt``, ...) in the model directory is refused rather than left for a loader
to unpickle. Anything else is one :class:`ArtifactError` line naming the file and the key.

The files themselves are believed no further than their bytes: every file and folder resolves
inside the directory the user named (:func:`check_tree`: a symbolic link is followed only where it
stays inside; one leading out is refused, for a checkpoint is its own files, never ``/etc/passwd``
or another model's weights), each ``config.json`` has probabilities for dropouts and positive
sizes, each ``*.safetensors`` a sound header whose shapes fit its bytes (:func:`check_weights`).
Before a loader builds anything, :func:`check_sizes` holds every size ``kotune.json`` gives against
the head's weights as their header says (the head measured on torch's ``meta`` device, which
allocates nothing) and against the encoder's positions.

kotune/loading/checkpoint.py adds what only the config knows: that the task, model and mode are presets and
that each task option is one the task saves, of its preset's type."""
from __future__ import annotations

import inspect
import json
import math
import os
import re
import stat
from typing import Any, Callable

from kotune.core.errors import ConfigError

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")  # a preset, option or role name: no '.', '/', '..'
FILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")  # one file in the directory itself
IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
MODES = ("finetune", "frozen", "lora")
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt", ".joblib")
WEIGHT_DIRS = (".", "encoder", "adapter")  # where a saved model keeps weights (heads/model/kotune_model.py, heads/model/lora.py)
CONFIG_FILES = ("config.json", "tokenizer_config.json", "adapter_config.json", "preprocessor_config.json")
MAX_TEXT = 4096
CODE_KEYS = {"trust_remote_code", "auto_map", "code_revision"}  # how transformers is told to import a model's code


class ArtifactError(ConfigError):
    """A checkpoint or export that kotune will not read: the file, the key and what it may be."""


def shown(value: Any) -> str:
    text = repr(value)  # quoted, newlines escaped: the message stays one line
    return text if len(text) <= 80 else text[:77] + "..."


def plain_text(value: Any) -> bool:
    return (isinstance(value, str) and len(value) <= MAX_TEXT and "${" not in value
            and all(c.isprintable() or c == "\t" for c in value))


def number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def scalar(value: Any) -> bool:
    """None, a bool, a finite-or-not number or a plain string."""
    return value is None or isinstance(value, bool) or number(value) or plain_text(value)


def plain_json(value: Any, depth: int = 0) -> bool:
    """Scalars, and lists and dicts (plain names as keys) of them, four levels deep at most."""
    if scalar(value):
        return True
    if depth >= 4:
        return False
    if isinstance(value, list):
        return all(plain_json(v, depth + 1) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and NAME.fullmatch(k) and plain_json(v, depth + 1) for k, v in value.items())
    return False


def name(value: Any) -> bool:
    return isinstance(value, str) and NAME.fullmatch(value) is not None


def file_name(value: Any) -> bool:
    return isinstance(value, str) and FILE_NAME.fullmatch(value) is not None and ".." not in value


def list_of(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda value: isinstance(value, list) and all(check(v) for v in value)


def optional(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda value: value is None or check(value)


def integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def option_value(value: Any) -> bool:
    """A saved task option: a scalar, or a list of scalars (multi-label thresholds, one per label)."""
    return scalar(value) or list_of(scalar)(value)


def column(value: Any) -> bool:
    """A column: a name, an index (CoNLL layouts) or several names (multi-label's label columns)."""
    return value is None or plain_text(value) or integer(value) or list_of(plain_text)(value)


# key → (check, what it may be)
META = {
    "task": (name, "a task preset's name (letters, digits, '_', '-')"),
    "model": (name, "a plain model name (letters, digits, '_', '-')"),
    "labels": (optional(list_of(lambda v: isinstance(v, str) and len(v) <= MAX_TEXT)), "a list of label names"),
    "max_length": (lambda v: integer(v) and 0 < v <= 1_000_000, "a positive integer"),
    "token_type_ids": (lambda v: isinstance(v, bool), "true or false"),
    "task_options": (lambda v: isinstance(v, dict), "a mapping of task options"),
    "columns": (optional(lambda v: isinstance(v, dict)), "a mapping of column roles"),
    # the module a plug-in's task came from (kotune/plugins.py): compared with the loaded ones, never imported
    "plugin": (lambda v: isinstance(v, str) and len(v) <= 200 and re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", v)
               is not None, "a dotted module name"),
    # train.calibrate (kotune/calibration/fit.py): what was folded into the head, for the record; never read
    "calibration": (lambda v: isinstance(v, dict), "a mapping (method, temperature, per-label scaling)"),
}
LORA = {
    "r": (integer, "an integer"), "alpha": (number, "a number"), "dropout": (number, "a number"),
    "target_modules": (lambda v: v is None or name(v) or list_of(lambda t: plain_text(t) and t != "")(v),
                       "null, a module name or a list of them"),
    "token_rows": (optional(list_of(integer)), "a list of integers"),
    "vocab_size": (integer, "an integer"),
    "base": (lambda v: isinstance(v, dict), "the base encoder's record"),
}
LORA_BASE = {
    "model": (lambda v: isinstance(v, dict), "the base encoder's model options"),
    "seed": (integer, "an integer"), "vocab_size": (integer, "an integer"),
    "pad_token_id": (optional(integer), "an integer or null"),
    "digest": (lambda v: isinstance(v, str) and re.fullmatch(r"[0-9a-f]{8,128}", v) is not None, "a hex digest"),
}
MANIFEST = (lambda v: v is None or isinstance(v, bool) or file_name(v), "the manifest's file name")
MODEL_SPEC = {
    "head": (name, "a head kind"),
    "head_kwargs": (lambda v: isinstance(v, dict), "the head's arguments"),
    "frozen": (lambda v: isinstance(v, bool), "true or false"),
    "mode": (lambda v: v in MODES, f"a mode ({', '.join(MODES)})"),
    "lora": (optional(lambda v: isinstance(v, dict)), "null or the LoRA settings"),
    "meta": (lambda v: isinstance(v, dict), "the task's record"),
    "format": (integer, "an integer"),
    "layers": (lambda v: plain_text(v) or integer(v) or list_of(integer)(v), "the layer choice"),
    "indices": (list_of(integer), "a list of layer indices"),
    "scalar_mix": (lambda v: isinstance(v, dict) and set(v) <= {"weights", "gamma"}
                   and list_of(number)(v.get("weights", [])) and number(v.get("gamma", 0.0)), "the scalar mix"),
    "manifest": MANIFEST,
}
EXPORT_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
EXPORT_SPEC = {
    "format": (lambda v: v == "onnx", "'onnx'"),
    "head": (name, "a head kind"),
    "meta": (lambda v: isinstance(v, dict), "the task's record"),
    "inputs": (list_of(lambda v: v in EXPORT_INPUTS), f"a list of {', '.join(EXPORT_INPUTS)}"),
    "outputs": (list_of(name), "a list of output names"),
    "files": (lambda v: isinstance(v, list) and v and all(file_name(f) for f in v), "a list of file names"),
    "model_file": (file_name, "a file name"),
    "opset": (integer, "an integer"),
    "exporter": (plain_text, "a plain string"),
    "native_class": (lambda v: isinstance(v, str) and IDENTIFIER.fullmatch(v) is not None, "a class name"),
    "manifest": MANIFEST,
}


def keys_in(value: Any) -> list[str]:
    """Every dict key at any depth of ``value``."""
    if isinstance(value, dict):
        return [k for k, v in value.items() for k in (k, *keys_in(v))]
    if isinstance(value, list):
        return [k for v in value for k in keys_in(v)]
    return []


def parse(text: str, where: str) -> Any:
    """A spec file's text as JSON, or one line saying it is not JSON."""
    try:
        return json.loads(text)
    except ValueError as e:
        raise ArtifactError(f"{where}: not a JSON file kotune wrote ({str(e).splitlines()[0]})") from None


def check_keys(node: Any, schema: dict, where: str, prefix: str = "", required: tuple[str, ...] = ()) -> dict:
    """``node`` as ``schema`` says: a dict with no other keys, each value passing its check."""
    if not isinstance(node, dict):
        raise ArtifactError(f"{where}: {prefix.rstrip('.') or 'the file'} is {type(node).__name__}, not a JSON object")
    for key in node:
        if key not in schema:
            raise ArtifactError(f"{where}: {prefix}{shown(key)[1:-1] if isinstance(key, str) else shown(key)} is not "
                                f"a key kotune writes (known: {', '.join(schema)})")
    for key in required:
        if key not in node:
            raise ArtifactError(f"{where}: {prefix}{key} is missing")
    for key, value in node.items():
        check, what = schema[key]
        if not check(value):
            raise ArtifactError(f"{where}: {prefix}{key}={shown(value)} is not {what}")
    return node


def check_meta(meta: dict, where: str) -> None:
    check_keys(meta, META, where, "meta.")  # a model built in Python may have no task record
    for option, value in (meta.get("task_options") or {}).items():
        if not name(option):
            raise ArtifactError(f"{where}: meta.task_options has the key {shown(option)}, not a task option's name")
        if not option_value(value):
            raise ArtifactError(f"{where}: meta.task_options.{option}={shown(value)} is not a plain value "
                                "(a number, true/false, null, a string without '${' or control characters, or a list of them)")
    for role, value in (meta.get("columns") or {}).items():
        if not name(role):
            raise ArtifactError(f"{where}: meta.columns has the key {shown(role)}, not a column role")
        if not column(value):
            raise ArtifactError(f"{where}: meta.columns.{role}={shown(value)} is not a column name, index or list of names")


def check_head(spec: dict, where: str, registry: bool) -> None:
    """The head kind and its arguments: with ``registry``, a registered kind and arguments of its
    class (what a loader checks before it builds anything); without (the config side, before Hydra
    composes, which never reads them), plain names and values, and torch stays unloaded."""
    kwargs = spec.get("head_kwargs") or {}
    accepted = None
    if registry:
        from heads.registry import HEADS, aliases

        kind = spec["head"] if spec["head"] in HEADS else aliases().get(spec["head"], (None,))[0]
        if kind is None:
            raise ArtifactError(f"{where}: head={shown(spec['head'])} is not a head kind (known: {', '.join(HEADS)})")
        accepted = inspect.signature(HEADS.get(kind)).parameters
    for key, value in kwargs.items():
        if not name(key) or (accepted is not None and key not in accepted) or key in ("hidden_size", "init_std"):
            raise ArtifactError(f"{where}: head_kwargs.{shown(key)[1:-1]} is not an argument of the "
                                f"{spec['head']} head")  # hidden_size, init_std: the encoder's, never saved
        if not plain_json(value):
            raise ArtifactError(f"{where}: head_kwargs.{key}={shown(value)} is not a plain value")
    if kwargs.get("dropout") is not None and not probability(kwargs["dropout"]):  # nn.Dropout's own error otherwise
        raise ArtifactError(f"{where}: head_kwargs.dropout={shown(kwargs['dropout'])} is not a probability (0 to 1)")


def check_model_spec(spec: Any, where: str, registry: bool = True) -> dict:
    """A saved model's ``kotune.json`` (heads/model/kotune_model.py writes it), or one line naming the key;
    ``registry``: see :func:`check_head`."""
    check_keys(spec, MODEL_SPEC, where, required=("head", "meta"))
    check_meta(spec["meta"], where)
    check_head(spec, where, registry)
    if spec.get("lora"):
        check_keys(spec["lora"], LORA, where, "lora.", required=("base", "vocab_size"))
        base = check_keys(spec["lora"]["base"], LORA_BASE, where, "lora.base.", required=("model", "seed", "vocab_size"))
        for key, value in base["model"].items():
            if not name(key) or not plain_json(value) or CODE_KEYS & set(keys_in(value)) or key in CODE_KEYS:
                raise ArtifactError(f"{where}: lora.base.model.{shown(key)[1:-1]}={shown(value)} is not a plain "
                                    "model option")
    return spec


def check_export_spec(spec: Any, where: str, registry: bool = True) -> dict:
    """An ONNX export's ``kotune_export.json`` (kotune/export/onnx.py writes it), or one line naming the key;
    ``registry``: see :func:`check_head`."""
    check_keys(spec, EXPORT_SPEC, where, required=("format", "head", "meta", "files", "model_file"))
    check_meta(spec["meta"], where)
    check_head(spec, where, registry)
    if spec["model_file"] not in spec["files"]:
        raise ArtifactError(f"{where}: model_file={shown(spec['model_file'])} is not one of its files "
                            f"({', '.join(spec['files'])})")
    return spec


def check_files(directory: str, where: str) -> None:
    """A saved model's or export's files are data: every one inside ``directory``
    (:func:`check_tree`), weights in safetensors only (a pickle-format file where weights are kept,
    the directory, ``encoder/`` or ``adapter/``, is refused, never handed to a loader that might
    unpickle it), no Python file, no ``auto_map``
    in a config (transformers' way to name code to import, which it would offer to run) and a
    model config's dropouts and sizes in range (:func:`check_model_config`)."""
    check_tree(directory)
    for sub in WEIGHT_DIRS:
        folder = os.path.normpath(os.path.join(directory, sub))
        if not os.path.isdir(folder):
            continue
        for entry in sorted(os.listdir(folder)):
            path = os.path.join(folder, entry)
            if entry.lower().endswith(PICKLE_SUFFIXES):
                raise ArtifactError(f"{where}: {path} is a pickle-format file; kotune reads weights from "
                                    "safetensors only (loading a checkpoint never runs code)")
            if entry.lower().endswith((".py", ".pyc")):
                raise ArtifactError(f"{where}: {path} is Python code; a checkpoint holds none (loading one never "
                                    "runs code)")
            if entry in CONFIG_FILES and os.path.isfile(path):
                with open(path, encoding="utf-8") as f:
                    config = parse(f.read(), path)
                if isinstance(config, dict) and "auto_map" in config:
                    raise ArtifactError(f"{where}: {path} has auto_map={shown(config['auto_map'])}, code for "
                                        "transformers to import; a checkpoint holds none (loading one never runs code)")
                if entry == "config.json":
                    check_model_config(config, path)


# ---- the files themselves ----------------------------------------------------------------------------
def within(root: str, path: str) -> bool:
    """Whether ``path`` (resolved) is ``root`` (resolved) or lies under it."""
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def check_inside(root: str, path: str) -> None:
    """``path`` (a folder on the way, as a run directory's ``model/``) resolves inside ``root``."""
    target = os.path.realpath(path)
    if not within(os.path.realpath(root), target):
        raise ArtifactError(f"{path} is a symbolic link to {target}, outside {root}: kotune reads a checkpoint's "
                            "files from inside it only (copy the files in instead of linking them)")


def check_tree(root: str) -> list[str]:
    """Every file under ``root``, each checked: a directory or a regular file, and a symbolic link
    only where it resolves inside ``root`` (a linked file or folder leading out, anywhere on the way,
    is refused before anything opens it). Returns the files' paths."""
    files = []
    for folder, dirs, names in os.walk(root):  # links to folders are entries here, checked, never walked
        for entry in sorted(dirs) + sorted(names):
            path = os.path.join(folder, entry)
            if os.path.islink(path):
                check_inside(root, path)
            try:
                mode = os.stat(path).st_mode
            except OSError:
                raise ArtifactError(f"{path} is a symbolic link to {os.path.realpath(path)}, which is missing") from None
            if stat.S_ISREG(mode):
                files.append(path)
            elif not stat.S_ISDIR(mode):
                raise ArtifactError(f"{path} is not a regular file (a pipe, device or socket); a checkpoint holds "
                                    "files only")
    return files


def check_weights(directory: str) -> None:
    """Every ``*.safetensors`` under ``directory`` has a sound header (:func:`safetensors_shapes`);
    after the manifest's check, which names a truncated file better."""
    for path in check_tree(directory):
        if path.endswith(".safetensors"):
            safetensors_shapes(path)


# safetensors' dtypes and their sizes in bytes (its format's spec); a header is at most 100 MB, as its reader allows
DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
               "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}
HEADER_LIMIT = 100 * 1024 ** 2


def safetensors_shapes(path: str) -> dict[str, tuple[int, ...]]:
    """Each tensor's shape, from the file's header only (8 bytes of little-endian length, then that
    much JSON: no tensor is read): every entry a known dtype, a shape and offsets inside the file
    that hold exactly its values. Anything else (a pickle under this name) is one line."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        length = int.from_bytes(f.read(8).ljust(8, b"\xff"), "little")
        if size < 8 or length > min(size - 8, HEADER_LIMIT):
            raise ArtifactError(f"{path}: not a safetensors file (its first 8 bytes give a header of {length} bytes, "
                                f"the file has {size})")
        text = f.read(length)
    try:
        header = json.loads(text.decode("utf-8"))
    except ValueError as e:
        raise ArtifactError(f"{path}: not a safetensors file (its header is not JSON: {str(e).splitlines()[0]})") from None
    if not isinstance(header, dict):
        raise ArtifactError(f"{path}: not a safetensors file (its header is {type(header).__name__}, not an object)")
    data = size - 8 - length
    shapes = {}
    for key, entry in header.items():
        if key == "__metadata__":
            continue
        if not (isinstance(entry, dict) and entry.get("dtype") in DTYPE_BYTES and list_of(integer)(entry.get("shape"))
                and all(d >= 0 for d in entry["shape"]) and list_of(integer)(entry.get("data_offsets"))
                and len(entry["data_offsets"]) == 2 and 0 <= entry["data_offsets"][0] <= entry["data_offsets"][1] <= data):
            raise ArtifactError(f"{path}: {shown(key)[1:-1]} is not a tensor entry (a known dtype, a shape, offsets "
                                f"inside the file): {shown(entry)}")
        start, end = entry["data_offsets"]
        need = DTYPE_BYTES[entry["dtype"]] * math.prod(entry["shape"])
        if need != end - start:
            raise ArtifactError(f"{path}: {key}'s shape {entry['shape']} of {entry['dtype']} needs {need} bytes, its "
                                f"offsets give {end - start}")
        shapes[key] = tuple(entry["shape"])
    return shapes


# sizes a model config gives (transformers builds each layer from them): positive integers
CONFIG_SIZES = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size",
                "max_position_embeddings", "type_vocab_size", "embedding_size", "num_labels")


def probability(value: Any) -> bool:
    return number(value) and 0 <= value <= 1  # NaN fails both comparisons


def check_model_config(config: Any, path: str) -> None:
    """A model's ``config.json`` (an encoder's, a native or ONNX export's): each dropout a
    probability, each size a positive integer; what transformers would otherwise fail on deep in a
    layer's constructor."""
    if not isinstance(config, dict):
        raise ArtifactError(f"{path}: {type(config).__name__}, not a JSON object")
    for key, value in config.items():
        if "dropout" in key and value is not None and not probability(value):
            raise ArtifactError(f"{path}: {key}={shown(value)} is not a probability (0 to 1)")
        if key in CONFIG_SIZES and not (integer(value) and value > 0):
            raise ArtifactError(f"{path}: {key}={shown(value)} is not a positive integer")


def check_length(max_length: Any, limit: int, where: str, source: str) -> None:
    """``meta.max_length`` within the encoder's positions (``source`` says where the limit is read)."""
    if integer(max_length) and max_length > limit:
        raise ArtifactError(f"{where}: meta.max_length={max_length} is more than the encoder's {limit} positions "
                            f"({source}: max_position_embeddings)")


BUFFERS = ("position_ids", "token_type_ids")  # buffers a config rebuilds, absent from some saves
LEGACY = {"gamma": "weight", "beta": "bias"}  # LayerNorm names of older saves, which transformers renames on load


def check_against_weights(build: Callable[[], Any], folder: str, what: str) -> None:
    """The module ``build()`` makes (a model from the folder's config), built on torch's ``meta``
    device (no memory), against the headers of the folder's ``*.safetensors``: every weight it has is
    in them and of their shape. A config that asks for more layers or a larger vocabulary than the
    weights hold would otherwise be allocated, then filled at random, before any check."""
    import torch

    saved, where = {}, {}
    for entry in sorted(os.listdir(folder)):
        if entry.endswith(".safetensors"):
            for key, shape in safetensors_shapes(os.path.join(folder, entry)).items():
                head, _, last = key.rpartition(".")
                key = f"{head}.{LEGACY.get(last, last)}" if head else key
                saved[key], where[key] = shape, os.path.join(folder, entry)
    with torch.device("meta"):
        expected = {k: tuple(v.shape) for k, v in build().state_dict().items()}
    files = ", ".join(sorted(set(where.values()))) or os.path.join(folder, "*.safetensors")
    missing = sorted(k for k in expected if k not in saved and not k.endswith(BUFFERS))
    if missing:
        raise ArtifactError(f"{files}: {what}: missing {', '.join(missing[:3])}"
                            + (f" and {len(missing) - 3} more" if len(missing) > 3 else ""))
    for key, shape in expected.items():
        if key in saved and saved[key] != shape:
            raise ArtifactError(f"{where[key]}: {what}: {key} is {list(saved[key])}, its config makes it {list(shape)}")


def check_outputs(meta: dict, outputs: list, graph: str, where: str) -> None:
    """An ONNX graph's first output (onnxruntime's ``get_outputs()``) against ``meta.labels``: a
    fixed last axis holds one logit per label (a span head's outputs end in the text's length)."""
    labels = meta.get("labels")
    shape = list(getattr(outputs[0], "shape", None) or []) if outputs else []
    if labels and len(shape) >= 2 and integer(shape[-1]) and shape[-1] != len(labels):
        raise ArtifactError(f"{where}: meta.labels has {len(labels)} name{'s' if len(labels) != 1 else ''}, but "
                            f"{graph} gives {shape[-1]} logits (its output {outputs[0].name}: {shape})")


def check_sizes(directory: str, spec: dict, config: Any, source: str = "encoder/config.json") -> None:
    """Every size a saved model's ``kotune.json`` gives, before the model is built: the head its
    arguments make (built on torch's ``meta`` device: no memory) against ``head.safetensors``'
    header, shape by shape; the label names against the head's logits; ``meta.max_length`` against
    ``config``'s positions (``source``: where that config was read)."""
    import torch

    from heads.model.encoder import position_limit
    from heads.model.layers import parse_layers
    from heads.native import native_arguments
    from heads.registry import HEADS, resolve

    where = os.path.join(directory, "kotune.json")
    meta = spec["meta"]
    check_length(meta.get("max_length"), position_limit(config), where, source)
    kind, kwargs = resolve(spec["head"], dict(spec.get("head_kwargs") or {}))
    head_class = HEADS.get(kind)
    width = parse_layers(spec.get("layers", "last"), int(config.num_hidden_layers)).width
    kwargs, native_init = native_arguments(config, head_class, kwargs)
    try:
        with torch.device("meta"):
            probe = head_class(int(config.hidden_size) * width, **kwargs, **native_init)
    except Exception as e:  # noqa: BLE001 - the saved arguments, not kotune, fail to make a head
        raise ArtifactError(f"{where}: head_kwargs={shown(spec.get('head_kwargs'))} do not make a {kind} head "
                            f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from None
    expected = {k: tuple(v.shape) for k, v in probe.state_dict().items()}
    weights = os.path.join(directory, "head.safetensors")
    saved = safetensors_shapes(weights)
    for key in sorted(set(expected) | set(saved)):
        if key not in saved:
            raise ArtifactError(f"{weights}: has no {key}, which kotune.json's {kind} head has")
        if key not in expected:
            raise ArtifactError(f"{weights}: {key} is not a weight of kotune.json's {kind} head")
        if saved[key] != expected[key]:
            raise ArtifactError(f"{weights}: {key} is {list(saved[key])}, but kotune.json's head_kwargs make it "
                                f"{list(expected[key])} (the weights and kotune.json disagree)")
    labels, logits = meta.get("labels"), kwargs.get("num_labels")
    if labels and integer(logits) and len(labels) != logits:
        raise ArtifactError(f"{where}: meta.labels has {len(labels)} name{'s' if len(labels) != 1 else ''}, but the "
                            f"{kind} head gives {logits} logits (head_kwargs.num_labels, as head.safetensors' shapes say)")
