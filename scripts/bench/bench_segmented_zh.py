"""Pre-segmented Chinese on a real model: ``attnmt align`` with a segmenter's words against ``attnmt align``
with characters, and against eflomal on the same words.

    python scripts/bench/bench_segmented_zh.py RUN --src test.en --tgt test.zh --segmented test.seg.zh \\
        --train-src train.en --train-segmented train.seg.zh

``--segmented`` is ``--tgt`` split into words by any segmenter (docs/tutorials/chinese.md used jieba; attnmt
needs none): the same characters, spaces between words. attnmt aligns ``--src`` with both (the Chinese side is
the target of RUN, or its source with ``--chinese-source``); each character link is then projected onto the
segmenter's word that holds the character, and the word links are scored against the projection (F1: do the
two readings say the same?). With ``--train-src/--train-segmented``, eflomal (``scripts/eflomal_align.py``:
the training pairs and the test pairs together, grow-diag-final-and) gives reference links on the segmenter's
words, and attnmt's word links get precision, recall and F1 against them. Times are wall seconds of each whole
command. """

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/: scriptargs and the tools

from benchlib import REPO
from eflomal_align import align_words, corpus_words, read_links, symmetrized
from scriptargs import InputFile, Model, ScriptParser, guarded, require_module

from attnmt.errors import ConfigError, DataError


def align(run: Path, src: Path, tgt: Path, out: Path) -> float:
    """``attnmt align`` in the repository, the paths made absolute: its wall seconds."""
    started = time.perf_counter()
    command = [sys.executable, "-m", "attnmt", "align", str(run.resolve()), "--src", str(src.resolve()),
               "--tgt", str(tgt.resolve()), "-o", str(out.resolve())]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    if done.returncode != 0:  # attnmt's own error line and exit code
        sys.stderr.write(done.stderr)
        sys.exit(done.returncode)
    return time.perf_counter() - started


def projected(char_links: list[set], raw: list[list[str]], words: list[list[str]], side: int) -> list[set]:
    """Character links with the Chinese index (``side``) replaced by the index of the word holding it."""
    out = []
    for links, chars, segmented in zip(char_links, raw, words):
        owner = [w for w, word in enumerate(segmented) for _ in word]
        start, first = 0, []
        for char in chars:  # a "character word" may be a run of Latin letters: its first character counts
            first.append(owner[start] if start < len(owner) else None)
            start += len(char)
        out.append({tuple(first[link[side]] if k == side else link[k] for k in (0, 1)) for link in links
                    if link[side] < len(first) and first[link[side]] is not None})
    return out


def scores(predicted: list[set], reference: list[set]) -> str:
    from attnmt.insight.links import alignment_scores

    s = alignment_scores(predicted, reference, reference)
    f1 = 2 * s.precision * s.recall / (s.precision + s.recall) if s.precision + s.recall else 0.0
    return f"P {s.precision:.3f} R {s.recall:.3f} F1 {f1:.3f} ({s.predicted:,} links against {s.sure:,})"


def build_parser() -> ScriptParser:
    ap = ScriptParser(description=__doc__)
    ap.add_argument("run", type=Model(), help="a run folder or checkpoint with Chinese on one side")
    ap.add_argument("--src", type=InputFile(), required=True, help="the other language, one sentence a line")
    ap.add_argument("--tgt", type=InputFile(), required=True, help="the Chinese side, unsegmented")
    ap.add_argument("--segmented", type=InputFile(), required=True,
                    help="--tgt split into words by a segmenter")
    ap.add_argument("--chinese-source", action="store_true", help="RUN translates from Chinese")
    ap.add_argument("--train-src", type=InputFile(), help="training pairs for eflomal: the other language")
    ap.add_argument("--train-segmented", type=InputFile(),
                    help="training pairs for eflomal: Chinese, segmented")
    ap.checks.append(check_training_pairs)
    return ap


def check_training_pairs(args) -> None:
    if (args.train_src is None) != (args.train_segmented is None):
        raise ConfigError("--train-src and --train-segmented go together (eflomal's training pairs)")


@guarded
def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    if args.train_src:
        require_module("eflomal", "--train-src: eflomal is not installed: pip install -e '.[align]'")
    side = 0 if args.chinese_source else 1
    raw, words = corpus_words(args.tgt), corpus_words(args.segmented)
    if ["".join(x) for x in raw] != ["".join(x) for x in words]:
        raise DataError(f"{args.segmented}: not the characters of {args.tgt} split into words")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        pair = (lambda zh: (zh, args.src)) if args.chinese_source else (lambda zh: (args.src, zh))
        took_words = align(args.run, *pair(args.segmented), out / "words.align")
        took_chars = align(args.run, *pair(args.tgt), out / "chars.align")
        by_words = read_links(out / "words.align")
        by_chars = projected(read_links(out / "chars.align"), raw, words, side)
        print(f"{len(words):,} pairs; attnmt align with words {took_words:.1f} s, with characters "
              f"{took_chars:.1f} s")
        print(f"word links against character links projected onto words: {scores(by_words, by_chars)}")
        if args.train_src and args.train_segmented:
            other = corpus_words(args.train_src) + corpus_words(args.src)
            chinese = corpus_words(args.train_segmented) + words
            src, tgt = (chinese, other) if args.chinese_source else (other, chinese)
            started = time.perf_counter()
            reference = symmetrized(align_words(src, tgt, out), "grow-diag-final-and")[-len(words):]
            print(f"eflomal on {len(src):,} pairs in {time.perf_counter() - started:.1f} s; attnmt's word "
                  f"links against its grow-diag-final-and: {scores(by_words, reference)}")


if __name__ == "__main__":
    main()
