"""Word alignments of a parallel corpus by eflomal, in the Pharaoh form ``train.alignment.path`` reads: one
line per line of the corpus as read, ``i-j`` for source word i and target word j, words as ``attnmt align``
reads them (``attnmt.data.words.segment``: the space-separated tokens, CJK text split into characters).

    python scripts/eflomal_align.py --src train.de.gz --tgt train.en.gz -o train.align

eflomal (Östling & Tiedemann 2016: a Bayesian HMM with fertility, sampled; the ``align`` extra,
``pip install -e '.[align]'``) aligns both directions in one call with its defaults (model 3, 3 samplers,
iterations scaled to the corpus); the two are symmetrised with attnmt's own ``symmetrize``
(``--heuristic``, default grow-diag-final-and), the same heuristic ``attnmt align --reverse`` uses, so a
guided model can learn from eflomal's links instead of a bootstrap model's (``scripts/bootstrap_guided.py
--teacher eflomal``). eflomal seeds its samplers from the clock, so two runs differ a little. A line with
no words on one side gets an empty line. The output is written whole through a temporary file: a stopped
run leaves no half file.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from scriptargs import InputFile, OutputFile, ScriptParser, guarded, require_module

from attnmt.errors import DataError

HEURISTICS = ("grow-diag-final-and", "grow-diag-final", "grow-diag", "intersection", "union")


def corpus_words(path: Path, limit: int | None = None) -> list[list[str]]:
    """The words of each line of ``path`` (plain or gzipped) as ``attnmt align`` splits them."""
    from attnmt.data.readers import read_lines
    from attnmt.data.words import segment

    lines = []
    for line in read_lines(path):
        if limit is not None and len(lines) == limit:
            break
        lines.append([word.text for word in segment(line)])
    return lines


def read_links(path: Path) -> list[set[tuple[int, int]]]:
    from attnmt.data.readers import read_lines
    from attnmt.insight.links import parse_pharaoh

    return [parse_pharaoh(line)[0] for line in read_lines(path)]


def align_words(src: list[list[str]], tgt: list[list[str]], work: Path) -> dict[str, list[set]]:
    """eflomal on word lists, both directions: {"forward": links, "reverse": links}, each (source, target)
    word index pairs per line. eflomal reads one line per sentence, so a pair with an empty side is given
    a placeholder word and its links are dropped."""
    from eflomal import Aligner

    empty = [not s or not t for s, t in zip(src, tgt)]
    fwd, rev = work / "eflomal.fwd", work / "eflomal.rev"
    Aligner().align([" ".join(words) if not e else "∅" for words, e in zip(src, empty)],
                    [" ".join(words) if not e else "∅" for words, e in zip(tgt, empty)],
                    links_filename_fwd=str(fwd), links_filename_rev=str(rev))
    links = {"forward": read_links(fwd), "reverse": read_links(rev)}
    if any(len(found) != len(src) for found in links.values()):
        raise RuntimeError(f"eflomal wrote {[len(x) for x in links.values()]} lines for {len(src)} pairs")
    for found in links.values():
        for k in (k for k, e in enumerate(empty) if e):
            found[k] = set()
    return links


def symmetrized(links: dict[str, list[set]], heuristic: str) -> list[set]:
    from attnmt.insight.links import symmetrize

    return [symmetrize(f, r, heuristic) for f, r in zip(links["forward"], links["reverse"])]


def write_links(path: Path, links: list[set]) -> None:
    """``links`` as Pharaoh lines, replacing ``path`` whole (attnmt's atomic write: the user's file mode, no
    half file, no temporary file left behind)."""
    from attnmt.insight.links import format_pharaoh
    from attnmt.runfiles import atomic_write_text

    atomic_write_text(path, "".join(format_pharaoh(x) + "\n" for x in links))


def build_parser() -> ScriptParser:
    ap = ScriptParser(description=__doc__)
    ap.add_argument("--src", type=InputFile(pipes=True), required=True,
                    help="source side, one sentence a line (or .gz)")
    ap.add_argument("--tgt", type=InputFile(pipes=True), required=True,
                    help="target side, aligned by line with --src")
    ap.add_argument("-o", "--output", type=OutputFile(), required=True, help="the Pharaoh file to write")
    ap.add_argument("--heuristic", choices=HEURISTICS, default=HEURISTICS[0])
    return ap


@guarded
def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    require_module("eflomal", "eflomal is not installed: pip install -e '.[align]'")
    src, tgt = corpus_words(args.src), corpus_words(args.tgt)
    if len(src) != len(tgt):
        raise DataError(f"{args.src} has {len(src)} lines and {args.tgt} {len(tgt)}; they must be aligned "
                        "by line")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as work:
        links = symmetrized(align_words(src, tgt, Path(work)), args.heuristic)
    write_links(args.output, links)
    seconds = time.perf_counter() - started
    print(f"eflomal_align: {len(src):,} pairs, {sum(map(len, links)):,} links ({args.heuristic}) in "
          f"{seconds:.1f} s ({len(src) / seconds:,.0f} pairs/s) -> {args.output}", file=sys.stderr)


if __name__ == "__main__":
    main()
