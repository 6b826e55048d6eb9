"""sentencepiece tokenizers: train (BPE or unigram, joint or separate), save with sha256, load, encode.

Special ids are fixed for every model attnmt trains: pad 0, unk 1, bos 2, eos 3 (``specials``, imported
from here as before). A tokenizer folder holds ``spm.model`` (joint) or ``src.model`` and ``tgt.model``,
and ``tokenizer.json`` with the sha256 of each model file; loading checks those hashes before the
sentencepiece C++ loader sees the bytes (``docs/RELIABILITY.md``: crafted models have crashed it). The
tokenizer's hash (``tokenizer_sha256``), one value from those, is what an encoded split and a checkpoint
record of the tokenizer they were made with.
"""

from __future__ import annotations

import hashlib
import io
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..config.jsonfile import read_json
from ..config.schema import TokenizerConfig
from ..config.specials import BOS_ID, EOS_ID, PAD_ID, SPECIAL_PIECES, UNK_ID
from ..errors import CheckpointError, DataError
from .bpe_dropout import BpeDropout, is_bpe, model_spec
from .piece_map import PIECES_FILE, PieceMap, split_code

META_FILE = "tokenizer.json"


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def tokenizer_sha256(src_sha256: str, tgt_sha256: str, pieces_sha256: str | None = None) -> str:
    """The tokenizer's hash: one value from its two models' sha256s (a joint tokenizer's model is both),
    what an encoded split, a tokenizer folder and a checkpoint are compared by (``Tokenizer.sha256``,
    ``folder_sha256``, ``recorded_sha256``). Joint or not does not enter: the same two models give the same
    ids. An imported tokenizer's piece map (``pieces_sha256``) enters too."""
    text = f"{src_sha256}\n{tgt_sha256}" + (f"\n{pieces_sha256}" if pieces_sha256 else "")
    return sha256_bytes(text.encode("ascii"))


def train_model(sentences: Sequence[str], cfg: TokenizerConfig, seed: int = 1,
                symbols: Sequence[str] = ()) -> bytes:
    """Train one sentencepiece model on ``sentences``; returns the serialized model. ``symbols``: control
    tokens (``<2fr>``, tags) that are always one piece of their own (user-defined symbols)."""
    import sentencepiece as spm

    if len(sentences) > cfg.sample_size:
        # Sample here rather than through sentencepiece's input_sentence_size so the result depends
        # only on the seed, not on the C++ library's shuffling.
        sentences = random.Random(seed).sample(list(sentences), cfg.sample_size)
    model = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(sentences),
            model_writer=model,
            model_type=cfg.model_type,
            vocab_size=cfg.vocab_size,
            character_coverage=cfg.character_coverage if cfg.character_coverage is not None else 1.0,
            byte_fallback=bool(cfg.byte_fallback),
            normalization_rule_name=cfg.normalization or "nmt_nfkc",
            hard_vocab_limit=cfg.hard_vocab_limit,
            pad_id=PAD_ID,
            unk_id=UNK_ID,
            bos_id=BOS_ID,
            eos_id=EOS_ID,
            pad_piece=SPECIAL_PIECES[0],
            unk_piece=SPECIAL_PIECES[1],
            bos_piece=SPECIAL_PIECES[2],
            eos_piece=SPECIAL_PIECES[3],
            num_threads=2,
            max_sentence_length=1 << 14,
            minloglevel=2,
            **({"user_defined_symbols": list(symbols)} if symbols else {}),
        )
    except RuntimeError as e:
        message = str(e).split("\n")[0]
        if "smaller than required_chars" in message:  # every character needs a piece of its own
            raise DataError(
                f"tokenizer.vocab_size {cfg.vocab_size} is too small for this corpus: "
                f"{message[message.index('Vocabulary size'):].split('. Increase')[0]}"
                " (raise tokenizer.vocab_size, or lower tokenizer.character_coverage)"
            ) from None
        if "Vocabulary size" in message:
            raise DataError(
                f"tokenizer.vocab_size {cfg.vocab_size} is too large for this corpus: "
                f"{message[message.index('Vocabulary size'):]}"
                " (lower tokenizer.vocab_size, or set tokenizer.hard_vocab_limit: false)"
            ) from None
        raise DataError(f"sentencepiece training failed: {message}") from None
    return model.getvalue()


@dataclass
class Tokenizer:
    """One (joint) or two (separate) sentencepiece models behind one interface; or, for an imported model,
    two sentencepiece models and a ``PieceMap`` that gives the pieces their ids (``joint`` then means one
    vocabulary for both sides)."""

    src_model: bytes
    tgt_model: bytes
    joint: bool
    pieces: bytes | None = None
    """An imported model's ``pieces.json`` (``piece_map.py``); None for a tokenizer attnmt trained."""

    def __post_init__(self) -> None:
        import sentencepiece as spm

        self._src = spm.SentencePieceProcessor(model_proto=self.src_model)
        self._tgt = (self._src if self.joint and self.pieces is None
                     else spm.SentencePieceProcessor(model_proto=self.tgt_model))
        self._samplers: dict[str, BpeDropout | np.ndarray] = {}  # each side's, for ``sample``
        self.map = None if self.pieces is None else PieceMap.from_bytes(self.pieces)
        if self.map is not None:
            return  # its specials are the map's (the import put them in attnmt's places)
        for side, sp in (("source", self._src), ("target", self._tgt)):
            ids = (sp.pad_id(), sp.unk_id(), sp.bos_id(), sp.eos_id())
            if ids != (PAD_ID, UNK_ID, BOS_ID, EOS_ID):
                raise CheckpointError(f"{side} sentencepiece model has special ids "
                                      f"(pad, unk, bos, eos) = {ids}, expected (0, 1, 2, 3)")

    pad_id, unk_id, bos_id, eos_id = PAD_ID, UNK_ID, BOS_ID, EOS_ID

    @property
    def src_vocab_size(self) -> int:
        return self._src.get_piece_size() if self.map is None else self.map.size("src")

    @property
    def tgt_vocab_size(self) -> int:
        return self._tgt.get_piece_size() if self.map is None else self.map.size("tgt")

    def encode_src(self, texts: list[str]) -> list[list[int]]:
        if self.map is None:
            return self._src.encode(texts, out_type=int)
        out = []
        for text in texts:
            code, rest = split_code(text)
            out.append(self.map.ids("src", code + self._src.encode(rest, out_type=str)))
        return out

    def encode_tgt(self, texts: list[str]) -> list[list[int]]:
        if self.map is None:
            return self._tgt.encode(texts, out_type=int)
        return [self.map.ids("tgt", pieces) for pieces in self._tgt.encode(texts, out_type=str)]

    def sample(self, side: str, text: str, alpha: float, nbest: int, seed: int) -> list[int]:
        """One segmentation of ``text`` by the ``side`` (``src``, ``tgt``) model, a pure function of ``seed``.
        A unigram model: drawn among its ``nbest`` best segmentations, each weighted by its probability to
        the power ``alpha`` (Kudo 2018); the n-best list is sentencepiece's (deterministic) and the draw
        numpy's. A BPE model: BPE-dropout, each merge dropped with probability ``alpha`` (``bpe_dropout``).
        Not sentencepiece's own sampling: it cannot be seeded (with one seed, its draws differ from one
        process to the next, so a resumed or a second run would see other pieces)."""
        model = self._src if side == "src" else self._tgt
        if self.map is not None:  # the sentencepiece model's own ids, then the map's; a >>fra<< kept whole
            code, rest = split_code(text) if side == "src" else ([], text)
            ids = self._sample_ids(model, side, rest, alpha, nbest, seed)
            return self.map.ids(side, code + [model.id_to_piece(i) for i in ids])
        return self._sample_ids(model, side, text, alpha, nbest, seed)

    def _sample_ids(self, model, side: str, text: str, alpha: float, nbest: int, seed: int) -> list[int]:
        if side not in self._samplers:
            self._samplers[side] = self._sampler(side)
        sampler = self._samplers[side]
        if isinstance(sampler, BpeDropout):
            return sampler.encode(text, alpha, seed)
        candidates = [ids for ids in model.NBestEncodeAsIds(text, nbest) if ids] or [[]]
        if len(candidates) == 1:
            return candidates[0]
        scores = alpha * np.array([sampler[ids].sum() for ids in candidates])
        weights = np.exp(scores - scores.max())
        return candidates[int(np.random.default_rng(seed).choice(len(candidates), p=weights / weights.sum()))]

    def _sampler(self, side: str) -> BpeDropout | np.ndarray:
        """What ``sample`` needs of one side's model: its merges (BPE), or its pieces' log-probabilities."""
        model, proto = (self._src, self.src_model) if side == "src" else (self._tgt, self.tgt_model)
        spec = model_spec(proto)
        if is_bpe(spec):
            return BpeDropout(model, spec)
        return np.array([model.GetScore(i) for i in range(model.GetPieceSize())])

    def normalize_src(self, text: str) -> str:
        """``text`` as the source model normalizes it before cutting it into pieces (spaces as spaces)."""
        return self._src.normalize(text).replace("\u2581", " ").strip()

    def normalize_tgt(self, text: str) -> str:
        return self._tgt.normalize(text).replace("\u2581", " ").strip()

    def decode_tgt(self, ids: list[list[int]]) -> list[str]:
        """Detokenised text; special ids are dropped."""
        kept = [[i for i in seq if i > EOS_ID] for seq in ids]
        if self.map is None:
            return self._tgt.decode(kept)
        # As MarianTokenizer: a piece the target model lacks stays as it is, its word-start mark a space.
        return [self._tgt.decode_pieces(self.map.pieces("tgt", seq)).replace("\u2581", " ").strip()
                for seq in kept]

    def single_piece(self, token: str) -> bool:
        """Whether the source model reads ``token`` as one piece of its own (a control token; at the start
        of a sentence, after sentencepiece's word-start piece)."""
        if self.map is not None:  # a piece of the vocabulary at the start (a >>fra<< token, split_code)
            return self.map.has("src", token)
        return self._src.piece_to_id(token) != UNK_ID and token in self._src.encode(token, out_type=str)

    def src_pieces(self, ids: list[int]) -> list[str]:
        return [self._src.id_to_piece(i) for i in ids] if self.map is None else self.map.pieces("src", ids)

    def tgt_pieces(self, ids: list[int]) -> list[str]:
        return [self._tgt.id_to_piece(i) for i in ids] if self.map is None else self.map.pieces("tgt", ids)

    @property
    def sha256(self) -> str:
        """The tokenizer's hash (``tokenizer_sha256``)."""
        return tokenizer_sha256(sha256_bytes(self.src_model), sha256_bytes(self.tgt_model),
                                self.pieces and sha256_bytes(self.pieces))

    def fingerprint(self) -> dict:
        """What a checkpoint records to recognise this tokenizer."""
        return ({"pieces_sha256": sha256_bytes(self.pieces)} if self.pieces is not None else {}) | {
            "joint": self.joint,
            "src_sha256": sha256_bytes(self.src_model),
            "tgt_sha256": sha256_bytes(self.tgt_model),
            "src_vocab_size": self.src_vocab_size,
            "tgt_vocab_size": self.tgt_vocab_size,
            "special_ids": [PAD_ID, UNK_ID, BOS_ID, EOS_ID],
        }

    # ----------------------------------------------------------------------------------- storage

    def files(self) -> dict[str, bytes]:
        """File name -> bytes, as stored in a tokenizer folder."""
        if self.pieces is not None:
            return {"src.model": self.src_model, "tgt.model": self.tgt_model, PIECES_FILE: self.pieces}
        if self.joint:
            return {"spm.model": self.src_model}
        return {"src.model": self.src_model, "tgt.model": self.tgt_model}

    def meta(self, settings: dict | None = None) -> dict:
        return {
            "joint": self.joint,
            "sha256": {name: sha256_bytes(data) for name, data in self.files().items()},
            "settings": settings or {},
        }


def train_tokenizer(src: Sequence[str], tgt: Sequence[str], cfg: TokenizerConfig, seed: int = 1) -> Tokenizer:
    """Train a joint model on both sides, or one model per side."""
    return train_on_samples([list(src) + list(tgt)] if cfg.joint else [src, tgt], cfg, seed)


def train_on_samples(samples: Sequence[Sequence[str]], cfg: TokenizerConfig, seed: int = 1,
                     symbols: Sequence[str] = ()) -> Tokenizer:
    """A tokenizer from one list of sentences (joint) or two (source, target), each sampled down to
    ``cfg.sample_size`` as ``train_model`` does; ``symbols`` (control tokens) in the source's model."""
    models = [train_model(sentences, cfg, seed, symbols if k == 0 else ())
              for k, sentences in enumerate(samples)]
    return Tokenizer(models[0], models[-1], joint=cfg.joint)


def load_model_file(path: Path, expected_sha256: str | None = None) -> bytes:
    """The bytes of a sentencepiece model file, checked against ``expected_sha256`` when given."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise CheckpointError(f"{path}: tokenizer model not found") from None
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read tokenizer model: {e.strerror}") from None
    if expected_sha256 is not None and sha256_bytes(data) != expected_sha256:
        raise CheckpointError(f"{path}: tokenizer does not match (sha256 {sha256_bytes(data)[:12]}…, "
                              f"expected {expected_sha256[:12]}…)")
    return data


def load_tokenizer(folder: Path, expected: dict | None = None) -> Tokenizer:
    """Load a tokenizer folder written by ``save`` (run folder ``tokenizer/``), verifying hashes.

    ``expected`` is a checkpoint's tokenizer fingerprint: the folder must then hold the very models that
    checkpoint was trained with, checked before sentencepiece parses a byte of them.
    """
    meta_path = Path(folder) / META_FILE
    joint, hashes = _read_meta(Path(folder))
    imported = PIECES_FILE in hashes
    names = model_names(joint, imported)
    if expected is not None:
        wanted = ([expected.get("src_sha256")] if len(names) == 1
                  else [expected.get("src_sha256"), expected.get("tgt_sha256")])
        wanted += [expected.get("pieces_sha256")] if imported else []
        if joint != expected.get("joint") or [hashes.get(name) for name in names] != wanted:
            raise CheckpointError(f"{folder}: tokenizer does not match checkpoint "
                                  f"(expected sha256 {str(wanted[0])[:12]}…)")
    models = []
    for name in names:
        if name not in hashes:
            raise CheckpointError(f"{meta_path}: no sha256 recorded for {name}")
        models.append(load_model_file(Path(folder) / name, hashes[name]))
    return _from_bytes(models, joint, Path(folder))


def model_names(joint: bool, imported: bool = False) -> list[str]:
    """The model files of a tokenizer folder: (source, target), or the joint one; an imported tokenizer's
    are (source, target, piece map)."""
    if imported:
        return ["src.model", "tgt.model", PIECES_FILE]
    return ["spm.model"] if joint else ["src.model", "tgt.model"]


def _read_meta(folder: Path) -> tuple[bool, dict]:
    """A tokenizer folder's ``tokenizer.json``: whether it is joint, and the sha256 of each model file."""
    meta_path = folder / META_FILE
    meta = read_json(meta_path, CheckpointError, missing=f"not found (no tokenizer in {folder})")
    try:
        return bool(meta["joint"]), dict(meta["sha256"])
    except (ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"{meta_path}: unreadable tokenizer metadata ({type(e).__name__})") from None


def folder_sha256(folder: Path) -> str:
    """The hash (``tokenizer_sha256``) of the tokenizer in ``folder``, from the sha256s its
    ``tokenizer.json`` records (which ``load_tokenizer`` checks the model files against): no model is read."""
    joint, hashes = _read_meta(Path(folder))
    names = model_names(joint, PIECES_FILE in hashes)
    try:
        return tokenizer_sha256(str(hashes[names[0]]), str(hashes[names[1 if len(names) > 1 else 0]]),
                                hashes.get(PIECES_FILE))
    except KeyError as e:
        raise CheckpointError(f"{Path(folder) / META_FILE}: no sha256 recorded for {e.args[0]}") from None


def recorded_sha256(fingerprint: dict | None) -> str | None:
    """The hash (``tokenizer_sha256``) of the tokenizer a checkpoint records (``Tokenizer.fingerprint``);
    None without one, or when it lacks the sha256s (that checkpoint's own loading says so)."""
    if not isinstance(fingerprint, dict):
        return None
    src, tgt = fingerprint.get("src_sha256"), fingerprint.get("tgt_sha256")
    if not (isinstance(src, str) and isinstance(tgt, str)):
        return None
    pieces = fingerprint.get("pieces_sha256")
    return tokenizer_sha256(src, tgt, pieces if isinstance(pieces, str) else None)


def load_external(src_path: Path, tgt_path: Path | None) -> Tokenizer:
    """A user-supplied sentencepiece model (``tokenizer.src_model``); joint when ``tgt_path`` is None."""
    src = load_model_file(src_path)
    tgt = load_model_file(tgt_path) if tgt_path is not None else src
    return _from_bytes([src] if tgt_path is None else [src, tgt], tgt_path is None, src_path)


def _from_bytes(models: list[bytes], joint: bool, where: Path) -> Tokenizer:
    """``models``: [joint], [source, target] or [source, target, piece map]."""
    try:
        return Tokenizer(models[0], models[1 if len(models) > 1 else 0], joint=joint,
                         pieces=models[2] if len(models) > 2 else None)
    except RuntimeError as e:  # sentencepiece: "could not parse ModelProto"
        raise CheckpointError(f"{where}: not a valid sentencepiece model "
                              f"({str(e).splitlines()[0]})") from None


def stored_tokenizer(files: dict[str, bytes], expected: Any, path: Path) -> Tokenizer:
    """The tokenizer a checkpoint (``path``) carries: its files, checked against the sha256s its fingerprint
    (``expected``) records before sentencepiece parses a byte."""
    try:
        if not isinstance(expected, dict) or not isinstance(expected.get("joint"), bool):
            raise KeyError("fingerprint.tokenizer.joint")
        joint, imported = expected["joint"], "pieces_sha256" in expected
        names = model_names(joint, imported)
        models = [files[name] for name in names]
        wanted = [expected["src_sha256"], expected["tgt_sha256"]][: len(names)]
        wanted += [expected["pieces_sha256"]] if imported else []
    except (KeyError, TypeError, AttributeError) as e:
        raise CheckpointError(f"{path}: checkpoint has no usable tokenizer "
                              f"({type(e).__name__}: {e})") from None
    if [sha256_bytes(m) for m in models] != wanted:
        raise CheckpointError(f"{path}: tokenizer does not match checkpoint "
                              f"(expected sha256 {str(wanted[0])[:12]}…)")
    try:
        return Tokenizer(models[0], models[1 if len(models) > 1 else 0], joint=joint,
                         pieces=models[2] if imported else None)
    except RuntimeError as e:
        raise CheckpointError(f"{path}: its tokenizer is not a valid sentencepiece model "
                              f"({str(e).splitlines()[0]})") from None
