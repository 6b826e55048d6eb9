"""The pieces a tokenizer keeps for itself, which no control token (a corpus's tag) may be.

Every model attnmt trains has the special ids pad 0, unk 1, bos 2, eos 3 with their pieces, and, with
``tokenizer.byte_fallback``, a piece for each byte (``<0x00>`` .. ``<0xFF>``). A control token is given to
sentencepiece as a user-defined symbol; one equal to such a piece takes its id (``<s>``: bos becomes -1) or
stops sentencepiece's training (``<unk>``, ``<0x41>``). Here, below the config, so that the config refuses
such a tag when it is read (``config.data.check_corpora``) and ``tokenizer`` trains with the same pieces.
"""

from __future__ import annotations

import re

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
SPECIAL_PIECES = ("<pad>", "<unk>", "<s>", "</s>")
BYTE_PIECE = re.compile(r"<0x[0-9A-F]{2}>")
WORD_START = "\u2581"
"""sentencepiece's mark of a space (``▁``): a control token that ends in it is not kept as one piece, and
none may hold it."""


def reserved_because(token: str) -> str | None:
    """Why sentencepiece cannot keep ``token`` as a control token of its own, in words; None if it can."""
    if token in SPECIAL_PIECES:
        return f"it is one of the tokenizer's special pieces ({', '.join(SPECIAL_PIECES)})"
    if BYTE_PIECE.fullmatch(token):
        return "it is the piece of a byte (sentencepiece's with tokenizer.byte_fallback)"
    if WORD_START in token:
        return f"it holds {WORD_START} (U+2581), sentencepiece's mark of a space"
    if "\0" in token:
        return "it holds a NUL character (U+0000)"
    return None
