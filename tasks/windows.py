"""Documents longer than the encoder (``task.long_text=windows``, sequence classification): each
text — a pair's second text — is cut into overlapping windows of ``max_length`` tokens, the
windows of one document stay in one feature row (``input_ids`` a list of windows), and the model
classifies the document by pooling its windows' logits (heads/model/windows.py). This module only
tokenizes; it builds no module.

``task.window_stride`` is the number of tokens consecutive windows share (the tokenizer's own
``stride``, as ``task.doc_stride`` is for QA), so a window starts every ``room - stride`` tokens,
``room`` being what ``max_length`` leaves after the special tokens (and a pair's first text).
"""
from __future__ import annotations

from dataclasses import dataclass

from omegaconf import DictConfig

from kotune.core.errors import ConfigError, DataError
from kotune.core.log import log

LONG_TEXT = ("truncate", "windows")
WINDOW_POOLS = ("mean", "max")


@dataclass(frozen=True)
class WindowOptions:
    """How documents become windows and windows a document's logits."""

    stride: int          # tokens consecutive windows share
    pool: str            # mean | max over the windows' logits
    max_per_batch: int   # windows the encoder reads at once (memory); not part of the model


def window_options(cfg: DictConfig) -> WindowOptions | None:
    """``task.long_text`` and its options, checked; None for ``truncate``."""
    long_text = str(cfg.get("long_text") or "truncate")
    if long_text not in LONG_TEXT:
        raise ConfigError(f"task.long_text must be one of {', '.join(LONG_TEXT)}, got '{long_text}'")
    if long_text == "truncate":
        return None
    pool = str(cfg.get("window_pool") or "mean")
    if pool not in WINDOW_POOLS:
        raise ConfigError(f"task.window_pool must be one of {', '.join(WINDOW_POOLS)}, got '{pool}'")
    stride, cap = int(cfg.get("window_stride", 32)), int(cfg.get("max_windows_per_batch", 64))
    if stride < 0:
        raise ConfigError(f"task.window_stride must be 0 or more (tokens windows share), got {stride}")
    if cap < 1:
        raise ConfigError(f"task.max_windows_per_batch must be at least 1, got {cap}")
    return WindowOptions(stride, pool, cap)


def encode_windows(tokenizer, examples: list[dict], pair: bool, max_length: int, options: WindowOptions,
                   token_type_ids: bool) -> dict[str, list]:
    """Model inputs per document: ``input_ids``, ``attention_mask`` (and ``token_type_ids``), each a
    list of windows. A pair keeps its first text whole in every window and windows the second."""
    firsts = [ex["text"] for ex in examples]
    seconds = [ex["text_pair"] for ex in examples] if pair else None
    _check_room(tokenizer, examples, pair, max_length, options.stride)
    enc = tokenizer(firsts, seconds, truncation="only_second" if pair else True, max_length=max_length,
                    stride=options.stride, return_overflowing_tokens=True, return_token_type_ids=token_type_ids)
    keys = [k for k in ("input_ids", "attention_mask", "token_type_ids") if k in enc]
    columns: dict[str, list] = {k: [[] for _ in examples] for k in keys}
    for w, doc in enumerate(enc["overflow_to_sample_mapping"]):
        for k in keys:
            columns[k][doc].append(enc[k][w])
    counts = [len(windows) for windows in columns["input_ids"]]
    long_docs = sum(1 for n in counts if n > 1)
    log(f"task.long_text=windows: {long_docs} of {len(examples)} documents exceed max_length={max_length} "
        f"tokens: {sum(counts)} windows (at most {max(counts, default=0)} per document, "
        f"{options.stride} tokens shared by consecutive windows)")
    return columns


def _check_room(tokenizer, examples: list[dict], pair: bool, max_length: int, stride: int) -> None:
    """Each window must move on: ``stride`` below the tokens a window has for the windowed text."""
    specials = tokenizer.num_special_tokens_to_add(pair=pair)
    firsts = tokenizer([ex["text"] for ex in examples], add_special_tokens=False)["input_ids"] if pair else None
    for i, ex in enumerate(examples):
        taken = len(firsts[i]) if pair else 0
        room = max_length - specials - taken
        if room > stride:
            continue
        if not pair:
            raise ConfigError(f"task.window_stride={stride} must be smaller than the {room} tokens a window of "
                              f"max_length={max_length} holds: lower it")
        raise DataError(f"example {ex['id']}", None,
                        f"its first text takes {taken} of max_length={max_length} tokens, leaving {room} for "
                        f"windows of the second text, not more than task.window_stride={stride}: shorten the "
                        "first text, raise train.max_length or lower task.window_stride")
