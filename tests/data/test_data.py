"""Corpus readers, the cleaning rule and the toy task."""

from __future__ import annotations

import gzip
import json
import re
import unicodedata
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attnmt.config.schema import HfSource, JsonlSource, TextSource, ToySource, TsvSource, config_from_dict
from attnmt.data.prepare import prepare
from attnmt.data.readers import clean, count_lines, read_corpus, read_lines
from attnmt.data.toy import MONTHS, WEEKDAYS, toy_pairs, toy_split_of
from attnmt.errors import DataError
from attnmt.runfiles import RunDir

DE = ["Ein Hund läuft.", "Zwei Katzen schlafen.", "Der Mann liest ein Buch."]
EN = ["A dog runs.", "Two cats sleep.", "The man reads a book."]


def write_pair(tmp_path: Path, src: bytes | str, tgt: bytes | str, gz: bool = False) -> TextSource:
    paths = []
    for suffix, content in (("de", src), ("en", tgt)):
        data = content.encode("utf-8") if isinstance(content, str) else content
        path = tmp_path / (f"train.{suffix}.gz" if gz else f"train.{suffix}")
        path.write_bytes(gzip.compress(data) if gz else data)
        paths.append(path)
    return TextSource(src=paths[0], tgt=paths[1])


def lines(items: list[str]) -> str:
    return "".join(f"{x}\n" for x in items)


# ------------------------------------------------------------------------------------------ formats


@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gzip"])
def test_text_pair(tmp_path, gz):
    corpus = read_corpus(write_pair(tmp_path, lines(DE), lines(EN), gz=gz), "train")
    assert corpus.src == DE and corpus.tgt == EN
    assert corpus.read == 3 and corpus.dropped == {} and corpus.alignments is None


def test_gzip_is_detected_by_content_not_name(tmp_path):
    path = tmp_path / "train.de"
    path.write_bytes(gzip.compress(lines(DE).encode()))
    assert list(read_lines(path)) == DE


def test_last_line_without_newline_counts(tmp_path):
    source = write_pair(tmp_path, "a\nb", "c\nd\n")
    assert count_lines(source.src) == count_lines(source.tgt) == 2
    assert read_corpus(source, "train").src == ["a", "b"]


def test_tsv(tmp_path):
    path = tmp_path / "train.tsv"
    path.write_text("".join(f"{d}\t{e}\tnote {i}\n" for i, (d, e) in enumerate(zip(DE, EN))) + "\n",
                    encoding="utf-8")
    corpus = read_corpus(TsvSource(format="tsv", path=path), "train")
    assert corpus.src == DE and corpus.tgt == EN
    assert corpus.read == 4 and corpus.dropped == {"empty": 1}
    swapped = read_corpus(TsvSource(format="tsv", path=path, src_column=2, tgt_column=0), "train")
    assert swapped.src == ["note 0", "note 1", "note 2"] and swapped.tgt == DE


def test_tsv_with_too_few_columns(tmp_path):
    path = tmp_path / "train.tsv"
    path.write_text("a\tb\nonly one column\n", encoding="utf-8")
    with pytest.raises(DataError, match=rf"^{re.escape(str(path))}:2: "
                                        r"expected at least 2 tab-separated columns, found 1$"):
        read_corpus(TsvSource(format="tsv", path=path), "train")


def test_jsonl_flat_and_nested(tmp_path):
    path = tmp_path / "train.jsonl"
    records = [{"translation": {"de": d, "en": e}, "de": d, "en": e, "id": i}
               for i, (d, e) in enumerate(zip(DE, EN))]
    path.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in records) + "\n\n", encoding="utf-8")
    nested = read_corpus(JsonlSource(format="jsonl", path=path, src_field="translation.de",
                                     tgt_field="translation.en"), "train")
    flat = read_corpus(JsonlSource(format="jsonl", path=path, src_field="de", tgt_field="en"), "train")
    assert nested.src == flat.src == DE and nested.tgt == flat.tgt == EN


def test_jsonl_null_field_counts_as_empty(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text('{"de": "hallo", "en": "hello"}\n{"de": "welt", "en": null}\n', encoding="utf-8")
    corpus = read_corpus(JsonlSource(format="jsonl", path=path, src_field="de", tgt_field="en"), "train")
    assert corpus.src == ["hallo"] and corpus.dropped == {"empty target": 1}


@pytest.mark.parametrize(
    "content, field, expected",
    [
        ('{"translation": {"de": "a", "en": "b"}}\n', "translation.fr",
         r":1: no field 'translation.fr' \(keys here: de, en\)"),
        ('{"de": "a", "en": "b"}\n{"de": 3, "en": "b"}\n', "de", r":2: field 'de' is a int, not a string"),
        ('{"de": "a", "en": "b"}\n{"de": "a",\n', "de", r":2: invalid JSON: .* at column"),
    ],
    ids=["missing-field", "not-a-string", "invalid-json"],
)
def test_jsonl_errors_name_file_and_line(tmp_path, content, field, expected):
    path = tmp_path / "train.jsonl"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(DataError, match=re.escape(str(path)) + expected):
        read_corpus(JsonlSource(format="jsonl", path=path, src_field=field,
                                tgt_field="translation.en" if "." in field else "en"), "train")


def test_hf_json_builder_with_local_files(tmp_path):
    nested = tmp_path / "nested.jsonl"
    nested.write_text("".join(json.dumps({"translation": {"de": d, "en": e}}) + "\n" for d, e in zip(DE, EN)),
                      encoding="utf-8")
    flat = tmp_path / "flat.jsonl"
    flat.write_text("".join(json.dumps({"de": d, "en": e}) + "\n" for d, e in zip(DE[:2], EN[:2])),
                    encoding="utf-8")
    corpus = read_corpus(
        HfSource(format="hf", name="json", data_files=nested, src_field="translation.de",
                 tgt_field="translation.en"), "train"
    )
    assert corpus.src == DE and corpus.tgt == EN
    both = read_corpus(HfSource(format="hf", name="json", data_files=[flat, flat], src_field="de",
                                tgt_field="en"), "dev")
    assert both.src == DE[:2] * 2 and both.tgt == EN[:2] * 2


@pytest.mark.parametrize(
    "change, expected",
    [
        ({"split": "validation"}, r"Unknown split \"validation\"\. Should be one of \['train'\]"),
        ({"src_field": "source"}, r"has no field 'source' \(fields: translation\)"),
        ({"src_field": "translation.fr"}, r"no field 'translation\.fr' \(keys here: de, en\)"),
        ({"data_files": "missing.jsonl"}, r"missing\.jsonl: file not found"),
        ({"name": "nobody/no-such-dataset", "data_files": None},
         r"cannot load Hugging Face dataset 'nobody/no-such-dataset' \(offline"),
    ],
    ids=["unknown-split", "unknown-field", "unknown-nested-key", "missing-file", "hub-offline"],
)
def test_hf_errors(tmp_path, no_network, change, expected):
    path = tmp_path / "nested.jsonl"
    path.write_text(json.dumps({"translation": {"de": "a", "en": "b"}}) + "\n", encoding="utf-8")
    fields = {"format": "hf", "name": "json", "data_files": path, "src_field": "translation.de",
              "tgt_field": "translation.en"}
    fields.update(change)
    if isinstance(fields["data_files"], str):
        fields["data_files"] = tmp_path / fields["data_files"]
    with pytest.raises(DataError, match=expected):
        read_corpus(HfSource(**fields), "train")


def test_toy_source_carries_alignments():
    corpus = read_corpus(ToySource(format="toy", split="dev", size=20), "dev")
    assert len(corpus) == 20 and corpus.read == 20
    assert len(corpus.alignments) == 20


# ------------------------------------------------------------------------------------------- errors


def test_line_count_mismatch_names_both_files_and_counts(tmp_path):
    source = write_pair(tmp_path, lines(DE), lines(EN[:2]))
    with pytest.raises(DataError) as info:
        read_corpus(source, "train")
    assert str(info.value) == f"train: {source.src} has 3 lines, {source.tgt} has 2"


@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gzip"])
def test_invalid_utf8_names_file_line_and_byte(tmp_path, gz):
    source = write_pair(tmp_path, b"gut\nab\xff\xfe\n", b"good\nab\n", gz=gz)
    with pytest.raises(DataError) as info:
        read_corpus(source, "train")
    assert str(info.value) == f"{source.src}:2: invalid UTF-8 at byte offset 2"


def test_missing_file(tmp_path):
    source = TextSource(src=tmp_path / "nope.de", tgt=tmp_path / "nope.en")
    with pytest.raises(DataError, match=rf"^{re.escape(str(tmp_path / 'nope.de'))}: file not found$"):
        read_corpus(source, "train")


def test_directory_instead_of_file(tmp_path):
    (tmp_path / "train.de").mkdir()
    (tmp_path / "train.en").write_text("x\n")
    with pytest.raises(DataError,
                       match=rf"^{re.escape(str(tmp_path / 'train.de'))}: is a directory, not a file$"):
        read_corpus(TextSource(src=tmp_path / "train.de", tgt=tmp_path / "train.en"), "train")


def test_truncated_gzip(tmp_path):
    path = tmp_path / "train.de"
    path.write_bytes(gzip.compress(lines(DE * 50).encode())[:-20])
    with pytest.raises(DataError, match=rf"^{re.escape(str(path))}: cannot read"):
        list(read_lines(path))


def test_empty_corpus(tmp_path):
    with pytest.raises(DataError, match=r"^train: the corpus is empty"):
        read_corpus(write_pair(tmp_path, "", ""), "train")


def test_nothing_left_after_cleaning_stops_prepare(tmp_path):
    source = write_pair(tmp_path, "\n \n\x00\n", "a\n\n\n")
    cfg = config_from_dict(
        {"data": {"train": {"src": str(source.src), "tgt": str(source.tgt)}}, "model": {"arch": "lstm"}},
        base_dir=tmp_path
    )
    run = RunDir(tmp_path / "run")
    with pytest.raises(DataError,
                       match=r"^train: no training pairs left after cleaning \(1 empty source, 2 empty\)$"):
        prepare(cfg, run)
    assert not (run.root / "tokenizer").exists()


# ------------------------------------------------------------------------------- lines and cleaning


def test_empty_sides_are_dropped_and_counted(tmp_path):
    src = lines(["a", "", "c", "", "  ", "f"])
    tgt = lines(["A", "B", "", "", "E", "\t"])
    corpus = read_corpus(write_pair(tmp_path, src, tgt), "train")
    assert corpus.src == ["a"] and corpus.tgt == ["A"]
    assert corpus.read == 6
    assert corpus.dropped == {"empty source": 2, "empty target": 2, "empty": 1}


@pytest.mark.parametrize("separator", ["\r", "\u2028", "\u2029", "\x0b", "\x0c", "\x1c", "\x85"])
def test_only_newline_splits_lines(tmp_path, separator):
    # str.splitlines() would split on each of these and shift every later pair.
    src = lines([f"eins{separator}zwei", "drei"])
    tgt = lines(["one two", "three"])
    corpus = read_corpus(write_pair(tmp_path, src, tgt), "train")
    assert corpus.read == 2
    assert corpus.src == ["eins zwei", "drei"] and corpus.tgt == ["one two", "three"]


def test_crlf_endings_are_stripped(tmp_path):
    corpus = read_corpus(write_pair(tmp_path, "eins\r\nzwei\r\n", "one\ntwo\r\n"), "train")
    assert corpus.src == ["eins", "zwei"] and corpus.tgt == ["one", "two"]


def test_text_is_nfc(tmp_path):
    decomposed = "Cafe\u0301 u\u0308ber"
    corpus = read_corpus(write_pair(tmp_path, lines([decomposed]), lines(["x"])), "train")
    assert corpus.src == ["Café über"]
    assert unicodedata.is_normalized("NFC", corpus.src[0]) and len(corpus.src[0]) == 9


@pytest.mark.parametrize(
    "raw, expected",
    [
        ("a\x00b", "a b"),  # NUL -> space
        ("\x1b[31mred\x1b[0m text", "red text"),  # ANSI colour codes removed
        ("\x1b[1;32mbold green\x1b[m", "bold green"),
        ("tab\tseparated\t", "tab separated"),
        ("  many   spaces  ", "many spaces"),
        ("bell\x07 and del\x7f", "bell and del"),
        ("c1\x9bcontrol", "c1 control"),
        ("e\u0301", "\u00e9"),
        ("keeps 東京 😀 and Привет", "keeps 東京 😀 and Привет"),
        ("\x00\x1b\x7f", ""),
    ],
)
def test_clean(raw, expected):
    assert clean(raw) == expected
    assert clean(expected) == expected  # idempotent


def test_control_characters_do_not_misalign(tmp_path):
    src = lines(["ein\x00hund", "\x1b[31mrot\x1b[0m", "\x00", "ende"])
    tgt = lines(["a dog", "red", "nothing", "end"])
    corpus = read_corpus(write_pair(tmp_path, src, tgt), "train")
    assert list(zip(corpus.src, corpus.tgt)) == [("ein hund", "a dog"), ("rot", "red"), ("ende", "end")]
    assert corpus.dropped == {"empty source": 1}


# ------------------------------------------------------------------------------------------ toy task

WEEKDAY = dict(WEEKDAYS)
MONTH = dict(MONTHS)


def _time_24h(clock: str, half: str) -> str:
    hour, minute = clock.split(":")
    return f"{int(hour) % 12 + (12 if half == 'pm' else 0)}:{minute}"


def _translates(src_words: list[str], i: int, tgt_word: str) -> bool:
    """Is source word i a translation of tgt_word (the oracle for a sure alignment link)?"""
    word = src_words[i]
    if word in WEEKDAY:
        return WEEKDAY[word] == tgt_word
    if word in MONTH:
        return MONTH[word] == tgt_word
    if re.fullmatch(r"\d{1,2}(st|nd|rd|th)", word):
        return tgt_word == f"{int(word[:-2])}."
    if re.fullmatch(r"\d{4}", word):
        return tgt_word == word
    if re.fullmatch(r"\d{1,2}:\d\d", word):
        return tgt_word == _time_24h(word, src_words[i + 1])
    return {",": ",", "at": "um"}.get(word) == tgt_word


def test_toy_is_deterministic():
    assert toy_pairs("train", 50, seed=3) == toy_pairs("train", 50, seed=3)
    assert toy_pairs("train", 50, seed=3) != toy_pairs("train", 50, seed=4)


def test_toy_splits_are_disjoint_and_distinct():
    splits = {name: {src for src, _, _ in toy_pairs(name, size)}
              for name, size in (("train", 400), ("dev", 60), ("test", 60))}
    assert [len(s) for s in splits.values()] == [400, 60, 60]  # no duplicates inside a split
    assert (not splits["train"] & splits["dev"] and not splits["train"] & splits["test"]
            and not splits["dev"] & splits["test"])
    assert all(toy_split_of(src) == name for name, sources in splits.items() for src in sources)


def test_toy_alignments_are_valid_and_translate():
    for src, tgt, alignment in toy_pairs("train", 300):
        s, t = src.split(), tgt.split()
        links = [re.fullmatch(r"(\d+)([-?])(\d+)", link) for link in alignment.split()]
        assert all(links), alignment
        assert len(set(alignment.split())) == len(links)
        for m in links:
            i, j = int(m.group(1)), int(m.group(3))
            assert 0 <= i < len(s) and 0 <= j < len(t), (src, tgt, alignment)
            if m.group(2) == "-":
                assert _translates(s, i, t[j]), (src, tgt, m.group(0))
        sure_src = {int(m.group(1)) for m in links if m.group(2) == "-"}
        content = {i for i, w in enumerate(s) if w not in ("the", "of", ",", "am", "pm")}
        assert content <= sure_src, (src, alignment)  # every content word has a sure link


def test_toy_german_has_day_before_month():
    orders = set()
    for src, tgt, _ in toy_pairs("train", 300):
        s, t = src.split(), tgt.split()
        month_src = next(i for i, w in enumerate(s) if w in MONTH)
        day_src = next(i for i, w in enumerate(s) if re.fullmatch(r"\d{1,2}(st|nd|rd|th)", w))
        month_tgt = t.index(MONTH[s[month_src]])
        day_tgt = t.index(f"{int(s[day_src][:-2])}.")
        assert day_tgt + 1 == month_tgt  # German: "14. märz"
        if s[0] in WEEKDAY:
            assert t[:2] == [WEEKDAY[s[0]], ","]
        orders.add("month first" if month_src < day_src else "day first")
    assert orders == {"month first", "day first"}  # both English orders occur, so some pairs reorder


def test_toy_time_is_24_hour():
    seen_pm = False
    for src, tgt, _ in toy_pairs("train", 200):
        s, t = src.split(), tgt.split()
        if "at" in s:
            k = s.index("at")
            assert t[-3:] == ["um", _time_24h(s[k + 1], s[k + 2]), "uhr"]
            seen_pm |= s[k + 2] == "pm"
    assert seen_pm


def _clean_every_step(text: str) -> str:
    """``clean`` as it was written before its fast path: every step on every text."""
    text = unicodedata.normalize("NFC", text)
    text = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", text)
    text = re.sub(r"[\x00-\x08\x0a-\x1f\x7f-\x9f]", " ", text)
    return unicodedata.normalize("NFC", re.sub(r"\s+", " ", text).strip())


@settings(max_examples=600, deadline=None)
@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=40)
       | st.lists(st.sampled_from(["e", "\u0301", " ", "\u00a0", "\t", "猫", "\x1b[31m", "\u3000", "Å",
                                   "A\u030a", "\u2028", "\x85", "ﬁ", "\u200b"]), max_size=12).map("".join))
def test_the_fast_path_of_clean_is_the_rule(text):
    """Text with no control character and no whitespace but the space takes a shorter path: the same
    result as every step of the rule, on any text and on mixes of combining marks and odd spaces."""
    assert clean(text) == _clean_every_step(text)


def test_a_source_is_described_by_its_shortest_true_path():
    from attnmt.config.schema import TextSource, TsvSource
    from attnmt.data.readers import describe_source

    text = TextSource(src="configs/../../shared/train.de.gz", tgt="configs/./train.en.gz")
    assert describe_source(text) == "../shared/train.de.gz, configs/train.en.gz"
    assert describe_source(TsvSource(format="tsv", path="a/b/../c.tsv")) == "a/c.tsv"
