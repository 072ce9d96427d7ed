"""Sentence embeddings (task=sentence_embedding, docs/embeddings.md), two measurements:

1. **Which layer, frozen or trained?** The lecture asks which layer gives the best sentence vector
   for similarity. KLUE STS dev Spearman (×100) of the cosine of two sentences' vectors, from
   frozen features (each layer's token mean, the last-4 mean — all the states there are on an encoder
   of fewer than 4 layers —, the last layer's [CLS]) against the bi-encoder trained on them with the
   two-stage recipe (KorNLI triplets with in-batch negatives, then KorSTS with CoSENT; last layer, mean
   pooling), for the mini pretrained encoder of bench/pretrain_gain.py (``--model-dir``) and its
   random-init twin (same config and tokenizer, ``model.init=random``), over ``--seeds`` (the twin's
   init and the training order change with the seed; the pretrained frozen features do not).
   Paired differences per seed, mean ± SE: "shown" only where |mean| > 2 SE.
2. **Speed**: embeddings per second of kotune's path (tokenize, length-sorted batches, kotune's pooling:
   heads/model/embed.py) and of the bi-encoder's ONNX export (fp32 and int8, onnxruntime, length-sorted
   batches) against ``SentenceTransformer.encode`` on the same BERT-base-shaped random model (kcbert's
   config and vocabulary), batch 32, the same threads, in this process, on KLUE STS dev's sentences
   (``--speed-texts``); the best of ``--repeats`` passes each. Targets: kotune ≥ 1.5× in fp32, int8 ONNX
   ≥ 3× with a Spearman within 1 point of fp32 (the int8 Spearman is the trained mini bi-encoder's: a
   random model's Spearman means nothing).

    python -m bench.embeddings --model-dir DIR         # DIR: python -m bench.pretrain_gain --only-pretrain's model/
    python -m bench.embeddings --smoke --model-dir DIR # tiny settings, every step (tests/test_bench_smoke.py)

Prints both tables and ``RESULT embeddings ...``; every training job is an in-process
``kotune.cli.job.execute`` (what the CLI runs), reused when its run directory holds an ok result.
"""
from __future__ import annotations

import argparse
import os
import tempfile

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from bench.common import parse_with_smoke, timed  # noqa: E402
from bench.hate_speech import model_overrides  # noqa: E402
from bench.jobs import job  # noqa: E402
from bench.stats import difference, spread  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMOKE = {"seeds": "1", "steps": 2, "speed_texts": 48, "repeats": 1, "speed_shape": "small", "max_length": 32}


def arguments(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model-dir", help="the mini pretrained encoder (bench/pretrain_gain.py --only-pretrain's model/)")
    p.add_argument("--shared", default=os.path.join(os.path.dirname(ROOT), "shared"), help="the ../shared folder")
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--lr", type=float, default=1e-3, help="both twins' learning rate (both stages; 2e-4 left both undertrained)")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--max-length", type=int, default=64)
    p.add_argument("--steps", type=int, default=0, help=">0: this many steps per stage (else one epoch each)")
    p.add_argument("--speed-texts", type=int, default=1024, help="KLUE STS dev sentences embedded per pass")
    p.add_argument("--repeats", type=int, default=3, help="passes per speed measurement (the best counts)")
    p.add_argument("--speed-shape", default="base", choices=("base", "small"), help="base: BERT-base (kcbert's config)")
    p.add_argument("--cache-dir", default=os.environ.get("KOTUNE_CACHE", os.path.join(tempfile.gettempdir(), "kotune")))
    p.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "kotune_embeddings"))
    return parse_with_smoke(p, SMOKE, argv)


def files(a) -> dict[str, str]:
    out = {"nli": f"{a.shared}/data/kornli/xnli.test.ko.tsv", "sts": f"{a.shared}/data/korsts/sts-train.tsv",
           "dev": f"{a.shared}/data/klue/klue-sts-v1.1_dev.json", "vocab": f"{a.shared}/vocab/kcbert-base"}
    missing = [p for p in out.values() if not os.path.exists(p)]
    if missing:
        raise SystemExit(f"not found: {', '.join(missing)} (--shared)")
    return out


def dev_set(path: str, tokenizer, max_length: int):
    """KLUE STS dev as the task reads it: its scored pairs, the task, and its distinct sentences' features."""
    from kotune.cli.overrides import compose
    from tasks import build_task
    from tasks.base import EncodeSettings

    task = build_task(compose(["task=sentence_embedding"]).task)
    examples = task.read_file(path)
    return task, examples, task.encode(examples, tokenizer, EncodeSettings(max_length=max_length, token_type_ids=True))


def frozen_scores(a, init: str, seed: int, dev: str) -> dict[str, float]:
    """Spearman of each frozen choice: every layer's mean, the last-4 mean, the last layer's [CLS]."""
    from heads.model.embed import pooled_vectors
    from heads.model.layers import LayerMixer, LayerSpec, parse_layers
    from kotune.loading.build import load_encoder_side
    from kotune.cli.overrides import compose

    cfg = compose([*model_overrides("mini", a.model_dir, a.cache_dir), f"model.init={init}", f"train.seed={seed}"])
    loaded = load_encoder_side(cfg, None, None)
    encoder, layers = loaded.encoder.eval(), int(loaded.encoder.config.num_hidden_layers)
    task, examples, features = dev_set(dev, loaded.tokenizer, a.max_length)
    last4 = tuple(range(max(0, layers - 3), layers + 1))
    choices = {**{f"layer {k} mean": (LayerSpec("list", (k,)), "mean") for k in range(layers + 1)},
               f"last-4 mean (states {last4[0]}-{last4[-1]})": (LayerSpec("list", last4), "mean"),
               "last layer [CLS]": (parse_layers("last", layers), "cls")}
    out = {}
    for name, (spec, pooling) in choices.items():
        vectors = pooled_vectors(encoder, LayerMixer(spec), features, pooling, batch_size=64)
        out[name] = task.score_vectors(vectors.tolist(), examples)["spearman"]
    return out


def trained(a, init: str, seed: int, f: dict) -> dict:
    """The two-stage bi-encoder's results (KorNLI, then KorSTS; KLUE STS dev)."""
    budget = f"max_steps: {a.steps}" if a.steps else "epochs: 1"
    stages = f"task.stages=[{{file: {f['nli']}, {budget}}}, {{file: {f['sts']}, {budget}}}]"
    return job(["task=sentence_embedding", *model_overrides("mini", a.model_dir, a.cache_dir), f"model.init={init}",
                f"model.name=mini-{init}", "data=hub", stages, f"data.validation_file={f['dev']}",
                f"train.learning_rate={a.lr}", f"train.batch_size={a.batch}", f"train.max_length={a.max_length}",
                "train.warmup_ratio=0.1", f"train.seed={seed}", "save_predictions=false"],
               os.path.join(a.out, f"{init}_s{seed}"))


def quality(a, f: dict, seeds: list[int]) -> tuple[list[str], dict]:
    frozen_pre = frozen_scores(a, "pretrained", seeds[0], f["dev"])
    rows, summary = {}, {}
    for init in ("pretrained", "random"):
        frozen = [frozen_pre if init == "pretrained" else frozen_scores(a, init, s, f["dev"]) for s in seeds]
        runs = [trained(a, init, s, f) for s in seeds]
        bi = [r["metrics"]["spearman"] for r in runs]
        best = max(frozen[0], key=lambda k: sum(fr[k] for fr in frozen))
        rows[init] = {"frozen": {k: [fr[k] for fr in frozen] for k in frozen[0]}, "trained": bi, "best": best,
                      "gain": difference(bi, [fr[best] for fr in frozen]), "run": runs[0]["run_dir"]}
    pre, ran = rows["pretrained"], rows["random"]
    summary["twin_gain"] = difference(pre["trained"], ran["trained"])
    lines = [f"KLUE STS dev Spearman ×100 (mean ± sd over seeds {','.join(map(str, seeds))}); trained: KorNLI then "
             f"KorSTS, {'%d steps each' % a.steps if a.steps else 'one epoch each'}, lr {a.lr:g}, batch {a.batch}, "
             f"max_length {a.max_length}, last layer, mean pooling", "",
             "| vector | mini pretrained | random twin |", "| --- | --- | --- |"]
    for name in pre["frozen"]:
        lines.append(f"| frozen: {name} | {spread(pre['frozen'][name])} | {spread(ran['frozen'][name])} |")
    lines.append(f"| **trained bi-encoder** | **{spread(pre['trained'])}** | **{spread(ran['trained'])}** |")
    for init, row in rows.items():
        g = row["gain"]
        lines.append(f"\n{init}: trained − best frozen ({row['best']}) = {g['mean']:+.2f} ± {g['se']:.2f} (paired SE): "
                     f"{'shown' if g['shown'] else 'not shown'}")
    g = summary["twin_gain"]
    lines.append(f"trained: pretrained − random = {g['mean']:+.2f} ± {g['se']:.2f}: {'shown' if g['shown'] else 'not shown'}")
    summary.update(rows=rows)
    return lines, summary


def speed_model(a, f: dict):
    from transformers import BertConfig, BertModel, BertTokenizerFast

    tokenizer = BertTokenizerFast(os.path.join(f["vocab"], "vocab.txt"), do_lower_case=False)
    config = BertConfig.from_pretrained(f["vocab"])
    if a.speed_shape == "small":
        config.num_hidden_layers, config.hidden_size, config.num_attention_heads, config.intermediate_size = 2, 64, 2, 128
    torch.manual_seed(0)
    return BertModel(config, add_pooling_layer=False).eval(), tokenizer


def onnx_files(model, folder: str) -> dict[str, str]:
    """fp32 and int8 ONNX of a bi-encoder KotuneModel, as action=export export.format=onnx writes them."""
    from heads.model.encoder import position_limit
    from kotune.embeddings.onnx import onnx_graph
    from kotune.export.onnx import quantize_int8, trace_to_onnx

    os.makedirs(folder, exist_ok=True)
    paths = {"fp32": os.path.join(folder, "model.onnx"), "int8": os.path.join(folder, "model_int8.onnx")}
    trace_to_onnx(onnx_graph(model), paths["fp32"], ("input_ids", "attention_mask", "token_type_ids"),
                  ("sentence_embedding",), position_limit(model.encoder.config))
    quantize_int8(paths["fp32"], paths["int8"])
    return paths


def onnx_session(path: str, threads: int):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])


def onnx_vectors(session, tokenizer, texts: list[str], max_length: int) -> np.ndarray:
    """Embeddings from an ONNX session in length-sorted batches of 32 (tokenizing included)."""
    names = [i.name for i in session.get_inputs()]
    lengths = [len(ids) for ids in tokenizer(texts, truncation=True, max_length=max_length)["input_ids"]]
    order = np.argsort(lengths, kind="stable")
    parts = {}
    for start in range(0, len(texts), 32):
        rows = order[start:start + 32]
        batch = tokenizer([texts[i] for i in rows], truncation=True, max_length=max_length, padding=True,
                          return_tensors="np")
        parts[start] = (rows, session.run(None, {n: batch[n].astype(np.int64) for n in names})[0])
    out = np.zeros((len(texts), next(iter(parts.values()))[1].shape[1]), dtype=np.float32)
    for rows, vectors in parts.values():
        out[rows] = vectors
    return out


def kotune_vectors(encoder, tokenizer, texts: list[str], max_length: int) -> np.ndarray:
    import datasets

    from heads.model.embed import pooled_vectors
    from heads.model.layers import LayerMixer, parse_layers

    datasets.disable_progress_bars()
    features = datasets.Dataset.from_dict(dict(tokenizer(texts, truncation=True, max_length=max_length)))
    mixer = LayerMixer(parse_layers("last", int(encoder.config.num_hidden_layers)))
    return pooled_vectors(encoder, mixer, features, "mean", batch_size=32)


def speed(a, f: dict) -> tuple[list[str], dict]:
    from heads.model.kotune_model import KotuneModel
    from heads.model.sentence_transformer import build_sentence_transformer

    encoder, tokenizer = speed_model(a, f)
    texts = list(dict.fromkeys(t for ex in dev_set(f["dev"], tokenizer, 128)[1] for t in (ex["text"], ex["text_pair"])))
    texts = texts[:a.speed_texts]
    threads = torch.get_num_threads()
    st = build_sentence_transformer(encoder, tokenizer, pooling="mean", max_length=128, device="cpu")
    model = KotuneModel(encoder, "bi_encoder", {}, layers="last", pooling="mean", meta={"max_length": 128})
    sessions = {k: onnx_session(p, threads) for k, p in onnx_files(model, os.path.join(a.out, f"speed_onnx_{a.speed_shape}")).items()}
    runs = {"sentence-transformers encode": lambda: st.encode(texts, batch_size=32, convert_to_numpy=True),
            "kotune (length-sorted)": lambda: kotune_vectors(encoder, tokenizer, texts, 128),
            "kotune ONNX fp32": lambda: onnx_vectors(sessions["fp32"], tokenizer, texts, 128),
            "kotune ONNX int8": lambda: onnx_vectors(sessions["int8"], tokenizer, texts, 128)}
    rates, vectors = {}, {}
    for name, fn in runs.items():
        fn()  # a first call loads and allocates what later ones reuse: not timed
        best = None
        for _ in range(a.repeats):
            with torch.inference_mode(), timed() as t:
                vectors[name] = fn()
            best = t["s"] if best is None else min(best, t["s"])
        rates[name] = len(texts) / best
    base = rates["sentence-transformers encode"]
    reference = vectors["sentence-transformers encode"]
    lines = [f"{len(texts)} KLUE STS dev sentences, {'BERT-base' if a.speed_shape == 'base' else 'a small BERT'} "
             f"(random weights), batch 32, {threads} threads, best of {a.repeats}", "",
             "| path | embeddings/s | × sentence-transformers | max abs diff |", "| --- | --- | --- | --- |"]
    for name, rate in rates.items():
        lines.append(f"| {name} | {rate:.1f} | {rate / base:.2f}× | {np.abs(vectors[name] - reference).max():.2g} |")
    return lines, {"kotune_x": rates["kotune (length-sorted)"] / base, "onnx_fp32_x": rates["kotune ONNX fp32"] / base,
                   "int8_x": rates["kotune ONNX int8"] / base, "threads": threads}


def int8_quality(a, f: dict, run_dir: str) -> dict:
    """The trained mini bi-encoder's KLUE STS dev Spearman from its fp32 and int8 ONNX exports."""
    from transformers import AutoTokenizer

    from heads.model.kotune_model import KotuneModel
    from tasks.sentence_embedding import unique_texts

    model = KotuneModel.load(os.path.join(run_dir, "model")).eval()
    tokenizer = AutoTokenizer.from_pretrained(os.path.join(run_dir, "model"))
    task, examples, _ = dev_set(f["dev"], tokenizer, a.max_length)

    texts = unique_texts(examples)
    paths = onnx_files(model, os.path.join(a.out, "int8_quality"))
    threads = torch.get_num_threads()
    return {k: task.score_vectors(onnx_vectors(onnx_session(p, threads), tokenizer, texts, a.max_length).tolist(),
                                  examples)["spearman"] for k, p in paths.items()}


def main() -> None:
    a = arguments()
    if not a.model_dir:
        raise SystemExit("--model-dir DIR is needed (the mini encoder: python -m bench.pretrain_gain --only-pretrain)")
    f = files(a)
    seeds = [int(s) for s in str(a.seeds).split(",")]
    q_lines, q = quality(a, f, seeds)
    i8 = int8_quality(a, f, q["rows"]["pretrained"]["run"])
    s_lines, s = speed(a, f)
    print("\n".join(q_lines), "\n", "\n".join(s_lines), sep="\n")
    print(f"\nint8 ONNX of the trained mini bi-encoder (seed {seeds[0]}): Spearman {i8['int8']:.2f} vs fp32 "
          f"{i8['fp32']:.2f} ({i8['int8'] - i8['fp32']:+.2f})")
    met = {"kotune_1.5x": s["kotune_x"] >= 1.5, "int8_3x": s["int8_x"] >= 3 and abs(i8["int8"] - i8["fp32"]) <= 1}
    print(f"targets: kotune fp32 >= 1.5x: {'met' if met['kotune_1.5x'] else 'not met'}; int8 >= 3x within 1 point: "
          f"{'met' if met['int8_3x'] else 'not met'}")
    pre, ran = q["rows"]["pretrained"], q["rows"]["random"]
    print(f"RESULT embeddings pretrained_trained={np.mean(pre['trained']):.2f} pretrained_best_frozen="
          f"{np.mean(pre['frozen'][pre['best']]):.2f} random_trained={np.mean(ran['trained']):.2f} "
          f"random_best_frozen={np.mean(ran['frozen'][ran['best']]):.2f} twin_gain={q['twin_gain']['mean']:.2f}"
          f"±{q['twin_gain']['se']:.2f} kotune_x={s['kotune_x']:.2f} onnx_fp32_x={s['onnx_fp32_x']:.2f} "
          f"int8_x={s['int8_x']:.2f} int8_spearman_drop={i8['fp32'] - i8['int8']:.2f} seeds={len(seeds)}")


if __name__ == "__main__":
    main()
