"""Word alignments: Pharaoh files, alignment error rate, pieces merged into words, links from attention.

Letters: T target (query) positions, S source (key) positions.

Alignments follow the Pharaoh format: ``i-j`` links source word i to target word j (sure), ``i?j`` or
``ipj`` is a possible link; indices count from 0 unless one-based. Quality is the alignment error rate
of Och & Ney (2003, sec. 4): with sure links S, possible links P (P includes S) and predicted links A,
precision = |A ∩ P| / |A|, recall = |A ∩ S| / |S|, AER = 1 - (|A ∩ S| + |A ∩ P|) / (|A| + |S|).

Links are between words; which pieces make up a word, and attention merged from pieces into words, are
``words.py``'s. Strings and numpy arrays only: no model code, no torch (but for ``reverse.json``'s check,
which finds the checkpoint a run folder names before any model is loaded).
"""

from __future__ import annotations

import itertools
import json
import os
import re
import zipfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..config.jsonfile import read_json
from ..data.readers import read_lines
from ..errors import DataError

Link = tuple[int, int]  # (source word, target word)
CALIBRATION = "alignment.json"  # in a run folder: the reading that align --calibrate chose


# ------------------------------------------------------------------------------------ extraction


METHODS = ("mutual", "argmax", "threshold")


@dataclass(frozen=True)
class AlignOptions:
    """How ``attnmt align`` reads links off cross-attention: which layer (0-based, -1 the last, None every
    layer) and heads (0-based, None all) are averaged, the rows (``shift``: Shift-Att), the extraction
    ``method`` and its ``threshold``; with a reverse model, the symmetrization of the two directions; the
    causal pass or the full-context one."""

    layer: int | None = None
    heads: tuple[int, ...] | None = None
    shift: bool = False
    method: str = "mutual"
    threshold: float = 0.3
    symmetrize: str = "grow-diag-final-and"
    words: str = "merged"
    """``merged``: attention merged into words, then links extracted; ``any``: links extracted between
    pieces, and two words linked if any of their pieces are (``words_from_piece_links``)."""
    source: str = "attention"
    """What links are read from: ``attention``, or a gradient attribution method (``attribution.py``)
    whose source shares stand in for one layer's single head; ``steps`` for integrated gradients."""
    steps: int = 64
    full_context: bool = False
    """Read the attention of the pass in which every target position sees the whole target (no causal
    mask: Garg et al.'s alignment pass); a model trained with ``train.alignment.full_context`` is read so."""
    kind: str = "cross"
    """The attention read: ``cross`` (the layers and heads above), or ``align``, the model's alignment layer
    (``train.alignment.module: layer``: one layer of one head)."""
    null: bool = True
    """``align``: the source's EOS is the layer's null word (a layer taught links learns to look there for a
    target word they leave unlinked); False for a layer that learnt by prediction, never taught one, whose
    rows are renormalised over the words as the cross-attention's are."""


def attention_rows(cross: Sequence[np.ndarray], layer: int | None = None, heads: Sequence[int] | None = None,
                   shift: bool = False) -> np.ndarray:
    """The cross-attention (T, S) to align with, from one (H, T + 1, S + 1) array per layer (rows: the
    target pieces and EOS; columns: the source pieces and EOS): ``layer`` (0-based, -1 the last; None every
    layer) and ``heads`` (0-based; None every head) averaged. The EOS column is masked out and each row
    renormalised over the real source pieces. Row t is the step that predicts target piece t, or with
    ``shift`` the step where piece t is the decoder's input, one step later (Shift-Att, Chen et al. 2020);
    either way the EOS prediction (or the BOS input) is not a row."""
    stacked = np.stack(cross)  # (L, H, T + 1, S + 1)
    if stacked.ndim != 4 or stacked.shape[2] < 1 or stacked.shape[3] < 1:
        raise ValueError(f"expected (layers, heads, T + 1, S + 1) attention, got shape {stacked.shape}")
    chosen = stacked if layer is None else stacked[[layer]]
    if heads is not None:
        chosen = chosen[:, list(heads)]
    rows = chosen[:, :, 1:, :-1] if shift else chosen[:, :, :-1, :-1]
    matrix = rows.mean((0, 1), dtype=np.float64)
    total = matrix.sum(-1, keepdims=True)
    return np.divide(matrix, total, out=np.zeros_like(matrix), where=total > 0)


def extract_alignment(matrix: np.ndarray, method: str = "mutual", threshold: float = 0.5) -> list[Link]:
    """Links from a word-level attention matrix (T, S). ``argmax`` links each target word to the source
    word it attends to most; ``mutual`` keeps only those links where the target word is also the one that
    attends most to that source word (the argmax in both directions, the intersection of the two: SimAlign's
    ArgMax, Jalili Sabet et al. 2020), so a target word that no source word explains (German's comma after
    a weekday) stays unaligned; ``threshold`` links every pair whose weight is at least ``threshold``.
    Returns (source, target) pairs sorted by source, then target."""
    matrix = np.asarray(matrix)
    if matrix.ndim != 2:
        raise ValueError(f"an alignment needs a (T, S) matrix, got shape {matrix.shape}")
    T, S = matrix.shape
    if T == 0 or S == 0:
        return []
    if method in ("argmax", "mutual"):
        links = [(int(i), j) for j, i in enumerate(matrix.argmax(axis=1))]
        if method == "mutual":
            best_target = matrix.argmax(axis=0)  # (S,) the target word attending most to each source word
            links = [(i, j) for i, j in links if best_target[i] == j]
    elif method == "threshold":
        links = [(int(i), int(j)) for j, i in zip(*np.nonzero(matrix >= threshold))]
    else:
        raise ValueError(f"unknown alignment method {method!r}; expected one of {', '.join(METHODS)}")
    return sorted(links)


def words_from_piece_links(links: Iterable[Link], src_words: np.ndarray, tgt_words: np.ndarray) -> list[Link]:
    """Word links from piece links (source piece, target piece): two words are linked if any of their
    pieces are. ``src_words`` and ``tgt_words`` are membership matrices (pieces, words); a piece that
    belongs to several words (a CJK piece of two characters) links each of them."""
    out = set()
    for p, q in links:
        for i in np.flatnonzero(src_words[p]):
            for j in np.flatnonzero(tgt_words[q]):
                out.add((int(i), int(j)))
    return sorted(out)


# ------------------------------------------------------------------------------------ calibration
def calibration_file(checkpoint: Path) -> Path | None:
    """Where ``align --calibrate`` keeps a run's reading: ``RUN/alignment.json``, for a checkpoint in
    ``RUN/checkpoints/`` (None for a checkpoint outside a run folder)."""
    checkpoint = Path(checkpoint)
    return checkpoint.parent.parent / CALIBRATION if checkpoint.parent.name == "checkpoints" else None


def read_calibration(checkpoint: Path) -> tuple[int | None, tuple[int, ...] | None] | None:
    """The (layer, heads), 0-based, that ``align --calibrate`` stored for the run of ``checkpoint``; None
    when there is none."""
    path = calibration_file(checkpoint)
    if path is None or not os.path.lexists(path):
        return None
    data = read_json(path, DataError, dict, missing=None) or {}
    if "layer" not in data or "heads" not in data:
        raise DataError(f"{path}: not a reading that align --calibrate wrote (it has layer and heads)")
    layer, heads = data["layer"], data["heads"]
    indices = heads if isinstance(heads, list) and heads else [-1]
    if not (layer is None or type(layer) is int and layer >= 0) or not (
            heads is None or all(type(h) is int and h >= 0 for h in indices)):
        raise DataError(f"{path}: layer must be null or a 0-based index, heads null or a list of them")
    return layer, (tuple(heads) if heads is not None else None)


REVERSE = "reverse.json"  # in a run folder: the model trained the other way, which align symmetrizes with


def run_folder(model: Path) -> Path | None:
    """The run folder of a model path: the folder itself, or RUN for RUN/checkpoints/FILE; None otherwise."""
    model = Path(model)
    if model.is_dir():
        return model
    return model.parent.parent if model.parent.name == "checkpoints" else None


def read_reverse(model: Path) -> Path | None:
    """The reverse model a run folder names in ``reverse.json`` (``{"model": PATH}``, relative to the run
    folder), resolved; None without the file, and the path as named when nothing is there (``align`` then
    aligns one way, with a warning). Anything else wrong with it is one DataError naming ``reverse.json``,
    found before any model is loaded: not a JSON object (``config/jsonfile.py``), a path with a NUL byte,
    a pipe or a device, the run itself, a folder or file that holds no checkpoint, or a run that does not
    translate the other way (from the two runs' ``config.yaml``)."""
    run = run_folder(model)
    path = run / REVERSE if run is not None else None
    if path is None or not os.path.lexists(path):
        return None
    record = read_json(path, DataError, None, missing=None)
    named = record.get("model") if isinstance(record, dict) else record
    if not isinstance(named, str) or not named:
        raise DataError(f"{path}: not a reverse model record: expected {{\"model\": PATH}}, found "
                        f"{str(named)[:40]!r}")
    if "\0" in named:
        raise DataError(f"{path}: not a reverse model record: its model path holds a NUL byte")
    reverse = Path(os.path.realpath(run / named))
    if reverse.exists():
        _check_reverse(path, run, reverse)
    return reverse


def _check_reverse(path: Path, run: Path, reverse: Path) -> None:
    from ..config.schema import load_config
    from ..errors import AttnmtError
    from ..models.checkpoint import resolve_model_path

    fix = "fix it, or give --one-way"
    there = run_folder(reverse)
    if there is not None and os.path.realpath(there) == os.path.realpath(run):
        raise DataError(f"{path}: names {reverse}, this run itself; it names the model trained the other "
                        f"way: {fix}")
    try:
        checkpoint = resolve_model_path(reverse)  # a pipe or a device, a folder that holds no checkpoint
        if not zipfile.is_zipfile(checkpoint):  # what torch.save writes; read whole only later
            raise DataError(f"{checkpoint}: not a checkpoint")
        if there is None or not (there / "config.yaml").is_file() or not (run / "config.yaml").is_file():
            return
        pairs = [(c.data.src_lang, c.data.tgt_lang) for c in map(load_config, (run / "config.yaml",
                                                                               there / "config.yaml"))]
    except AttnmtError as e:
        raise DataError(f"{path}: names {reverse}, which is not a model attnmt reads ({e}); {fix}") from None
    if pairs[1] != pairs[0][::-1]:
        raise DataError(f"{path}: names {reverse}, which translates {'->'.join(pairs[1])}; the reverse of "
                        f"{'->'.join(pairs[0])} is {'->'.join(pairs[0][::-1])}: {fix}")


def write_reverse(run: Path, reverse: Path) -> Path:
    """Record in ``run`` that ``reverse`` is its model the other way (a path relative to ``run``)."""
    from ..runfiles import atomic_write_text

    relative = os.path.relpath(Path(reverse).resolve(), Path(run).resolve())
    atomic_write_text(Path(run) / REVERSE, json.dumps({"model": relative}) + "\n")
    return Path(run) / REVERSE


# ---------------------------------------------------------------------------------------- Pharaoh


def format_pharaoh(links: Iterable[Link], one_based: bool = False) -> str:
    shift = 1 if one_based else 0
    return " ".join(f"{i + shift}-{j + shift}" for i, j in sorted(links))


_LINK = re.compile(r"^(\d+)([-?p])(\d+)$", re.ASCII)  # ASCII digits only: \d would take "١-٢" or "１-２"


def parse_pharaoh(line: str, one_based: bool = False) -> tuple[set[Link], set[Link]]:
    """(sure, possible) links of a Pharaoh line: ``i-j`` sure, ``i?j`` or ``ipj`` possible; the possible
    set includes the sure links (Och & Ney: S ⊆ P). Raises ValueError on a malformed link."""
    sure: set[Link] = set()
    possible: set[Link] = set()
    shift = 1 if one_based else 0
    for token in line.split():
        match = _LINK.match(token)
        if not match:
            raise ValueError(f"malformed alignment link {token!r} (expected i-j, i?j or ipj)")
        i, j = int(match.group(1)) - shift, int(match.group(3)) - shift
        if i < 0 or j < 0:
            raise ValueError(f"alignment link {token!r} has index 0, but indices are one-based")
        (sure if match.group(2) == "-" else possible).add((i, j))
    return sure, possible | sure


@dataclass(frozen=True)
class Gold:
    """Gold alignments of a corpus, one (sure, possible) pair of link sets per sentence pair."""

    path: Path
    sure: list[set[Link]]
    possible: list[set[Link]]  # sure links included
    one_based: bool = False

    def check_fits(self, n_src_words: Sequence[int], n_tgt_words: Sequence[int]) -> None:
        """Every link must point inside its pair (a DataError names the line and the first link outside)."""
        for i, (possible, n_src, n_tgt) in enumerate(zip(self.possible, n_src_words, n_tgt_words)):
            outside = sorted(link for link in possible if link[0] >= n_src or link[1] >= n_tgt)
            if outside:
                shown = format_pharaoh(outside[:1], self.one_based)
                raise DataError(f"{self.path}:{i + 1}: link {shown} is outside the pair "
                                f"({n_src} source words, {n_tgt} target words)")


def read_gold(path: Path, lines: int, pairs_from: Path, one_based: bool = False,
              limit: int | None = None) -> Gold:
    """A Pharaoh file of gold links with one line per sentence pair (``lines``, those of ``pairs_from``);
    with ``limit``, its first ``limit`` lines only."""
    gold_lines = list(itertools.islice(read_lines(path), limit))
    if len(gold_lines) != lines:
        raise DataError(f"{pairs_from} has {lines} lines, {path} has {len(gold_lines)}")
    sure, possible = [], []
    for number, line in enumerate(gold_lines, start=1):
        try:
            s, p = parse_pharaoh(line, one_based)
        except ValueError as e:
            raise DataError(f"{path}:{number}: {e}") from None
        sure.append(s)
        possible.append(p)
    return Gold(Path(path), sure, possible, one_based)


# ---------------------------------------------------------------------------------------- scoring


@dataclass(frozen=True)
class AlignmentScore:
    aer: float
    precision: float
    recall: float
    predicted: int  # |A|
    sure: int  # |S|
    possible: int  # |P|, sure links included
    sentences: int

    def as_dict(self) -> dict:
        return {"aer": round(self.aer, 6), "precision": round(self.precision, 6),
                "recall": round(self.recall, 6), "predicted": self.predicted, "sure": self.sure,
                "possible": self.possible, "sentences": self.sentences}


def alignment_scores(predicted: Iterable[Iterable[Link]], sure: Iterable[set[Link]],
                     possible: Iterable[set[Link]]) -> AlignmentScore:
    """Corpus-level AER, precision and recall (Och & Ney 2003, sec. 4): counts summed over sentences.
    An empty prediction has precision 1, an empty gold recall 1, and both empty AER 0."""
    a_total = s_total = p_total = a_and_s = a_and_p = n = 0
    for links, s, p in zip(predicted, sure, possible, strict=True):
        a, p = set(links), set(p) | set(s)
        a_total, s_total, p_total = a_total + len(a), s_total + len(s), p_total + len(p)
        a_and_s, a_and_p = a_and_s + len(a & s), a_and_p + len(a & p)
        n += 1
    precision = a_and_p / a_total if a_total else 1.0
    recall = a_and_s / s_total if s_total else 1.0
    aer = 1.0 - (a_and_s + a_and_p) / (a_total + s_total) if a_total + s_total else 0.0
    return AlignmentScore(aer, precision, recall, a_total, s_total, p_total, n)


SYMMETRIZATIONS = ("intersection", "union", "grow-diag", "grow-diag-final", "grow-diag-final-and")
# Moses's neighbours of a link, in its order: the four sides, then the four corners.
_NEIGHBOURS = ((-1, 0), (0, -1), (1, 0), (0, 1), (-1, -1), (-1, 1), (1, -1), (1, 1))


def symmetrize(forward: Iterable[Link], reverse: Iterable[Link], method: str) -> set[Link]:
    """One alignment from two directional ones (source-to-target and target-to-source, both as ``(i, j)``
    links of source word i and target word j), as Moses's ``symal`` defines the heuristics (Koehn et al.
    2005): the intersection, the union, or the intersection grown towards the union. ``grow-diag`` adds a
    union link next to a link (sides or corners) while its source or its target word is unaligned, until
    nothing changes; ``-final`` then adds any directional link whose source or target word is still
    unaligned, ``-final-and`` only one whose words are both unaligned."""
    if method not in SYMMETRIZATIONS:
        raise ValueError(f"unknown symmetrization {method!r}: one of {', '.join(SYMMETRIZATIONS)}")
    forward, reverse = set(forward), set(reverse)
    union = forward | reverse
    if method == "union":
        return union
    links = forward & reverse
    if method == "intersection":
        return links
    src_aligned = {i for i, _ in links}
    tgt_aligned = {j for _, j in links}

    def add(link: Link) -> None:
        links.add(link)
        src_aligned.add(link[0])
        tgt_aligned.add(link[1])

    rows = max((i for i, _ in union), default=-1) + 1
    cols = max((j for _, j in union), default=-1) + 1
    grew = True
    while grew:
        grew = False
        for i in range(rows):
            for j in range(cols):
                if (i, j) not in links:
                    continue
                for di, dj in _NEIGHBOURS:
                    new = (i + di, j + dj)
                    if new in union and new not in links and (new[0] not in src_aligned
                                                              or new[1] not in tgt_aligned):
                        add(new)
                        grew = True
    if method == "grow-diag":
        return links
    both = method == "grow-diag-final-and"
    for directional in (forward, reverse):
        for new in sorted(directional):
            src_free, tgt_free = new[0] not in src_aligned, new[1] not in tgt_aligned
            if new not in links and ((src_free and tgt_free) if both else (src_free or tgt_free)):
                add(new)
    return links
