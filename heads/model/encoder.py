"""The shared encoder: tokenizer and ``AutoModel`` from a hub id or a local directory, pretrained
or randomly initialised, plus the locally trained tokenizer of the ``tiny`` preset.

Everything here that touches the hub first checks it can be reached, so an offline machine gets
one clear line (which id, that the hub is unreachable, what to do) in seconds, not a minute of
retries.
"""
from __future__ import annotations

import hashlib
import os
from typing import TYPE_CHECKING, Iterable

import torch
from omegaconf import DictConfig, OmegaConf

from kotune.core.errors import ConfigError, KotuneError
from kotune.core.log import warn
from tasks.io import hub_reachable

if TYPE_CHECKING:
    from transformers import PreTrainedConfig

HANGUL = range(0xAC00, 0xD7A4)
NO_TOKEN_TYPES = {"roberta", "xlm-roberta", "camembert", "deberta-v2"}
# position ids counted from the pad id (fairseq's make_positions): a row's real tokens take
# pad_token_id + 1, pad_token_id + 2, …; the pads take pad_token_id, a zero row never trained
PADDED_POSITIONS = {"roberta", "xlm-roberta", "camembert"}


class ModelUnavailable(KotuneError):
    pass


def _plain(node) -> dict:
    return dict(OmegaConf.to_container(node, resolve=True)) if node else {}


def _is_local(path: str) -> bool:
    return os.path.isdir(os.path.expanduser(path))


def _from_hub_or_cache(loader, name: str, **kwargs):
    """``loader.from_pretrained`` that tries the local HF cache first and fails fast offline. Code a
    model names (a config's ``auto_map``) is never run: transformers refuses it rather than asking
    (a LoRA checkpoint names its base encoder, docs/actions/checkpoints.md)."""
    kwargs.setdefault("trust_remote_code", False)
    if _is_local(name):
        return loader.from_pretrained(os.path.expanduser(name), **kwargs)
    try:
        return loader.from_pretrained(name, local_files_only=True, **kwargs)
    except OSError:
        pass
    if not hub_reachable():
        raise ModelUnavailable(
            f"model '{name}' is not cached locally and the Hugging Face hub is unreachable: "
            f"download it on a machine with a network and pass model.name_or_path=/path/to/dir, "
            f"or run offline with model=tiny (or model.init=random with a local vocab directory)")
    try:
        return loader.from_pretrained(name, **kwargs)
    except OSError as e:
        raise ModelUnavailable(f"cannot load '{name}' from the hub: {str(e).splitlines()[0]}") from None


def load_tokenizer(model_cfg: DictConfig, texts: Iterable[str] | None = None, cache_dir: str | None = None):
    """The preset's tokenizer; ``tokenizer.train: true`` trains a WordPiece one on ``texts``."""
    from transformers import AutoTokenizer, BertTokenizer

    kwargs = _plain(model_cfg.get("tokenizer_kwargs"))
    spec = model_cfg.get("tokenizer") or {}
    if spec.get("train"):
        if texts is None:
            raise ConfigError("model.tokenizer.train needs training texts (a train split)")
        return train_wordpiece(texts, int(spec.get("vocab_size", 8000)), cache_dir)
    path = model_cfg.get("tokenizer_path") or model_cfg.name_or_path
    if path is None:
        raise ConfigError(f"model {model_cfg.name}: set model.name_or_path (a hub id or directory)")
    if path == model_cfg.name_or_path and _is_local(path):  # a kotune model dir is a fine tokenizer_path
        check_not_kotune_directory(path)
    if _is_local(path) and not os.path.exists(os.path.join(os.path.expanduser(path), "tokenizer_config.json")) \
            and not os.path.exists(os.path.join(os.path.expanduser(path), "config.json")):
        # a bare vocab directory (e.g. ../shared/vocab/koelectra): WordPiece from vocab.txt
        return BertTokenizer.from_pretrained(os.path.expanduser(path), **kwargs)
    return _from_hub_or_cache(AutoTokenizer, path, revision=model_cfg.get("revision"), **kwargs)


def train_wordpiece(texts: Iterable[str], vocab_size: int, cache_dir: str | None):
    """A cased WordPiece tokenizer trained on the task's own text (the ``tiny`` preset), cached."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers, decoders
    from tokenizers.processors import TemplateProcessing
    from transformers import PreTrainedTokenizerFast

    texts = list(texts)
    key = hashlib.sha256(("\n".join(texts) + f"|{vocab_size}|v4").encode()).hexdigest()[:16]
    path = os.path.join(cache_dir, "tokenizers", key) if cache_dir else None
    if path and os.path.exists(os.path.join(path, "tokenizer.json")):
        return PreTrainedTokenizerFast.from_pretrained(path)
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    # cased, no accent stripping: NFD would split Hangul syllables into jamo
    normalizer = normalizers.BertNormalizer(lowercase=False, strip_accents=False)
    pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    # the trainer numbers each "##" character piece when it first meets it in hash-map order, which
    # changes from one process to the next, and breaks ties between merges by those numbers: the same
    # text gave another vocabulary in every fresh run (huggingface/tokenizers#1794). Given to it up
    # front, in sorted order, they are numbered the same way every time
    pieces = sorted({"##" + c for text in texts for word, _ in pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(text))
                     for c in word[1:]})
    trainer_tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    trainer_tok.normalizer, trainer_tok.pre_tokenizer = normalizer, pre_tokenizer
    trainer_tok.train_from_iterator(texts, trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=specials + pieces,
                                                                     show_progress=False))
    # a fresh tokenizer on the trained vocabulary (the pieces are ordinary tokens, not special ones),
    # numbered in sorted order
    trained = trainer_tok.get_vocab()
    ordered = specials + sorted(t for t in trained if t not in specials)
    tok = Tokenizer(models.WordPiece({t: i for i, t in enumerate(ordered)}, unk_token="[UNK]"))
    tok.normalizer, tok.pre_tokenizer, tok.decoder = normalizer, pre_tokenizer, decoders.WordPiece()
    tok.add_special_tokens(specials)
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
                                            special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    # BERT's inputs, as BertTokenizerFast names them: without token_type_ids here, an exported model's
    # pipeline() gave every pair segment 0 while kotune trained it with 1 for the second text
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]",
                                   cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]",
                                   model_input_names=["input_ids", "token_type_ids", "attention_mask"])
    if path:
        tmp = f"{path}.tmp{os.getpid()}"
        fast.save_pretrained(tmp)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if not os.path.exists(path):
            os.replace(tmp, path)
    return fast


def unk_rate(tokenizer, texts: Iterable[str], limit: int = 2000) -> float:
    """Fraction of Hangul syllables that land in [UNK] tokens (the lowercasing trap shows here)."""
    unk_id = tokenizer.unk_token_id
    hangul = unk = 0
    for i, text in enumerate(texts):
        if i >= limit:
            break
        enc = tokenizer(text, return_offsets_mapping=True, add_special_tokens=False)
        for tid, (s, e) in zip(enc["input_ids"], enc["offset_mapping"]):
            n = sum(1 for ch in text[s:e] if ord(ch) in HANGUL)
            hangul += n
            unk += n if tid == unk_id else 0
    return unk / hangul if hangul else 0.0


def check_not_kotune_directory(path: str) -> None:
    """``model.name_or_path`` names an encoder; a kotune run or model directory, or a peft
    adapter, is told apart in one line saying what to pass instead."""
    import json

    root = os.path.expanduser(path)
    for model_dir in (root, os.path.join(root, "model")):
        spec_path = os.path.join(model_dir, "kotune.json")
        if os.path.exists(spec_path):
            with open(spec_path, encoding="utf-8") as f:
                spec = json.load(f)
            mode = spec.get("mode") or ("frozen" if spec.get("frozen") else "finetune")
            if spec.get("lora"):
                raise ConfigError(f"model.name_or_path={path} is a kotune mode=lora model: an adapter, not an encoder. "
                                  f"Read it with checkpoint={path}; to start a new run from it, merge it first "
                                  f"(action=export checkpoint={path}) and pass model.name_or_path=EXPORT_DIR")
            raise ConfigError(f"model.name_or_path={path} is a kotune mode={mode} model: read it with checkpoint={path}, "
                              f"or start a new run from its encoder with model.name_or_path={model_dir}/encoder "
                              f"+model.tokenizer_path={model_dir}")
    if os.path.exists(os.path.join(root, "adapter_config.json")):
        raise ConfigError(f"model.name_or_path={path} is a peft adapter, not an encoder: pass its base model "
                          "(adapter_config.json's base_model_name_or_path)")


def build_config(model_cfg: DictConfig, vocab_size: int | None, pad_token_id: int | None = None) -> PreTrainedConfig:
    """The encoder's config: a pretrained model's as saved; a random init's from ``model.architecture``
    with the tokenizer's ``vocab_size`` and ``pad_token_id`` (None: the architecture's default, as a
    LoRA base record written before the pad id was recorded)."""
    from transformers import AutoConfig

    path = model_cfg.get("name_or_path")
    if path and _is_local(path):
        check_not_kotune_directory(path)
    overrides = _plain(model_cfg.get("config_overrides"))
    has_config = path and (not _is_local(path) or os.path.exists(os.path.join(os.path.expanduser(path),
                                                                              "config.json")))
    if has_config:
        config = _from_hub_or_cache(AutoConfig, path, revision=model_cfg.get("revision"))
    elif model_cfg.get("architecture"):
        config = AutoConfig.for_model(model_cfg.architecture)
    else:
        raise ConfigError(f"model {model_cfg.name}: '{path}' has no config.json; set "
                          "model.architecture=bert|electra|roberta to build one")
    for key, value in overrides.items():
        if not hasattr(config, key):
            raise ConfigError(f"model.config_overrides.{key}: not a field of {type(config).__name__}")
        setattr(config, key, value)
    if model_cfg.get("init") == "random":
        if vocab_size:
            config.vocab_size = vocab_size
        # RoBERTa's default pad id is 1, a trained WordPiece vocabulary's [UNK]: every [UNK] would take
        # the pads' position and their never-trained embedding row, and the real pads would take positions
        if pad_token_id is not None:
            config.pad_token_id = int(pad_token_id)
    elif pad_token_id is not None and config.pad_token_id is not None and config.pad_token_id != pad_token_id:
        warn(f"model {model_cfg.name}: the config's pad_token_id={config.pad_token_id} is not the tokenizer's pad id "
             f"{pad_token_id}; the pretrained config is kept as saved")
    return config


def load_encoder(model_cfg: DictConfig, vocab_size: int | None, seed: int,
                 head_kind: str | None = None, pad_token_id: int | None = None) -> torch.nn.Module:
    """``AutoModel`` without any task head (``vocab_size``, ``pad_token_id``: the tokenizer's, for a
    random init, :func:`build_config`). A pretrained BERT's pooler is kept only for a
    ``head_kind`` whose native head is that pooler (``Head.takes_pooler``: the sequence head; KotuneModel
    moves it into the head)."""
    from transformers import AutoModel

    from heads.native import takes_pooler
    from heads.registry import HEADS, resolve

    init = model_cfg.get("init", "pretrained")
    if init not in ("pretrained", "random"):
        raise ConfigError(f"model.init must be pretrained or random, got '{init}'")
    config = build_config(model_cfg, vocab_size, pad_token_id)
    # a random pooler is just a fresh head layer: the head inits its own, so one seed gives one
    # encoder whatever the head (a pooler built here would shift the encoder's random init)
    keep_pooler = init == "pretrained" and head_kind is not None and takes_pooler(config, HEADS.get(resolve(head_kind, {})[0]))
    extra = {} if keep_pooler else no_pooler(config)
    if model_cfg.get("attn_implementation"):
        config._attn_implementation = model_cfg.attn_implementation
    if init == "random":
        torch.manual_seed(seed)
        return AutoModel.from_config(config, **extra)
    # fp32 whatever the checkpoint was saved in (a bf16 save would otherwise load as bf16 and meet
    # fp32 heads): precision is train.precision's business (autocast)
    return _from_hub_or_cache(AutoModel, model_cfg.name_or_path, config=config, dtype=torch.float32,
                              revision=model_cfg.get("revision"), **extra)


def add_special_tokens(tokenizer, encoder: torch.nn.Module | None, tokens: Iterable[str]) -> int:
    """Adds a task's ``special_tokens`` (KLUE RE's ``<subj>`` … markers) to the tokenizer as special
    tokens (never split, never lowercased; saved with it) and grows ``encoder``'s input embeddings
    to the tokenizer's size, as KLUE-baseline does (``resize_token_embeddings``, klue_baseline/task.py).
    New rows start as the architecture initialises weights, normal(0, ``initializer_range``): what
    transformers 3.5.1, KLUE-baseline's pin, did (5's default is the old rows' mean). Returns the
    number of tokens added."""
    tokens = list(tokens)
    if not tokens:
        return 0
    added = tokenizer.add_special_tokens({"additional_special_tokens": tokens},
                                         replace_extra_special_tokens=False)
    if encoder is not None and encoder.get_input_embeddings().num_embeddings < len(tokenizer):
        encoder.resize_token_embeddings(len(tokenizer), mean_resizing=False)
    return added


def no_pooler(config) -> dict:
    """Keyword that drops BERT/RoBERTa's pooler: heads pool for themselves, and unused
    parameters would break DDP and inflate the trainable count."""
    return {"add_pooling_layer": False} if config.model_type in ("bert", "roberta") else {}


def uses_token_type_ids(config) -> bool:
    return config.model_type not in NO_TOKEN_TYPES and getattr(config, "type_vocab_size", 0) > 1


def position_limit(config) -> int:
    """The tokens a row may hold: ``max_position_embeddings``, less the pad id and the pad's own row
    where position ids start after the pad id (RoBERTa's 514 with pad id 1: 512)."""
    limit = int(getattr(config, "max_position_embeddings", 512))
    if config.model_type in PADDED_POSITIONS:
        return limit - int(config.pad_token_id or 0) - 1
    return limit
