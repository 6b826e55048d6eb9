"""``attnmt import`` and ``attnmt export --to huggingface``: a Hugging Face Marian folder (OPUS-MT) read
into an attnmt checkpoint, and an attnmt Transformer written as one. ``marian.py`` holds the mapping.

The folder is what ``MarianMTModel.save_pretrained`` and ``MarianTokenizer.save_pretrained`` write:
``config.json`` (``model_type: marian``), ``model.safetensors`` or ``pytorch_model.bin``, ``source.spm``,
``target.spm``, ``vocab.json`` (and ``target_vocab.json`` with separate vocabularies),
``tokenizer_config.json``. It is read with ``safetensors``, torch's weights-only loader and
sentencepiece: no ``transformers`` at run time, and nothing is downloaded. Any problem is a
CheckpointError (exit 4) naming the file, raised before anything is written.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, StrictBool, ValidationError, field_validator

from .. import __version__
from ..config.describe import describe
from ..config.jsonfile import read_json, regular_bytes
from ..config.schema import Config
from ..data.piece_map import PieceMap
from ..data.tokenizer import Tokenizer
from ..errors import CheckpointError, ConfigError
from . import build_model
from .checkpoint import FORMAT, bytes_tensor, fingerprint
from .footprint import check_fits
from .marian import marian_config, model_section, to_attnmt, vocab_order

HUB_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
LANGUAGE_TOKEN = re.compile(r"^>>([A-Za-z][A-Za-z0-9_-]*)<<$")


@dataclass
class MarianFolder:
    hf: dict  # config.json
    tokenizer_config: TokenizerConfig
    state: dict[str, torch.Tensor]
    source_spm: bytes
    target_spm: bytes
    vocab: dict[str, int]
    target_vocab: dict[str, int] | None  # separate vocabularies only


def _json(path: Path, required: bool = True) -> dict:
    """A JSON object of the folder (``config/jsonfile.py``: a pipe or a device refused at once, deep
    nesting and oversized numbers refused); {} for an optional file that is not there."""
    missing = ("missing (a Marian folder has config.json, model.safetensors or pytorch_model.bin, "
               "source.spm, target.spm, vocab.json)") if required else None
    return read_json(path, CheckpointError, dict, missing) or {}


class TokenizerConfig(BaseModel):
    """The fields of ``tokenizer_config.json`` that the import reads (null or not there: the default)."""

    model_config = ConfigDict(extra="ignore")
    unk_token: str | None = None
    eos_token: str | None = None
    pad_token: str | None = None
    source_lang: str | None = None
    target_lang: str | None = None
    separate_vocabs: StrictBool | None = None

    @field_validator("unk_token", "eos_token", "pad_token", mode="before")
    @classmethod
    def _added_token(cls, value: object) -> object:
        """An older ``save_pretrained`` writes a special token as an ``AddedToken``: its ``content``."""
        return value.get("content") if isinstance(value, dict) else value


def _bytes(path: Path) -> bytes:
    try:
        return regular_bytes(path, CheckpointError)
    except FileNotFoundError:
        raise CheckpointError(f"{path}: missing (a Marian folder has source.spm and target.spm)") from None


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    """The state dict from ``model.safetensors``, else ``pytorch_model.bin`` (weights only)."""
    for name in ("model.safetensors", "pytorch_model.bin"):
        if (folder / name).exists() and not (folder / name).is_file():  # a pipe would block the reader
            raise CheckpointError(f"{folder / name}: not a regular file (a folder, a pipe or a device)")
    path = folder / "model.safetensors"
    try:
        if path.is_file():
            from safetensors.torch import load_file

            return load_file(str(path), device="cpu")
        path = folder / "pytorch_model.bin"
        if not path.is_file():
            raise CheckpointError(f"{folder}: no model.safetensors or pytorch_model.bin")
        state = torch.load(path, map_location="cpu", weights_only=True)
    except CheckpointError:
        raise
    except Exception as e:  # a truncated or damaged file: safetensors' and torch's own errors
        cause = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise CheckpointError(f"{path}: unreadable weights ({cause[:160]})") from None
    if not isinstance(state, dict) or not all(isinstance(t, torch.Tensor) for t in state.values()):
        raise CheckpointError(f"{path}: not a mapping of names to tensors")
    return state


def read_folder(folder: Path) -> MarianFolder:
    """The files of a Marian folder, checked enough to convert."""
    folder = Path(folder)
    if not folder.exists():
        hint = (f"; attnmt downloads nothing: fetch it first (hf download {folder} --local-dir "
                f"{folder.name}) and give that folder" if HUB_NAME.match(str(folder)) else "")
        raise CheckpointError(f"{folder}: no such folder{hint}")
    if not folder.is_dir():
        raise CheckpointError(f"{folder}: not a folder; give the Marian model's folder (config.json, ...)")
    hf = _json(folder / "config.json")
    if hf.get("model_type") != "marian":
        raise CheckpointError(f"{folder / 'config.json'}: model_type is {hf.get('model_type')!r}; attnmt "
                              "imports Marian models (OPUS-MT), model_type marian")
    marian_config(hf, str(folder / "config.json"))  # its fields checked before the weights are read
    tc = _tokenizer_config(folder / "tokenizer_config.json")
    vocab = _vocab(folder / "vocab.json")
    target_vocab = _vocab(folder / "target_vocab.json") if tc.separate_vocabs else None
    return MarianFolder(hf, tc, _weights(folder), _bytes(folder / "source.spm"),
                        _bytes(folder / "target.spm"), vocab, target_vocab)


def _tokenizer_config(path: Path) -> TokenizerConfig:
    try:
        return TokenizerConfig.model_validate(_json(path, required=False))
    except ValidationError as e:
        raise CheckpointError(describe(e, str(path), {}, [], TokenizerConfig)) from None


def _vocab(path: Path) -> dict[str, int]:
    vocab = _json(path)
    if not all(type(i) is int for i in vocab.values()):
        raise CheckpointError(f"{path}: every piece must map to an integer id")
    return vocab


def piece_map(m: MarianFolder, where: Path) -> PieceMap:
    """The attnmt order of both sides' vocabularies (``marian.vocab_order``)."""
    tc, hf = m.tokenizer_config, marian_config(m.hf, str(where / "config.json"))
    unk, eos, pad = tc.unk_token or "<unk>", tc.eos_token or "</s>", tc.pad_token or "<pad>"
    ids = {k: getattr(hf, k) for k in ("pad_token_id", "eos_token_id", "decoder_start_token_id")}
    target = m.target_vocab or m.vocab
    name = where / ("target_vocab.json" if m.target_vocab else "vocab.json")
    if unk not in target:
        raise CheckpointError(f"{name}: has no {unk} piece")
    tgt_pieces, tgt_ids = vocab_order(target, ids["pad_token_id"], target[unk], ids["decoder_start_token_id"],
                                      ids["eos_token_id"], str(name))
    if m.target_vocab is None:
        return PieceMap(tgt_pieces, tgt_pieces, tgt_ids, tgt_ids)
    missing = [p for p in (unk, eos, pad) if p not in m.vocab]
    if missing:
        raise CheckpointError(f"{where / 'vocab.json'}: has no {missing[0]} piece")
    src_pieces, src_ids = vocab_order(m.vocab, m.vocab[pad], m.vocab[unk], m.vocab[pad], m.vocab[eos],
                                      str(where / "vocab.json"))
    return PieceMap(src_pieces, tgt_pieces, src_ids, tgt_ids)


def imported_config(m: MarianFolder, where: Path) -> dict:
    """The attnmt config of an imported model: its model section, its languages and target-language tokens,
    no training corpus."""
    tc = m.tokenizer_config
    codes = {match[1]: p for p in (m.target_vocab or m.vocab) if (match := LANGUAGE_TOKEN.match(p))}
    data: dict[str, Any] = {"src_lang": tc.source_lang or "src", "tgt_lang": tc.target_lang or "tgt"}
    if codes:
        data["target_tokens"] = dict(sorted(codes.items()))
    return {"model": model_section(m.hf, str(where / "config.json")), "data": data,
            "tokenizer": {"joint": m.target_vocab is None},
            "train": {"run_dir": str(Path.cwd() / "runs" / where.name)}}


def import_marian(folder: Path) -> dict[str, Any]:
    """The checkpoint payload of the Marian model in ``folder`` (nothing written)."""
    from ..config.schema import config_from_dict

    folder = Path(folder)
    m = read_folder(folder)
    pieces = piece_map(m, folder)
    try:
        cfg = config_from_dict(imported_config(m, folder), source=f"{folder} (as an attnmt config)")
    except ConfigError as e:
        raise CheckpointError(f"{folder}: not a model attnmt can represent: {e}") from None
    try:
        tokenizer = Tokenizer(m.source_spm, m.target_spm, joint=cfg.tokenizer.joint, pieces=pieces.to_bytes())
    except RuntimeError as e:
        raise CheckpointError(f"{folder}: source.spm or target.spm is not a sentencepiece model "
                              f"({str(e).splitlines()[0]})") from None
    state = to_attnmt(m.state, cfg.model, pieces, str(folder))
    with torch.device("meta"):  # names and shapes only: no weights drawn to be overwritten
        model = build_model(cfg.model, tokenizer.src_vocab_size, tokenizer.tgt_vocab_size)
    check_fits(model, folder / "config.json")  # what every load of the checkpoint will build
    try:
        model.load_state_dict(state, strict=True, assign=True)
    except RuntimeError as e:
        raise CheckpointError(f"{folder}: weights do not fit its config.json: "
                              f"{str(e).splitlines()[0][:200]}") from None
    for name, tensor in state.items():
        if not bool(torch.isfinite(tensor).all()):
            raise CheckpointError(f"{folder}: weight {name} holds non-finite values")
    settings = cfg.tokenizer.model_dump(mode="json", exclude={"sampling"})
    return {
        "format": FORMAT, "attnmt_version": __version__, "torch_version": str(torch.__version__),
        "model": state, "optimizer": None, "schedule": None, "scaler": None,
        "progress": {"step": 0, "epoch": 0},
        "fingerprint": fingerprint(cfg, 1, tokenizer, []),
        "config": cfg.to_dict(),
        "tokenizer": {name: bytes_tensor(data) for name, data in tokenizer.files().items()},
        "tokenizer_meta": tokenizer.meta(settings),
        "imported_from": {"folder": str(folder.resolve()), "name": str(m.hf.get("_name_or_path") or "")},
    }


# ------------------------------------------------------------------------------------------ export

def _unrepresentable(m) -> str | None:
    """Why a model config is not a Marian model, or None."""
    if m.arch != "transformer":
        return f"model.arch is {m.arch}; a Marian model is a Transformer"
    wanted = {"norm": "post", "positions": "sinusoidal_concat", "heads": "full"}
    for key, value in wanted.items():
        if getattr(m, key) != value:
            return f"model.{key} is {getattr(m, key)}; a Marian model has {value}"
    for key in ("enc_kernel", "dec_kernel"):
        if getattr(m, key) not in ("sdpa", "math"):
            return f"model.{key} is {getattr(m, key)}; a Marian model has exact softmax attention (sdpa)"
    return None


def marian_files(model, cfg, tokenizer: Tokenizer) -> dict[str, bytes]:
    """The files of a Marian folder for an attnmt Transformer, its tokenizer and config."""
    from safetensors.torch import save as save_safetensors

    from ..config.specials import BOS_ID, EOS_ID, PAD_ID, UNK_ID
    from .marian import identity_pieces, to_marian

    pieces = tokenizer.map or identity_pieces(tokenizer.src_pieces(list(range(tokenizer.src_vocab_size))),
                                              tokenizer.tgt_pieces(list(range(tokenizer.tgt_vocab_size))))
    t = pieces.target_ids
    start, eos = t[BOS_ID], t[EOS_ID]
    pad = start if t[PAD_ID] < 0 else t[PAD_ID]
    separate = not cfg.tokenizer.joint
    vocab = {p: i for p, i in zip(pieces.source, pieces.source_ids) if i >= 0}
    target = {p: i for p, i in zip(pieces.target, pieces.target_ids) if i >= 0}
    m, ids = cfg.model, {"pad_token_id": pad, "eos_token_id": eos, "decoder_start_token_id": start}
    config = {
        "model_type": "marian", "architectures": ["MarianMTModel"], "vocab_size": len(vocab),
        "decoder_vocab_size": len(target), "d_model": m.d_model, "encoder_layers": m.enc_layers,
        "decoder_layers": m.dec_layers, "encoder_attention_heads": m.n_heads,
        "decoder_attention_heads": m.n_heads,
        "encoder_ffn_dim": m.d_ff, "decoder_ffn_dim": m.d_ff,
        "activation_function": "swish" if m.activation == "silu" else m.activation,
        "scale_embedding": m.scale_embeddings, "max_position_embeddings": m.max_positions,
        "dropout": m.dropout, "attention_dropout": m.attn_dropout, "activation_dropout": 0.0,
        "share_encoder_decoder_embeddings": m.share_embeddings, "tie_word_embeddings": m.tie_output,
        "is_encoder_decoder": True, "forced_eos_token_id": eos, **ids}
    banned = [[pad]] + ([[start]] if start != pad else [])
    generation = {**ids, "forced_eos_token_id": eos, "bad_words_ids": banned, "max_length": 512,
                  "num_beams": cfg.decode.beam_size}
    data = cfg.data
    tc = {"tokenizer_class": "MarianTokenizer", "source_lang": data.src_lang, "target_lang": data.tgt_lang,
          "unk_token": pieces.target[UNK_ID], "eos_token": pieces.target[EOS_ID],
          "pad_token": pieces.target[PAD_ID if t[PAD_ID] >= 0 else BOS_ID], "separate_vocabs": separate,
          "model_max_length": 512}

    def text(value) -> bytes:
        return (json.dumps(value, indent=2, ensure_ascii=False) + "\n").encode("utf-8")

    weights = to_marian(model.state_dict(), m, pieces)
    return {"config.json": text(config), "generation_config.json": text(generation),
            "tokenizer_config.json": text(tc), "vocab.json": text(vocab),
            **({"target_vocab.json": text(target)} if separate else {}),
            "source.spm": tokenizer.src_model, "target.spm": tokenizer.tgt_model,
            "model.safetensors": save_safetensors(weights, metadata={"format": "pt"})}


def export_marian(model_path: Path, out: Path) -> tuple[Path, Config]:
    """Write MODEL as a Marian folder ``out`` (new or empty, written whole); returns the checkpoint read and
    its config. A model no Marian folder represents is a ConfigError naming the key; an alignment layer
    (``train.alignment.module: layer``) has no place in one and is left out."""
    from ..runfiles import check_new_folder, publish_folder
    from .checkpoint import load_model

    out = Path(out)
    check_new_folder(out)  # before the model is read
    model, tokenizer, cfg, checkpoint = load_model(model_path, "cpu")
    why = _unrepresentable(cfg.model)
    if why is not None:
        raise ConfigError(f"{checkpoint}: cannot export to huggingface: {why}")
    files = marian_files(model, cfg, tokenizer)

    def fill(tmp: Path) -> None:
        for name, data in files.items():
            (tmp / name).write_bytes(data)

    publish_folder(out, fill)
    return checkpoint, cfg
