"""What ``attnmt study`` measures of a trained variant (its run's metrics, its translations of the dev and
test splits, one sentence's attention) and of the kernels alone (``growth.py``, resumed kernel by kernel)."""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from ..config.jsonfile import read_json, read_json_lines
from ..data.batching import load_split
from ..decoding.metrics import corpus_scores
from ..decoding.translator import DecodeOverrides, Translator
from ..errors import DataError
from ..insight.attention_maps import teacher_forced_attention
from ..models.checkpoint import load_model
from ..runfiles import RunDir, atomic_write_text
from ..training.distributed import choose_device
from ..training.runstart import chosen_precision
from .growth import measure_growth

HEATMAP_SENTENCE = 0  # the dev sentence whose attention every variant shows


def read_metrics(run: RunDir) -> dict[str, Any]:
    """From the run's ``metrics.jsonl``: steps, training minutes, the median training tokens/s, and the dev
    BLEU curve ``[[minutes, bleu, step], ...]``."""
    records = read_json_lines(run.metrics, DataError)
    train = [r for r in records if r["event"] == "train"]
    valid = [r for r in records if r["event"] == "valid" and not r.get("averaged")]
    speeds = [r["tokens_per_s"] for r in train]
    return {
        "steps": max((r.get("step", 0) for r in records), default=0),
        "train_minutes": round(max((r.get("elapsed_s", 0.0) for r in records), default=0.0) / 60, 2),
        "train_tokens_per_s": round(statistics.median(speeds), 1) if speeds else None,
        "curve": [[round(r["elapsed_s"] / 60, 3), round(r["bleu"], 2), r["step"]] for r in valid],
    }


def translate_split(translator: Translator, split, tgt_lang: str) -> dict[str, Any]:
    """BLEU and chrF of the split's translations, and how fast they came (sentences/s, one process)."""
    started = time.perf_counter()
    hyps = translator.search(list(split.src_ids))
    texts = translator.tokenizer.decode_tgt([found[0].tokens for found in hyps])
    seconds = time.perf_counter() - started
    scores = corpus_scores(texts, [split.tgt_text], ("bleu", "chrf"), tgt_lang=tgt_lang)
    return {"bleu": round(scores["bleu"].score, 2), "chrf": round(scores["chrf"].score, 2),
            "bleu_signature": scores["bleu"].signature, "sentences": len(texts),
            "decode_s": round(seconds, 2), "sentences_per_s": round(len(texts) / max(seconds, 1e-9), 1),
            "first": texts[0] if texts else ""}


def sentence_attention(model, tokenizer, split, index: int, device) -> dict[str, Any]:
    """One dev pair read under teacher forcing on its reference: the last layer's cross-attention and (a
    Transformer) the first layer's encoder self-attention, heads averaged, with their piece labels."""
    src, tgt = list(split.src_ids[index]), list(split.tgt_ids[index])
    maps = teacher_forced_attention(model, [src], [tgt], device)[0]
    src_pieces = tokenizer.src_pieces(src) + ["</s>"]
    found = {"src": src_pieces, "tgt": tokenizer.tgt_pieces(tgt) + ["</s>"],
             "cross": maps["cross"][-1].mean(axis=0).round(4).tolist()}
    if "enc_self" in maps:
        found["enc_self"] = maps["enc_self"][0].mean(axis=0).round(4).tolist()
    return found


def measure_variant(study, name: str, label: str, peak_mib: float) -> dict[str, Any]:
    """A finished variant's record for ``results.json`` (``study``: a ``study.Study``): its run's metrics,
    dev and test scores with the best checkpoint (``--beam-size``), decoding speed and one sentence's
    attention."""
    run = study.run(name)
    device = choose_device(study.base.train.device)
    model, tokenizer, cfg, path = load_model(run.root, device)
    decode = DecodeOverrides(study.beam_size).apply(cfg.decode, tokenizer.tgt_vocab_size)
    translator = Translator(model, tokenizer, decode, device)
    record: dict[str, Any] = {"label": label, "arch": cfg.model.arch,
                              "model": cfg.model.model_dump(mode="json"), "checkpoint": path.name,
                              "peak_rss_mib": round(peak_mib, 1), "device": str(device),
                              "precision": chosen_precision(cfg.train.precision, device),
                              "parameters": sum(p.numel() for p in model.parameters()), **read_metrics(run)}
    tgt_lang = study.base.data.tgt_lang
    with torch.inference_mode():
        for split_name in ("dev", "test"):
            split = load_split(study.prepared, split_name)
            record[split_name] = translate_split(translator, split, tgt_lang)
    record["decode_sentences_per_s"] = record["test"]["sentences_per_s"]
    dev = load_split(study.prepared, "dev")
    index = min(HEATMAP_SENTENCE, len(dev) - 1)
    record["attention"] = sentence_attention(model, tokenizer, dev, index, device)
    return record


def update_growth(path: Path, kernels: Sequence[str], lengths: Sequence[int],
                  say: Callable[[str], None] = print, repeats: int = 3) -> dict[str, Any]:
    """``growth.json`` with every kernel in ``kernels`` measured at ``lengths``: kernels it holds at the same
    lengths are kept, the others measured and added one at a time (the file rewritten after each)."""
    stored = read_json(path, DataError, missing=None) or {}
    if stored.get("lengths") != list(lengths) or stored.get("repeats") != repeats:
        stored = {}
    for kernel in kernels:
        if kernel in stored.get("values", {}):
            continue
        say(f"growth: {kernel} at lengths {lengths[0]}..{lengths[-1]}")
        growth = measure_growth([kernel], lengths, repeats).to_json()
        if not stored:
            stored = {**growth, "repeats": repeats, "values": {}, "exponents": {}, "claimed": {}}
        for key in ("values", "exponents", "claimed"):
            stored[key][kernel] = growth[key][kernel]
        atomic_write_text(path, json.dumps(stored, indent=1) + "\n")
    return stored
