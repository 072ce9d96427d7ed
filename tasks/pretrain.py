"""``action=pretrain``, the data side: read text lines, hold some out, tokenize them once with
character offsets, pack them into full ``max_length`` blocks ([SEP] between lines, no padding) or,
for next-sentence prediction, into BERT's sentence pairs (``nsp_pairs``), and build the library's masked-LM collator (whole-word masking over whitespace-separated words,
Korean eojeol, decided from the offsets), with training masks keyed on the seed and the batch's
place in training (exact resume). No modules here: the model is heads/model/mlm.py's.
"""
from __future__ import annotations

import hashlib
import os
import random
import re
from dataclasses import dataclass

import torch
from omegaconf import DictConfig

from tasks.base import IGNORE
from tasks.embed import read_texts, read_txt_lines
from kotune.core.errors import ConfigError, DataError
from kotune.core.log import log

OBJECTIVES = ("mlm", "mlm+nsp", "rtd")
# One text per line: a sentence ends at . ? ! (or …) followed by whitespace.
SENTENCE_END = re.compile(r"(?<=[.?!…])\s+")


@dataclass
class Text:
    """The lines of one split and where they came from (for errors and results.json); for
    next-sentence prediction also its documents (each a list of sentences; ``lines`` are then
    all their sentences)."""

    lines: list[str]
    source: str
    documents: list[list[str]] | None = None


def file_list(value) -> list[str]:
    """``data.train_file``: one path or a list of paths."""
    if value is None:
        return []
    return [str(value)] if isinstance(value, str) else [str(v) for v in value]


def read_lines(paths: list[str], column: str | None, fmt: str | None, quoting: str | None = "auto") -> list[str]:
    """Every non-blank line of ``.txt`` files, or the ``column`` of CSV/TSV/JSON/JSONL files."""
    lines: list[str] = []
    for path in paths:
        rows = read_texts(path, column, fmt, quoting=quoting, option="data.text_column")
        lines.extend(text.strip() for _, text in rows)
    return lines


def split_sentences(text: str) -> list[str]:
    """The sentences of one text: cut after . ? ! … followed by whitespace."""
    return [s for s in SENTENCE_END.split(text.strip()) if s]


def read_documents(paths: list[str], column: str | None, fmt: str | None,
                   quoting: str | None = "auto") -> list[list[str]]:
    """Documents as lists of sentences: the blank-line-separated blocks of a ``.txt`` file that has
    blank lines between texts (one sentence per line, as BERT's pretraining data), else each
    text (a line, or a CSV/TSV/JSONL ``column`` value) cut into sentences by ``split_sentences``."""
    documents: list[list[str]] = []
    for path in paths:
        is_txt = (fmt or ("txt" if os.path.splitext(path)[1].lower() in (".txt", "") else None)) == "txt"
        lines = read_txt_lines(path) if is_txt else []
        text = [line.strip() for line in lines]
        filled = [i for i, t in enumerate(text) if t]
        if filled and "" in text[filled[0]:filled[-1]]:  # a blank line between texts
            block: list[str] = []
            for line in text + [""]:
                if line:
                    block.append(line)
                elif block:
                    documents.append(block)
                    block = []
            continue
        documents.extend(split_sentences(t) for _, t in read_texts(path, column, fmt, quoting=quoting,
                                                                     option="data.text_column"))
    return [d for d in documents if d]


def hold_out(units: list, fraction: float, seed: int, source: str, what: str) -> tuple[list, list]:
    """A seeded ``fraction`` of ``units`` (lines or documents) held out: (kept, held)."""
    order = list(range(len(units)))
    random.Random(seed).shuffle(order)
    n_val = max(1, round(len(order) * fraction))
    if n_val >= len(order):
        raise DataError(source, None, f"{len(order)} {what}(s): too few to hold out a validation "
                                      "split; give data.validation_file or more text")
    held = set(order[:n_val])
    return [u for i, u in enumerate(units) if i not in held], [u for i, u in enumerate(units) if i in held]


def load_text(data: DictConfig, seed: int, documents: bool = False) -> dict[str, Text]:
    """``train`` and ``validation`` lines (``documents``: documents of sentences, for next-sentence
    prediction): the validation file, else a seeded ``data.validation_split`` fraction of the
    training lines or documents (default 5 %)."""
    train_files = file_list(data.get("train_file"))
    if not train_files:
        raise ConfigError("action=pretrain needs data.train_file=FILE (.txt, one text per line, or "
                          "CSV/TSV/JSONL with data.text_column; a list of files is allowed)")
    column = None if data.get("text_column") is None else str(data.text_column)  # None: text, or a conventional name
    fmt, quoting = data.get("format"), data.get("quoting", "auto")
    read = read_documents if documents else read_lines

    def text(units: list, source: str) -> Text:
        if documents:
            return Text([s for d in units for s in d], source, units)
        return Text(units, source)

    source = ",".join(train_files)
    train = read(train_files, column, fmt, quoting)
    val_files = file_list(data.get("validation_file"))
    if val_files:
        return {"train": text(train, source),
                "validation": text(read(val_files, column, fmt, quoting), ",".join(val_files))}
    fraction = float(data.get("validation_split") or 0.05)
    kept, held = hold_out(train, fraction, seed, source, "document" if documents else "line")
    return {"train": text(kept, source), "validation": text(held, f"{source} (seeded {fraction:g} held out)")}


def check_vocabulary(tokenizer, model_cfg: DictConfig, source: str) -> None:
    """A WordPiece vocabulary trained here that came out smaller than asked: the text cannot
    support it (an embedding matrix with rows no token ever uses)."""
    spec = model_cfg.get("tokenizer") or {}
    if spec.get("train") and len(tokenizer) < int(spec.get("vocab_size", 8000)):
        raise DataError(source, None, f"the text supports a WordPiece vocabulary of {len(tokenizer)} "
                                      f"tokens, model.tokenizer.vocab_size={spec.get('vocab_size')} asked for "
                                      f"more: lower it or give more text")


def tokenize_lines(tokenizer, lines: list[str], batch: int = 2000) -> tuple[list[list[int]], list[list[tuple]]]:
    """Token ids and character offsets of every line, without special tokens."""
    ids, offsets = [], []
    for start in range(0, len(lines), batch):
        enc = tokenizer(lines[start:start + batch], add_special_tokens=False, return_offsets_mapping=True,
                        return_attention_mask=False, return_token_type_ids=False)
        ids.extend(enc["input_ids"])
        offsets.extend([[tuple(o) for o in row] for row in enc["offset_mapping"]])
    return ids, offsets


def _row(tokenizer, ids: list[int], offsets: list[tuple], special: list[int], length: int) -> dict:
    pad = length - len(ids)
    return {"input_ids": ids + [tokenizer.pad_token_id] * pad,
            "attention_mask": [1] * len(ids) + [0] * pad,
            "special_tokens_mask": special + [1] * pad,  # padding is never masked
            "offset_mapping": offsets + [(0, 0)] * pad}


def pack_blocks(tokenizer, ids: list[list[int]], offsets: list[list[tuple]], block_size: int) -> list[dict]:
    """run_mlm's ``group_texts`` for lines: the stream ``line [SEP] line [SEP] …`` cut into blocks
    of ``[CLS]`` + ``block_size - 1`` tokens; only the last block is padded (to ``block_size``)."""
    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    stream_ids: list[int] = []
    stream_offsets: list[tuple] = []
    stream_special: list[int] = []
    for line_ids, line_offsets in zip(ids, offsets):
        if not line_ids:
            continue
        stream_ids += line_ids + [sep]
        stream_offsets += line_offsets + [(0, 0)]
        stream_special += [0] * len(line_ids) + [1]
    step = block_size - 1
    return [_row(tokenizer, [cls] + stream_ids[i:i + step], [(0, 0)] + stream_offsets[i:i + step],
                 [1] + stream_special[i:i + step], block_size)
            for i in range(0, len(stream_ids), step)]


def sentence_tokens(tokenizer, text: Text) -> tuple[list[list[list[tuple]]], int]:
    """Per document, per sentence, its ``(id, offset)`` tokens, sentences with none left out
    (BERT's ``create_pretraining_data.py`` keeps a line only ``if tokens``) and documents with none
    too; and how many sentences were left out."""
    ids, offsets = tokenize_lines(tokenizer, text.lines)
    documents, start, empty = [], 0, 0
    for doc in text.documents:
        sentences = [list(zip(ids[i], offsets[i])) for i in range(start, start + len(doc)) if ids[i]]
        empty += len(doc) - len(sentences)
        start += len(doc)
        if sentences:
            documents.append(sentences)
    return documents, empty


def nsp_pairs(tokenizer, text: Text, max_length: int, seed: int) -> list[dict]:
    """BERT's ``create_instances_from_document`` (create_pretraining_data.py) with
    ``short_seq_prob=0`` and one duplicate: each document's sentences are gathered into chunks of
    up to ``max_length - 3`` tokens; a chunk's first 1..n-1 sentences are segment A; B is the rest
    of the chunk (``next_sentence_label`` 0) or, half of the time and always for a one-sentence
    chunk, sentences from a random place in another document (label 1; the chunk's unused
    sentences go back to the document). ``[CLS] A [SEP] B [SEP]``, ``token_type_ids`` 0 then 1,
    the longer segment cut at a random end until the pair fits; padded to ``max_length``. As BERT's
    reader, a sentence that tokenizes to nothing (a zero-width space, control characters) is left
    out, and so is a document left without sentences (counted in the log): kept, it would make
    empty segments and lose their pairs."""
    tokens, empty = sentence_tokens(tokenizer, text)
    if empty:
        log(f"{text.source}: {empty} sentence(s) with no token (e.g. only a zero-width space) left out, "
            f"{len(text.documents) - len(tokens)} document(s) left without sentences")
    if len(tokens) < 2:
        raise DataError(text.source, None, f"{len(tokens)} document(s): next-sentence prediction "
                                           "needs at least two (a random next segment comes from another)")
    rng, budget, rows = random.Random(seed), max_length - 3, []
    for d, doc in enumerate(tokens):
        chunk, length, i = [], 0, 0
        while i < len(doc):
            chunk.append(doc[i])
            length += len(doc[i])
            if i == len(doc) - 1 or length >= budget:
                a_end = rng.randint(1, len(chunk) - 1) if len(chunk) >= 2 else 1
                a = [t for s in chunk[:a_end] for t in s]
                is_random = len(chunk) == 1 or rng.random() < 0.5
                if is_random:
                    other = d
                    for _ in range(10):  # as BERT: ten tries at another document
                        other = rng.randint(0, len(tokens) - 1)
                        if other != d:
                            break
                    b = []
                    for sentence in tokens[other][rng.randint(0, len(tokens[other]) - 1):]:
                        b += sentence
                        if len(b) >= budget - len(a):
                            break
                    i -= len(chunk) - a_end  # the unused sentences go back
                else:
                    b = [t for s in chunk[a_end:] for t in s]
                while len(a) + len(b) > budget:
                    longer = a if len(a) > len(b) else b
                    longer.pop(0 if rng.random() < 0.5 else -1)
                if a and b:
                    rows.append(_pair_row(tokenizer, a, b, int(is_random), max_length))
                chunk, length = [], 0
            i += 1
    return rows


def _pair_row(tokenizer, a: list[tuple], b: list[tuple], label: int, length: int) -> dict:
    cls, sep = [(tokenizer.cls_token_id, (0, 0))], [(tokenizer.sep_token_id, (0, 0))]
    pair = cls + a + sep + b + sep
    row = _row(tokenizer, [t for t, _ in pair], [o for _, o in pair],
               [1] + [0] * len(a) + [1] + [0] * len(b) + [1], length)
    types = [0] * (len(a) + 2) + [1] * (len(b) + 1)
    return {**row, "token_type_ids": types + [0] * (length - len(types)), "next_sentence_label": label}


def model_blocks(tokenizer, text: Text, max_length: int, seed: int) -> list[dict]:
    """The rows a split trains or is scored on: sentence pairs where ``text`` has documents
    (next-sentence prediction), else packed blocks."""
    if text.documents is not None:
        rows = nsp_pairs(tokenizer, text, max_length, seed)
        random_next = sum(r["next_sentence_label"] for r in rows)
        log(f"{text.source}: {len(rows)} sentence pairs ({random_next} with a random next segment) from "
            f"{len(text.documents)} documents, {len(text.lines)} sentences")
        return rows
    return pack_blocks(tokenizer, *tokenize_lines(tokenizer, text.lines), max_length)


def line_blocks(tokenizer, ids: list[list[int]], offsets: list[list[tuple]], max_length: int) -> list[dict]:
    """run_mlm's ``--line_by_line --pad_to_max_length``: ``[CLS] line [SEP]`` per row, cut at and
    padded to ``max_length`` (the baseline packing is measured against)."""
    cls, sep, keep = tokenizer.cls_token_id, tokenizer.sep_token_id, max_length - 2
    return [_row(tokenizer, [cls] + i[:keep] + [sep], [(0, 0)] + o[:keep] + [(0, 0)],
                 [1] + [0] * len(i[:keep]) + [1], max_length)
            for i, o in zip(ids, offsets) if i]


def padding_efficiency(rows: list[dict]) -> float:
    """Real tokens over all positions the model computes."""
    total = sum(len(r["attention_mask"]) for r in rows)
    return sum(sum(r["attention_mask"]) for r in rows) / total if total else 0.0


def objective(p: DictConfig) -> str:
    """``pretrain.objective``, checked."""
    value = str(p.get("objective") or "mlm")
    if value not in OBJECTIVES:
        raise ConfigError(f"pretrain.objective={value}: must be one of {', '.join(OBJECTIVES)}")
    return value


def mlm_collator(tokenizer, p: DictConfig, seed: int | None = None):
    """The library's ``DataCollatorForLanguageModeling``: ``pretrain.mlm_probability`` of the
    tokens chosen, 80 % → [MASK], 10 % → a random token, 10 % kept. ``pretrain.whole_word``:
    the library picks words (a new word where a token's start offset leaves a gap after the
    previous token's end, i.e. at a space: an eojeol and its WordPieces are one word) and masks
    all their tokens; it replaces every chosen token by [MASK] (transformers 5 supports no
    random replacement with whole words). ``seed``: a fixed masking (held-out evaluation)."""
    from transformers import DataCollatorForLanguageModeling

    objective(p)
    probability = float(p.mlm_probability)
    if not 0.0 < probability < 1.0:
        raise ConfigError(f"pretrain.mlm_probability={probability}: must be between 0 and 1")
    whole = bool(p.whole_word)
    if whole and not tokenizer.is_fast:
        raise ConfigError("pretrain.whole_word=true needs a fast tokenizer (character offsets)")
    return DataCollatorForLanguageModeling(
        tokenizer, mlm_probability=probability, whole_word_mask=whole,
        mask_replace_prob=1.0 if whole else 0.8, random_replace_prob=0.0 if whole else 0.1, seed=seed)


def model_rows(rows: list[dict], whole_word: bool) -> list[dict]:
    """What the collator reads: offsets only where whole-word masking needs them."""
    if whole_word:
        return rows
    return [{k: v for k, v in r.items() if k != "offset_mapping"} for r in rows]


def masked_batches(rows: list[dict], collator, batch_size: int) -> list[dict]:
    """The held-out blocks masked once, in order, by a seeded collator: the same masks before and
    after training."""
    return [collator(rows[i:i + batch_size]) for i in range(0, len(rows), batch_size)]


class EpochSampler(torch.utils.data.Sampler):
    """A seeded shuffle of the training rows per epoch (seed + epoch, as accelerate's seedable
    sampler) that yields ``(epoch, row)`` keys, so a batch knows its place in training. Trainer
    calls ``set_epoch`` before every epoch, a resumed one included."""

    def __init__(self, n_rows: int, seed: int):
        self.n_rows, self.seed, self.epoch = n_rows, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.n_rows

    def __iter__(self):
        order = torch.randperm(self.n_rows, generator=torch.Generator().manual_seed(self.seed + self.epoch))
        return iter([(self.epoch, row) for row in order.tolist()])


class KeyedRows(torch.utils.data.Dataset):
    """Training rows read by ``EpochSampler``'s ``(epoch, row)`` keys; each item carries its key."""

    def __init__(self, rows: list[dict]):
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, key: tuple[int, int]) -> dict:
        return {**self.rows[key[1]], "mask_key": key}


def row_seed(seed: int, epoch: int, row: int, salt: str = "") -> int:
    """A 64-bit generator seed from the run's seed, the epoch and the row (``salt``: another stream
    for the same row, e.g. replaced-token detection's sampling)."""
    key = (seed, epoch, row, salt) if salt else (seed, epoch, row)
    return int.from_bytes(hashlib.blake2b(repr(key).encode(), digest_size=8).digest(), "little")


def masked_positions(labels: torch.Tensor) -> torch.Tensor:
    """Each row's masked positions (its labelled ones, ascending) as a ``[rows, K]`` index, ``K`` the
    most of any row (at least 1), the rest of a row ``IGNORE``. Why: built on the host, where the
    masks are made, it gives the head a shape the host knows (heads/model/mlm.py's ``at_masked``);
    picking the positions on the device would make the host wait for their number every step."""
    chosen = labels != IGNORE
    k = max(1, int(chosen.sum(1).max())) if chosen.numel() else 1
    # a stable sort of "not chosen" puts each row's chosen positions first, in order
    order = torch.sort((~chosen).to(torch.uint8), dim=1, stable=True).indices[:, :k]
    return torch.where(chosen.gather(1, order), order, IGNORE)


class KeyedMasking:
    """The library collator with each row's masks drawn from a generator keyed on ``seed`` and the
    row's place in training (epoch and row, from ``KeyedRows``). Why: the library draws from the
    global torch RNG, which Trainer restores only after the first resumed batch is fetched (and
    which dataloader workers do not share), so a resumed run masked differently from an
    uninterrupted one. Keyed masks are the same whenever and wherever a row is collated, whatever
    batch it is in (``train.grad_accum=2`` at half the batch size masks as one batch does), and
    differ across epochs. The rows of a batch are of one length (packed blocks, padded pairs).
    ``sample_seeds``: each row also carries ``sample_seed``, a 63-bit seed of its own for what the
    model draws at random (replaced-token detection's sampled tokens), keyed the same way.
    ``index_positions``: the batch also carries ``masked_positions`` (:func:`masked_positions`), so
    that a training step picks the masked positions without a host wait (on a GPU; on a CPU a host
    read costs nothing and the index's padding slots do, so the boolean picking is kept there)."""

    def __init__(self, collator, seed: int, sample_seeds: bool = False, index_positions: bool = False):
        self.collator, self.seed, self.sample_seeds = collator, seed, sample_seeds
        self.index_positions = index_positions

    def __call__(self, items: list[dict]) -> dict:
        rows = []
        for item in items:
            epoch, row = item["mask_key"]
            self.collator.generator = torch.Generator().manual_seed(row_seed(self.seed, epoch, row))
            rows.append(self.collator([{k: v for k, v in item.items() if k != "mask_key"}]))
            if self.sample_seeds:
                rows[-1]["sample_seed"] = torch.tensor([row_seed(self.seed, epoch, row, "sample") >> 1])
        batch = {k: torch.cat([r[k] for r in rows]) for k in rows[0]}
        if self.index_positions:
            batch["masked_positions"] = masked_positions(batch["labels"])
        return batch


def training_collator(tokenizer, p: DictConfig, seed: int, index_positions: bool = False) -> KeyedMasking:
    """``mlm_collator`` with masks keyed on ``seed`` and each batch's place in training (and, for
    ``pretrain.objective=rtd``, a sampling seed per row); ``index_positions``: :class:`KeyedMasking`'s."""
    return KeyedMasking(mlm_collator(tokenizer, p), seed, sample_seeds=objective(p) == "rtd",
                        index_positions=index_positions)
