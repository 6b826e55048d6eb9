"""An imported model's vocabulary: which id each piece has on each side, where the model's ids are not
its sentencepiece models' own (an OPUS-MT model's ``vocab.json``).

attnmt's ids keep their fixed specials (pad 0, unk 1, bos 2, eos 3; ``config/specials.py``), so an import
reorders the other model's vocabulary into that layout (``models/marian.py``) and records it here: the
piece of every attnmt id on each side, and the id it had in the imported model (-1 for a row the import
added), which the export back uses. The tokenizer then cuts text with the sentencepiece model and looks each
piece up here, as ``MarianTokenizer`` does: a piece not in the vocabulary is unk, and a source that starts
with a target-language token (``>>fra<<``) keeps it as one piece.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from ..config.jsonfile import parse_json
from ..config.specials import UNK_ID
from ..errors import CheckpointError

PIECES_FILE = "pieces.json"
UNUSED = "<attnmt:unused>"
"""The piece of a row the import added (attnmt's pad, when the other model starts decoding from its pad)."""


@dataclass
class PieceMap:
    source: list[str]
    target: list[str]
    source_ids: list[int]  # attnmt id -> the imported model's id (-1: a row the import added)
    target_ids: list[int]
    _index: dict[str, dict[str, int]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._index = {side: {piece: i for i, piece in enumerate(pieces)}
                       for side, pieces in (("src", self.source), ("tgt", self.target))}

    @classmethod
    def from_bytes(cls, data: bytes, where: str = PIECES_FILE) -> PieceMap:
        """Parse ``pieces.json``; a CheckpointError naming ``where`` when it is not one."""
        raw = parse_json(data, where, CheckpointError)
        try:
            sides = [raw[k] for k in ("source", "target", "source_ids", "target_ids")]
        except KeyError as e:
            raise CheckpointError(f"{where}: not a piece map (no {e.args[0]})") from None
        for k, pieces in zip(("source", "target"), sides[:2]):
            if not (isinstance(pieces, list) and len(pieces) > 4 and all(isinstance(p, str) for p in pieces)
                    and len(set(pieces)) == len(pieces)):
                raise CheckpointError(f"{where}: {k} must be a list of more than 4 different pieces")
        for k, ids, pieces in zip(("source_ids", "target_ids"), sides[2:], sides[:2]):
            if not (isinstance(ids, list) and len(ids) == len(pieces) and all(type(i) is int for i in ids)):
                raise CheckpointError(f"{where}: {k} must be one integer per piece")
        return cls(*sides)

    def to_bytes(self) -> bytes:
        return json.dumps({"source": self.source, "target": self.target, "source_ids": self.source_ids,
                           "target_ids": self.target_ids}, ensure_ascii=False).encode("utf-8")

    def size(self, side: str) -> int:
        return len(self.source if side == "src" else self.target)

    def ids(self, side: str, pieces: list[str]) -> list[int]:
        """The ids of ``pieces`` on ``side`` (``src``, ``tgt``); unk for a piece the vocabulary lacks."""
        index = self._index[side]
        return [index.get(p, UNK_ID) for p in pieces]

    def pieces(self, side: str, ids: list[int]) -> list[str]:
        table = self.source if side == "src" else self.target
        return [table[i] for i in ids]

    def has(self, side: str, piece: str) -> bool:
        return piece in self._index[side]


def split_code(text: str) -> tuple[list[str], str]:
    """A leading target-language token (``>>fra<<``) and the rest of ``text``, as ``MarianTokenizer`` reads
    them: the token is one piece whatever follows it."""
    if text.startswith(">>"):
        end = text.find("<<")
        if end != -1:
            return [text[: end + 2]], text[end + 2:]
    return [], text
