"""OPUS-MT (Marian) models as attnmt Transformers: the config, the vocabulary's order and the weights' names,
both ways. ``marian_io.py`` reads and writes the folders; this module only maps.

A Marian model is a post-norm Transformer with no final norm, swish (SiLU) activations, embeddings scaled by
sqrt(d_model), sinusoids with all sines before all cosines, a bias on the logits (``final_logits_bias``),
and decoding that starts from its pad id. The first five are model options of attnmt's Transformer
(``config/model.py``). The last is a matter of ids: attnmt's specials are fixed (pad 0, unk 1, bos 2, eos
3), so the import puts the Marian vocabulary in that order, with Marian's decoder start (its pad) in
attnmt's bos place. attnmt's pad is then a row of its own that Marian lacks: zero embedding, and a logit
bias of ``DEAD_LOGIT`` so that it takes no probability (e^-100 of it, about 4e-44) and every other
log-probability is Marian's. A model whose decoder starts from a token of its own (an attnmt export) needs
no such row.
"""

from __future__ import annotations

from typing import Annotated, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, StrictBool, ValidationError

from ..config.describe import describe
from ..config.model import Probability
from ..data.piece_map import UNUSED, PieceMap
from ..errors import CheckpointError

DEAD_LOGIT = -100.0
ACTIVATIONS = {"swish": "silu", "silu": "silu", "gelu": "gelu", "relu": "relu"}
# Marian's names per attnmt layer: (attnmt suffix, Marian suffix), projections with weight and bias.
ATTENTION = [(f"{p}_proj", f"{p}_proj") for p in ("q", "k", "v", "out")]
ENCODER_LAYER = ([(f"self_attn.{a}", f"self_attn.{m}") for a, m in ATTENTION]
                 + [("sub_attn.norm", "self_attn_layer_norm"), ("ffn.0", "fc1"), ("ffn.3", "fc2"),
                    ("sub_ffn.norm", "final_layer_norm")])
DECODER_LAYER = ([(f"self_attn.{a}", f"self_attn.{m}") for a, m in ATTENTION]
                 + [(f"cross_attn.{a}", f"encoder_attn.{m}") for a, m in ATTENTION]
                 + [("sub_self.norm", "self_attn_layer_norm"), ("sub_cross.norm", "encoder_attn_layer_norm"),
                    ("ffn.0", "fc1"), ("ffn.3", "fc2"), ("sub_ffn.norm", "final_layer_norm")])


# Bounds on the sizes an imported config.json may give. Far past any OPUS-MT model (d_model 512 or 1024,
# 6 to 12 layers, 8 or 16 heads, ffn 2048 or 4096, 512 positions): a value past them is a damaged or hostile
# file, not a model. Each is also a memory bound: the sinusoid table that every load builds holds
# max_position_embeddings x d_model floats (at these bounds 65,536 x 1,024 is 256 MiB; 2^31 would be 8 TiB),
# and what the whole model needs is checked against the machine's memory too (``checkpoint.check_fits``).
MAX_WIDTH = 1 << 16  # d_model, encoder_ffn_dim, decoder_ffn_dim
MAX_LAYERS = 256  # encoder_layers, decoder_layers
MAX_POSITIONS = 1 << 16  # max_position_embeddings: the longest sentence in pieces
MAX_ID = (1 << 31) - 1  # pad_token_id, eos_token_id, decoder_start_token_id: int32 ids

Width = Annotated[int, Field(strict=True, ge=1, le=MAX_WIDTH)]
Layers = Annotated[int, Field(strict=True, ge=1, le=MAX_LAYERS)]
TokenId = Annotated[int, Field(strict=True, ge=0, le=MAX_ID)]
Flag = StrictBool | None  # None (null, or not there): the default


class MarianConfig(BaseModel):
    """The fields of a Marian ``config.json`` that the import reads, typed and bounded (the others are not
    read)."""

    model_config = ConfigDict(extra="ignore")
    d_model: Width
    encoder_layers: Layers
    decoder_layers: Layers
    encoder_attention_heads: Width
    decoder_attention_heads: Width
    encoder_ffn_dim: Width
    decoder_ffn_dim: Width
    max_position_embeddings: Annotated[int, Field(strict=True, ge=1, le=MAX_POSITIONS)]
    activation_function: Literal["swish", "silu", "gelu", "relu"]
    dropout: Probability = 0.1
    attention_dropout: Probability = 0.0
    scale_embedding: Flag = None
    share_encoder_decoder_embeddings: Flag = None
    tie_word_embeddings: Flag = None
    normalize_before: Flag = None
    add_final_layer_norm: Flag = None
    normalize_embedding: Flag = None
    pad_token_id: TokenId
    eos_token_id: TokenId
    decoder_start_token_id: TokenId


def marian_config(hf: dict, where: str) -> MarianConfig:
    """``hf`` (a ``config.json``) checked; a CheckpointError ``where: key: what is wrong`` otherwise."""
    try:
        return MarianConfig.model_validate(hf)
    except ValidationError as e:
        raise CheckpointError(describe(e, where, {}, [], MarianConfig)) from None


def model_section(hf: dict, where: str) -> dict:
    """attnmt's ``model`` section for a Marian ``config.json`` (``hf``); a CheckpointError naming the key
    that is missing, out of its bounds, or that attnmt's Transformer cannot represent."""
    c = marian_config(hf, where)
    for a, b in (("encoder_attention_heads", "decoder_attention_heads"),
                 ("encoder_ffn_dim", "decoder_ffn_dim")):
        if getattr(c, a) != getattr(c, b):
            raise CheckpointError(f"{where}: {a} ({getattr(c, a)}) differs from {b} ({getattr(c, b)}); "
                                  "attnmt's Transformer has one value for both")
    if c.normalize_before or c.add_final_layer_norm or c.normalize_embedding:
        raise CheckpointError(f"{where}: a pre-norm Marian (normalize_before, add_final_layer_norm or "
                              "normalize_embedding) is not OPUS-MT's architecture; attnmt reads post-norm "
                              "ones")
    return {
        "arch": "transformer", "d_model": c.d_model, "n_heads": c.encoder_attention_heads,
        "enc_layers": c.encoder_layers, "dec_layers": c.decoder_layers, "d_ff": c.encoder_ffn_dim,
        "dropout": c.dropout, "attn_dropout": c.attention_dropout,
        "activation": ACTIVATIONS[c.activation_function], "norm": "post", "positions": "sinusoidal_concat",
        "max_positions": c.max_position_embeddings, "scale_embeddings": bool(c.scale_embedding),
        "share_embeddings": c.share_encoder_decoder_embeddings is not False,
        "tie_output": c.tie_word_embeddings is not False, "output_bias": True,
    }


def vocab_order(vocab: dict[str, int], pad: int, unk: int, start: int, eos: int,
                where: str) -> tuple[list[str], list[int]]:
    """The pieces and the Marian ids of attnmt's ids 0, 1, ...: Marian's pad (or a row the import adds,
    when decoding starts from pad), unk, decoder start, eos, then every other id in order."""
    ids = sorted(vocab.values())
    if ids != list(range(len(ids))):
        raise CheckpointError(f"{where}: its ids are not 0 .. {len(ids) - 1}, each once")
    for name, i in (("pad", pad), ("unk", unk), ("decoder start", start), ("eos", eos)):
        if not 0 <= i < len(ids):
            raise CheckpointError(f"{where}: the {name} id {i} is not in the vocabulary of {len(ids)} pieces")
    if len({unk, start, eos}) < 3 or pad in (unk, eos):
        raise CheckpointError(f"{where}: unk, eos and the decoder start (pad) must be different pieces")
    piece = {i: p for p, i in vocab.items()}
    specials = [-1 if start == pad else pad, unk, start, eos]
    order = specials + [i for i in ids if i not in specials]
    return [UNUSED if i < 0 else piece[i] for i in order], order


def reorder(rows: torch.Tensor, order: list[int], fill: float = 0.0) -> torch.Tensor:
    """``rows`` (V, ...) in attnmt's order; a row the import adds (-1) holds ``fill``."""
    index = torch.tensor([max(i, 0) for i in order])
    out = rows.index_select(0, index).clone()
    out[torch.tensor([i < 0 for i in order])] = fill
    return out


def restore(rows: torch.Tensor, order: list[int]) -> torch.Tensor:
    """The inverse of ``reorder``: attnmt's rows back in the Marian ids' order, added rows dropped."""
    kept = [(marian, mine) for mine, marian in enumerate(order) if marian >= 0]
    out = rows.new_empty((len(kept), *rows.shape[1:]))
    out[torch.tensor([m for m, _ in kept])] = rows[torch.tensor([a for _, a in kept])]
    return out


def layer_names(cfg) -> list[tuple[str, str]]:
    """(attnmt name, Marian name) of every weight and bias inside the layers."""
    names = []
    for side, count, table in (("encoder", cfg.enc_layers, ENCODER_LAYER), ("decoder", cfg.dec_layers,
                                                                          DECODER_LAYER)):
        for i in range(count):
            for mine, theirs in table:
                for kind in ("weight", "bias"):
                    names.append((f"{side}.{i}.{mine}.{kind}", f"model.{side}.layers.{i}.{theirs}.{kind}"))
    return names


def to_attnmt(state: dict[str, torch.Tensor], cfg, pieces: PieceMap, where: str) -> dict[str, torch.Tensor]:
    """attnmt's state dict from a Marian one (``model.`` names, tied weights possibly left out)."""
    def get(*names: str) -> torch.Tensor:
        for name in names:
            if name in state:
                return state[name].float()
        raise CheckpointError(f"{where}: the weights lack {names[0]}")

    shared = get("model.shared.weight", "model.encoder.embed_tokens.weight")
    src = shared if cfg.share_embeddings else get("model.encoder.embed_tokens.weight", "model.shared.weight")
    tgt = shared if cfg.share_embeddings else get("model.decoder.embed_tokens.weight")
    for name, table, side in (("source", src, pieces.source_ids), ("target", tgt, pieces.target_ids)):
        known = sum(1 for i in side if i >= 0)
        if table.shape != (known, cfg.d_model):
            raise CheckpointError(f"{where}: the {name} vocabulary has {known} pieces but its embedding is "
                                  f"{tuple(table.shape)} (expected ({known}, {cfg.d_model}))")
    out = {"src_embed.weight": reorder(src, pieces.source_ids)}
    out["tgt_embed.weight"] = (out["src_embed.weight"] if cfg.share_embeddings  # one tensor, saved once
                               else reorder(tgt, pieces.target_ids))
    bias = get("final_logits_bias").reshape(-1)
    if bias.numel() != tgt.size(0):
        raise CheckpointError(f"{where}: final_logits_bias has {bias.numel()} entries for {tgt.size(0)} "
                              "pieces")
    out["output.bias"] = reorder(bias, pieces.target_ids, DEAD_LOGIT)
    out["output.weight"] = (out["tgt_embed.weight"] if cfg.tie_output
                            else reorder(get("lm_head.weight"), pieces.target_ids))
    for mine, theirs in layer_names(cfg):
        out[mine] = get(theirs)
    return out


def to_marian(state: dict[str, torch.Tensor], cfg, pieces: PieceMap) -> dict[str, torch.Tensor]:
    """A Marian state dict (as ``save_pretrained`` writes it: tied weights once) from attnmt's."""
    tgt = restore(state["tgt_embed.weight"], pieces.target_ids)
    out = {"model.shared.weight": tgt} if cfg.share_embeddings else {
        "model.encoder.embed_tokens.weight": restore(state["src_embed.weight"], pieces.source_ids),
        "model.decoder.embed_tokens.weight": tgt}
    bias = state.get("output.bias")
    out["final_logits_bias"] = (restore(bias, pieces.target_ids) if bias is not None
                                else torch.zeros(tgt.size(0)))[None, :]
    if not cfg.tie_output:
        out["lm_head.weight"] = restore(state["output.weight"], pieces.target_ids)
    for mine, theirs in layer_names(cfg):
        out[theirs] = state[mine]
    return {k: v.detach().float().contiguous() for k, v in out.items()}


def identity_pieces(src: list[str], tgt: list[str]) -> PieceMap:
    """The piece map of an attnmt tokenizer (ids as its sentencepiece models give them)."""
    return PieceMap(src, tgt, list(range(len(src))), list(range(len(tgt))))

