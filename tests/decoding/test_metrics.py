"""Corpus scores against sacrebleu's own command line (the oracle: the same files scored by
``sacrebleu REF... -i HYP``), the reference-file checks of ``score_corpus``, and the ``Score`` record."""

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from attnmt.decoding.metrics import METRICS, Score, corpus_scores, read_references, score_corpus
from attnmt.errors import DataError

SACREBLEU = Path(sys.executable).with_name("sacrebleu")

HYPS = [
    "The cat sat on the mat.",
    "there is a dog in the Garden",
    "I have not seen him since Monday!",
    "We'll meet at 3 o'clock, OK?",
    "the quick brown fox",
]
REF_1 = [
    "The cat sat on the mat.",
    "There is a dog in the garden.",
    "I haven't seen him since Monday.",
    "We will meet at three o'clock, okay?",
    "The quick brown fox jumps.",
]
REF_2 = [
    "A cat was sitting on the mat.",
    "A dog is in the garden.",
    "I have not seen him since Monday!",
    "We meet at 3 o'clock, OK?",
    "the quick brown fox",
]
HYPS_ZH = ["猫坐在垫子上。", "今天天气不错", "我昨天去了北京和上海", "他们在学习中文"]
REF_ZH = ["猫坐在垫子上。", "今天天气很好。", "我昨天去了上海", "他在学习汉语"]


def write_lines(path: Path, lines) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def cli_scores(tmp_path: Path, hyps, refs, *args: str) -> dict[str, tuple[float, str, str]]:
    """metric -> (score to 6 decimals, signature, text as sacrebleu's ``Score`` prints it) from the
    command line, for all three metrics at once."""
    hyp_file = write_lines(tmp_path / "hyp.txt", hyps)
    ref_files = [str(write_lines(tmp_path / f"ref{i}.txt", ref)) for i, ref in enumerate(refs)]

    def run(*extra: str) -> str:
        result = subprocess.run([str(SACREBLEU), *ref_files, "-i", str(hyp_file), "-m", "bleu", "chrf", "ter",
                                 *args, *extra], capture_output=True, text=True, timeout=60, check=True)
        return result.stdout

    precise = json.loads(run("-w", "6", "-f", "json"))
    # The text format prints "NAME|SIGNATURE = REST"; the library's Score prints "NAME = REST".
    text_lines = [line.strip() for line in run("-w", "2", "-f", "text").splitlines() if line.strip()]
    out = {}
    for metric, entry, line in zip(METRICS, precise, text_lines):
        head, rest = line.split(" = ", 1)
        name, signature = head.split("|", 1)
        assert signature == entry["signature"]
        out[metric] = (entry["score"], entry["signature"], f"{name} = {rest}")
    return out


def assert_same(ours: dict[str, Score], cli: dict[str, tuple[float, str, str]]):
    assert set(ours) == set(cli) == set(METRICS)
    for metric, (score, signature, text) in cli.items():
        assert ours[metric].name == metric
        assert ours[metric].score == pytest.approx(score, abs=1e-6), metric
        assert ours[metric].signature == signature
        assert ours[metric].text == text


def test_one_reference_matches_the_sacrebleu_command_line(tmp_path):
    ours = corpus_scores(HYPS, [REF_1])
    assert_same(ours, cli_scores(tmp_path, HYPS, [REF_1], "--ter-case-sensitive"))
    assert 0 < ours["bleu"].score < 100 and ours["bleu"].signature.startswith("nrefs:1|")


def test_two_references_match_the_sacrebleu_command_line(tmp_path):
    ours = corpus_scores(HYPS, [REF_1, REF_2])
    assert_same(ours, cli_scores(tmp_path, HYPS, [REF_1, REF_2], "--ter-case-sensitive"))
    assert ours["bleu"].signature.startswith("nrefs:2|")
    assert ours["bleu"].score > corpus_scores(HYPS, [REF_1])["bleu"].score  # the second one counts


def test_lowercase_matches_the_sacrebleu_command_line(tmp_path):
    ours = corpus_scores(HYPS, [REF_1], lowercase=True)
    assert_same(ours, cli_scores(tmp_path, HYPS, [REF_1], "-lc", "--chrf-lowercase"))
    cased = corpus_scores(HYPS, [REF_1])
    for metric in METRICS:  # the sample has case differences, so every metric sees the setting
        assert ours[metric].score != pytest.approx(cased[metric].score, abs=1e-6), metric
        assert "case:lc" in ours[metric].signature and "case:mixed" in cased[metric].signature


def test_chinese_tokenization_matches_the_sacrebleu_command_line(tmp_path):
    ours = corpus_scores(HYPS_ZH, [REF_ZH], tokenize="zh")
    assert_same(ours, cli_scores(tmp_path, HYPS_ZH, [REF_ZH], "-tok", "zh", "--ter-case-sensitive"))
    assert "tok:zh" in ours["bleu"].signature
    # 13a sees one "word" per sentence here: the tokenizer is what makes the Chinese score meaningful
    assert ours["bleu"].score != pytest.approx(corpus_scores(HYPS_ZH, [REF_ZH], tokenize="13a")["bleu"].score)


def test_the_target_language_picks_the_tokenizer_as_the_command_line_does(tmp_path):
    ours = corpus_scores(HYPS_ZH, [REF_ZH], tgt_lang="zh")
    # A Chinese target: BLEU with the zh tokenizer, TER with its Asian-character support.
    assert_same(ours, cli_scores(tmp_path, HYPS_ZH, [REF_ZH], "-l", "en-zh", "--ter-case-sensitive",
                                 "--ter-asian-support"))
    assert ours["bleu"].score == corpus_scores(HYPS_ZH, [REF_ZH], tokenize="zh")["bleu"].score


def test_only_the_metrics_asked_for():
    ours = corpus_scores(HYPS, [REF_1], metrics=["chrf"])
    assert list(ours) == ["chrf"]
    assert ours["chrf"].score == corpus_scores(HYPS, [REF_1])["chrf"].score


def test_a_reference_stream_of_another_length_is_refused():
    with pytest.raises(ValueError, match="reference 2 has 4 lines, the hypotheses have 5"):
        corpus_scores(HYPS, [REF_1, REF_2[:4]])


# ------------------------------------------------------------------------------------- score_corpus


def test_score_corpus_scores_checked_files(tmp_path):
    refs = read_references([write_lines(tmp_path / "a.txt", REF_1), write_lines(tmp_path / "b.txt", REF_2)])
    assert score_corpus(HYPS, "hyp.txt", refs) == corpus_scores(HYPS, [REF_1, REF_2])


def test_score_corpus_passes_its_settings_on(tmp_path):
    refs = [(tmp_path / "ref.zh", REF_ZH)]
    assert (score_corpus(HYPS_ZH, "hyp.zh", refs, ["bleu"], tokenize="zh", lowercase=True)
            == corpus_scores(HYPS_ZH, [REF_ZH], ["bleu"], tokenize="zh", lowercase=True))
    assert (score_corpus(HYPS_ZH, "hyp.zh", refs, ["bleu"], tgt_lang="zh")["bleu"].signature
            == corpus_scores(HYPS_ZH, [REF_ZH], ["bleu"], tgt_lang="zh")["bleu"].signature)


def test_score_corpus_refuses_an_empty_reference_file(tmp_path):
    empty = tmp_path / "empty.de"
    empty.write_text("", encoding="utf-8")
    refs = [(tmp_path / "ref.de", REF_1), *read_references([empty])]
    with pytest.raises(DataError) as info:
        score_corpus(HYPS, "hyp.de", refs)
    assert str(info.value) == f"{empty}: the reference file is empty"


def test_score_corpus_refuses_a_line_count_mismatch_naming_both_counts(tmp_path):
    short = tmp_path / "short.de"
    with pytest.raises(DataError) as info:
        score_corpus(HYPS, "hyp.de", [(tmp_path / "ref.de", REF_1), (short, REF_2[:3])])
    assert str(info.value) == f"hyp.de has 5 lines, {short} has 3"


def test_score_corpus_refuses_no_lines_at_all():
    with pytest.raises(DataError) as info:
        score_corpus([], "hyp.de", [])
    assert str(info.value) == "hyp.de: no lines to score"


def test_read_references_reads_plain_and_gzipped_files(tmp_path):
    plain = write_lines(tmp_path / "ref.de", REF_1)
    zipped = tmp_path / "ref2.de.gz"
    with gzip.open(zipped, "wt", encoding="utf-8") as handle:
        handle.write("\n".join(REF_ZH))  # no newline after the last line
    refs = read_references([str(plain), zipped])
    assert refs == [(plain, REF_1), (zipped, REF_ZH)]
    assert all(isinstance(path, Path) for path, _ in refs)


# ------------------------------------------------------------------------------------------- Score


def test_score_label():
    assert [Score(name, 1.0, "", "").label for name in METRICS] == ["BLEU", "chrF", "TER"]


def test_score_as_dict_rounds_the_score():
    score = Score("chrf", 56.228239838, "nrefs:1|case:mixed", "chrF2 = 56.23")
    assert score.as_dict() == {"metric": "chrf", "score": 56.2282, "signature": "nrefs:1|case:mixed",
                               "text": "chrF2 = 56.23"}
    assert json.loads(json.dumps(score.as_dict())) == score.as_dict()


def test_the_tokenize_choices_are_sacrebleus_tokenizers():
    """``eval --tokenize`` offers exactly the installed sacrebleu's BLEU tokenizers."""
    from sacrebleu.metrics.bleu import _TOKENIZERS

    from attnmt.config.choices import BleuTokenizer

    assert {t.value for t in BleuTokenizer} == set(_TOKENIZERS)
