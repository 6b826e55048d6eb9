"""Tag transfer: how often a tag put around source words lands on exactly the target words a reference
alignment links them to (what ``attnmt translate --markup`` and serve's ``"markup": true`` do).

    python scripts/bench/bench_tags.py runs/toy_transformer_guided              # the toy test, its gold
    python scripts/bench/bench_tags.py runs/m30k --src test.en --tgt test.de --links test.align --translate

From a corpus with reference links (``--toy N``: the toy task's first N test pairs and their gold, the
default with N = 300; or ``--src``, ``--tgt`` and ``--links``, a Pharaoh file such as eflomal's, ``i-j``
zero-based unless ``--one-based``) it wraps source word spans in tags and checks where they come back.
Words are ``attnmt align``'s (``attnmt.data.words.segment``); a pair's reference links are every link the
file gives (sure and possible).

Which spans count: a source span [a, b) of 1 to ``--max-span`` words counts when every word in it has a
reference link and its reference span (the target words from the first to the last linked to a word of
[a, b)) holds no target word linked to a source word outside [a, b): the tag then has one right place.
Two such spans never share a target word, so tags on them never have to cross. Each line gets up to
``--tags-per-line`` such spans, drawn at random (``--seed``) among those that do not overlap, each wrapped
in a tag of its own name (``<b>``..``</b>``, then ``<i>``, ``<u>``, ...); a line with no such span is left
out (counted). The modes:

- links: ``place_tags`` with the reference links themselves, a check of the placer (100% expected);
- model: the model's own links between the source and the reference (teacher forcing, the reference
  force-decoded; ``carry_markup``, the links read as ``attnmt align`` reads the model by default);
- translate (``--translate``): the model's own translation, whose right span is unknown: only that every
  tag comes back once and the output is well-formed.

Per mode: tags, the share placed on exactly the reference span, and the share of lines whose output is
well-formed (it parses, holds each tag once, and is the target once its tags are out). Prints a markdown
table and writes ``--out`` (JSON). Goals: at least 97% exact on the toy gold, 85% on Multi30k against
eflomal's links. ``--smoke`` is CI's smoke run (``tests/scripts/test_scripts_smoke.py``): at most 20
lines, every mode, numbers meaningless.
"""

from __future__ import annotations

import html
import itertools
import json
import random
import sys
import time
from dataclasses import dataclass, field, fields
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/: scriptargs and the tools

from scriptargs import InputFile, Model, Number, OutputFile, ScriptParser, guarded

from attnmt.data.markup import MarkedText, MarkupError, parse_markup, place_tags
from attnmt.data.readers import clean, read_lines
from attnmt.data.words import segment
from attnmt.errors import ConfigError, DataError

TAG_NAMES = ("b", "i", "u", "em", "strong", "code", "mark", "small", "sub", "sup", "s", "q")
SMOKE_LINES = 20
MISSES = 20  # lines with a tag off its span kept in --out, per mode


@dataclass(frozen=True)
class Pair:
    source: str  # cleaned, as the model reads it
    target: str
    links: frozenset[tuple[int, int]]  # (source word, target word), every reference link


@dataclass(frozen=True)
class Span:
    name: str  # the tag's name
    start: int  # source words [start, end)
    end: int
    target: tuple[int, int]  # the reference span: target words [first, last + 1)


@dataclass(frozen=True)
class Case:
    """One line of the benchmark: its pair, the spans wrapped and the source with their tags."""

    pair: Pair
    spans: list[Span]
    marked: MarkedText


# ------------------------------------------------------------------------------------------ the corpus


def toy_corpus(size: int) -> list[Pair]:
    from attnmt.data.toy import toy_pairs
    from attnmt.insight.links import parse_pharaoh

    return [Pair(clean(src), clean(tgt), frozenset(parse_pharaoh(links)[1]))
            for src, tgt, links in toy_pairs("test", size)]


def file_corpus(src: Path, tgt: Path, links: Path, one_based: bool, limit: int | None) -> list[Pair]:
    """The pairs of ``src``/``tgt`` and their links; a link past its pair's words is a DataError."""
    from attnmt.insight.links import read_gold

    sources = [clean(line) for line in itertools.islice(read_lines(src), limit)]
    targets = [clean(line) for line in itertools.islice(read_lines(tgt), limit)]
    if len(targets) != len(sources):
        raise DataError(f"--src {src} has {len(sources)} lines, --tgt {tgt} has {len(targets)}")
    gold = read_gold(links, len(sources), src, one_based, limit)
    pairs = []
    for number, (source, target, linked) in enumerate(zip(sources, targets, gold.possible), start=1):
        words = len(segment(source)), len(segment(target))
        for i, j in sorted(linked):
            if i >= words[0] or j >= words[1]:
                shift = 1 if one_based else 0
                raise DataError(f"--links {links}:{number}: link {i + shift}-{j + shift} is past the pair's "
                                f"words ({words[0]} source, {words[1]} target)")
        pairs.append(Pair(source, target, frozenset(linked)))
    return pairs


# ------------------------------------------------------------------------------------------- the spans


def reference_spans(pair: Pair, max_span: int) -> list[tuple[int, int, tuple[int, int]]]:
    """Every source span that counts (the module docstring's rule): (start, end, reference span)."""
    linked: dict[int, set[int]] = {}
    for i, j in pair.links:
        linked.setdefault(i, set()).add(j)
    sources_of: dict[int, set[int]] = {}
    for i, j in pair.links:
        sources_of.setdefault(j, set()).add(i)
    found = []
    for start in range(len(segment(pair.source))):
        for end in range(start + 1, start + max_span + 1):
            if end - 1 not in linked:
                break  # every word of the span needs a link, and longer spans hold this one
            targets = set().union(*(linked[i] for i in range(start, end)))
            first, last = min(targets), max(targets)
            inside = range(start, end)
            if all(i in inside for j in range(first, last + 1) for i in sources_of.get(j, ())):
                found.append((start, end, (first, last + 1)))
    return found


def choose(candidates: list[tuple[int, int, tuple[int, int]]], k: int, rng: random.Random) -> list[Span]:
    """Up to ``k`` spans among ``candidates`` that do not overlap, drawn at random, in source order, each
    with a tag name of its own."""
    order = list(candidates)
    rng.shuffle(order)
    taken: list[tuple[int, int, tuple[int, int]]] = []
    for start, end, target in order:
        if len(taken) == k:
            break
        if all(end <= s or start >= e for s, e, _ in taken):
            taken.append((start, end, target))
    taken.sort()
    return [Span(tag_name(n), start, end, target) for n, (start, end, target) in enumerate(taken)]


def tag_name(n: int) -> str:
    return TAG_NAMES[n] if n < len(TAG_NAMES) else f"t{n}"


def wrap(source: str, spans: list[Span]) -> str:
    """``source`` with each span's words inside ``<name>``..``</name>``, the text between escaped."""
    words, offsets, cursor = segment(source), [], 0
    for word in words:
        at = source.index(word.text, cursor)
        offsets.append((at, at + len(word.text)))
        cursor = at + len(word.text)
    cuts = sorted([(offsets[s.end - 1][1], 0, f"</{s.name}>") for s in spans]
                  + [(offsets[s.start][0], 1, f"<{s.name}>") for s in spans])  # a close before an open
    out, done = [], 0
    for at, _, tag in cuts:
        out += [html.escape(source[done:at], quote=False), tag]
        done = at
    return "".join(out) + html.escape(source[done:], quote=False)


def cases(pairs: list[Pair], k: int, max_span: int, seed: int) -> list[Case]:
    """The lines with at least one span that counts, wrapped; the source must come back from its tags."""
    rng, found = random.Random(seed), []
    for number, pair in enumerate(pairs, start=1):
        spans = choose(reference_spans(pair, max_span), k, rng)
        if not spans:
            continue
        tagged = wrap(pair.source, spans)
        marked = parse_markup(tagged)
        if marked.text != pair.source or [t.name for t in marked.tags] != [s.name for s in spans]:
            raise RuntimeError(f"line {number}: parse_markup({tagged!r}) gave {marked.text!r} and tags "
                               f"{[t.name for t in marked.tags]}, not the source and its {len(spans)} tags")
        found.append(Case(pair, spans, marked))
    return found


# ------------------------------------------------------------------------------------------- scoring


@dataclass
class Tally:
    mode: str
    lines: int = 0
    tags: int = 0
    exact: int = 0  # tags on exactly their reference span
    kept: int = 0  # tags that came back exactly once
    well_formed: int = 0  # lines
    seconds: float = 0.0
    misses: list[dict] = field(default_factory=list)  # the first lines with a tag off its span, to read

    def add(self, case: Case, output: str, target: str, spans_known: bool) -> None:
        """One output: well-formed (it parses, holds each tag once, and is ``target`` without them), and
        for each tag whether it came back once and (``spans_known``) on its reference span."""
        self.lines += 1
        self.tags += len(case.spans)
        try:
            read = parse_markup(output)
        except MarkupError:
            self._miss(case, output)
            return
        for span in case.spans:
            mine = [t for t in read.tags if t.name == span.name]
            self.kept += len(mine) == 1
            exact = len(mine) == 1 and (mine[0].start, mine[0].end) == span.target
            self.exact += spans_known and exact
            if spans_known and not exact:
                self._miss(case, output)
        expected = sorted((t.open_text, t.close_text) for t in case.marked.tags)
        self.well_formed += read.text == target and sorted((t.open_text, t.close_text)
                                                            for t in read.tags) == expected

    def _miss(self, case: Case, output: str) -> None:
        if len(self.misses) < MISSES and (not self.misses or self.misses[-1]["output"] != output):
            words = [w.text for w in segment(case.pair.target)]
            self.misses.append({"source": wrap(case.pair.source, case.spans), "output": output,
                                "expected": {s.name: " ".join(words[slice(*s.target)]) for s in case.spans}})

    def row(self, spans_known: bool) -> dict:
        share = lambda n, of: round(100 * n / of, 2) if of else None  # noqa: E731
        return {"mode": self.mode, "lines": self.lines, "tags": self.tags,
                "exact_span_pct": share(self.exact, self.tags) if spans_known else None,
                "kept_once_pct": share(self.kept, self.tags), "well_formed_pct": share(self.well_formed,
                                                                                      self.lines),
                "seconds": round(self.seconds, 2), "misses": self.misses}


def run_mode(mode: str, found: list[Case], work, targets: list[str] | None = None) -> dict:
    """``work()``'s outputs, one a case, timed and scored against ``targets`` (default: the references;
    in translate mode the translations, whose reference spans are unknown)."""
    started = time.perf_counter()
    outputs = work()
    tally = Tally(mode, seconds=time.perf_counter() - started)
    known = targets is None
    targets = [case.pair.target for case in found] if targets is None else targets
    for case, output, target in zip(found, outputs, targets, strict=True):
        tally.add(case, output, target, spans_known=known)
    return tally.row(spans_known=known)


# ------------------------------------------------------------------------------------------- the runs


def build_parser() -> ScriptParser:
    parser = ScriptParser(description=__doc__)
    parser.add_argument("model", type=Model(), help="a run folder or a checkpoint (its attention is read)")
    parser.add_argument("--src", type=InputFile(pipes=True), help="source sentences, one a line")
    parser.add_argument("--tgt", type=InputFile(pipes=True), help="their references")
    parser.add_argument("--links", type=InputFile(pipes=True), help="the reference links (Pharaoh)")
    parser.add_argument("--one-based", action="store_true", help="--links counts words from 1")
    parser.add_argument("--toy", type=Number(int, low=1, high=100_000),
                        help="the toy task's first N test pairs and their gold (the default: 300)")
    parser.add_argument("--tags-per-line", type=Number(int, low=1, high=len(TAG_NAMES)), default=1)
    parser.add_argument("--max-span", type=Number(int, low=1, high=1000), default=3,
                        help="the longest span wrapped, in words")
    parser.add_argument("--seed", type=Number(int, low=0), default=1)
    parser.add_argument("--lines", type=Number(int, low=1), help="the corpus's first N lines only")
    parser.add_argument("--translate", action="store_true", help="also tag the model's own translations")
    parser.add_argument("--out", type=OutputFile(), help="write the results here (JSON)")
    parser.add_argument("--smoke", action="store_true",
                        help=f"CI's smoke run: at most {SMOKE_LINES} lines, every mode (numbers meaningless)")
    parser.checks.append(check_corpus)
    return parser


def check_corpus(args) -> None:
    files = {"--src": args.src, "--tgt": args.tgt, "--links": args.links}
    given = [name for name, value in files.items() if value is not None]
    if given and args.toy is not None:
        raise ConfigError(f"--toy: not with {given[0]} (one corpus: the toy task's, or yours)")
    if given and len(given) < 3:
        missing = [name for name in files if name not in given]
        raise ConfigError(f"{given[0]}: needs {' and '.join(missing)} too (sources, references, links)")
    if args.one_based and not given:
        raise ConfigError("--one-based: only with --links")


@guarded
def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    from attnmt.cli.common import open_translator
    from attnmt.insight.reading import carry_markup, default_align_options

    limit = min(args.lines or SMOKE_LINES, SMOKE_LINES) if args.smoke else args.lines
    if args.src is not None:
        pairs, corpus = file_corpus(args.src, args.tgt, args.links, args.one_based, limit), str(args.src)
    else:
        size = min(args.toy or 300, limit or sys.maxsize)
        pairs, corpus = toy_corpus(size), f"toy test, {size} pairs"
    found = cases(pairs, args.tags_per_line, args.max_span, args.seed)
    if not found:
        raise DataError(f"{corpus}: no line has a span of 1 to {args.max_span} words that counts (every word "
                        "linked, no target word of its span linked outside it)")
    translator, cfg, path = open_translator(args.model, exports=False)
    options = default_align_options(cfg, path)
    marked, references = [case.marked for case in found], [case.pair.target for case in found]
    rows = [run_mode("links", found, lambda: [place_tags(case.marked, case.pair.target, case.pair.links)
                                              for case in found]),
            run_mode("model", found, lambda: carry_markup(translator, marked, references, options))]
    if args.translate or args.smoke:  # timed: the tags carried, not the translating
        translations = translator.best([m.text for m in marked])
        carried = lambda: carry_markup(translator, marked, translations, options)  # noqa: E731
        rows.append(run_mode("translate", found, carried, translations))
    report(args, corpus, len(pairs), found, options, rows)


def described(options) -> str:
    """``AlignOptions`` in a few words: the layer, heads and method, and what differs from the defaults."""
    shown = [f"{f.name} {getattr(options, f.name)}" for f in fields(options)
             if f.name in ("layer", "heads", "method") or getattr(options, f.name) != f.default]
    return f"AlignOptions({', '.join(shown)})"


def report(args, corpus: str, lines: int, found: list[Case], options, rows: list[dict]) -> None:
    print(f"{corpus}: {len(found)} of {lines} lines with a span that counts, up to {args.tags_per_line} "
          f"tag(s) a line of 1 to {args.max_span} words; the model's links read as {described(options)}")
    print("\n| mode | lines | tags | exact target span | kept once | well-formed | seconds |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for row in rows:
        exact = "-" if row["exact_span_pct"] is None else f"{row['exact_span_pct']:.2f}%"
        print(f"| {row['mode']} | {row['lines']} | {row['tags']} | {exact} | {row['kept_once_pct']:.2f}% | "
              f"{row['well_formed_pct']:.2f}% | {row['seconds']} |")
    if args.out:
        args.out.write_text(json.dumps({
            "model": str(args.model), "corpus": corpus, "lines": lines, "lines_with_spans": len(found),
            "tags_per_line": args.tags_per_line, "max_span": args.max_span, "seed": args.seed,
            "align_options": described(options), "rows": rows}, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
