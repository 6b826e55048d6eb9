"""A tiny OPUS-MT-like model for the import oracles: a ``MarianMTModel`` with random weights and a pair of
sentencepiece models trained on the toy task, saved as ``save_pretrained`` saves a real one. Built with
``transformers`` (a test dependency; attnmt itself never imports it)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import sentencepiece as spm
import torch

from attnmt.data.toy import toy_pairs

LANG_TOKENS = [">>deu<<", ">>nld<<"]


def _spm(lines: list[str], size: int) -> bytes:
    out = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=out, vocab_size=size,
                                   model_type="unigram", character_coverage=1.0, minloglevel=2,
                                   num_threads=1)
    return out.getvalue()


def make_marian(folder: Path, *, multilingual: bool = False, separate: bool = False, seed: int = 0,
                d_model: int = 32, layers: int = 2, heads: int = 4, ffn: int = 64, init_std: float = 0.2,
                eos_bias: float = 0.0) -> Path:
    """Write a tiny Marian folder into ``folder``; returns it. ``eos_bias``: added to eos's logit bias, so
    that the random model ends its sentences (a search that ends by itself, not at a length limit)."""
    from transformers import MarianConfig, MarianMTModel, MarianTokenizer

    pairs = toy_pairs("train", 400, seed=1)
    src_model, tgt_model = _spm([p[0] for p in pairs], 120), _spm([p[1] for p in pairs], 120)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "source.spm").write_bytes(src_model)
    (folder / "target.spm").write_bytes(tgt_model)
    pieces = {}
    for model in (src_model, tgt_model):
        sp = spm.SentencePieceProcessor(model_proto=model)
        pieces.update((sp.id_to_piece(i), None) for i in range(3, sp.get_piece_size()))
    specials = ["</s>", "<unk>"] + (LANG_TOKENS if multilingual else [])
    # zzzunused: a piece no sentencepiece model makes
    vocab = {p: i for i, p in enumerate(specials + [p for p in pieces if p not in specials]
                                        + ["zzzunused", "<pad>"])}
    (folder / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    target_size = len(vocab)
    if separate:
        target = {"</s>": 0, "<unk>": 1}
        sp = spm.SentencePieceProcessor(model_proto=tgt_model)
        target.update((sp.id_to_piece(i), i - 1) for i in range(3, sp.get_piece_size()))
        target["<pad>"] = len(target)
        (folder / "target_vocab.json").write_text(json.dumps(target, ensure_ascii=False), encoding="utf-8")
        target_size = len(target)
    pad = target_size - 1
    torch.manual_seed(seed)
    config = MarianConfig(
        vocab_size=len(vocab), decoder_vocab_size=target_size, d_model=d_model, encoder_layers=layers,
        decoder_layers=layers, encoder_attention_heads=heads, decoder_attention_heads=heads,
        encoder_ffn_dim=ffn, decoder_ffn_dim=ffn, activation_function="swish", scale_embedding=True,
        max_position_embeddings=128, pad_token_id=pad, eos_token_id=0, decoder_start_token_id=pad,
        forced_eos_token_id=0, share_encoder_decoder_embeddings=not separate, init_std=init_std,
        dropout=0.1, attention_dropout=0.0, activation_dropout=0.0)
    model = MarianMTModel(config).eval()
    with torch.no_grad():
        model.final_logits_bias.normal_(0, 0.5)
        model.final_logits_bias[0, 0] += eos_bias
    model.save_pretrained(folder)
    files = [str(folder / name) for name in ("source.spm", "target.spm", "vocab.json")]
    target_file = {"target_vocab_file": str(folder / "target_vocab.json")} if separate else {}
    tokenizer = MarianTokenizer(*files, source_lang="en", target_lang="de", separate_vocabs=separate,
                                **target_file)
    tokenizer.save_pretrained(folder)
    return folder
