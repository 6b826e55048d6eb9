"""``scripts/eflomal_align.py``: eflomal's links on the toy corpus against its gold, one line per line as
read (an empty line stays empty), and the careless calls refused in one line with nothing overwritten."""

from __future__ import annotations

import subprocess
import sys

import pytest
from helpers import OFFLINE_ENV, REPO, run_attnmt

from attnmt.insight.links import alignment_scores, parse_pharaoh

SCRIPT = REPO / "scripts" / "eflomal_align.py"


def eflomal_align(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], cwd=REPO, env=OFFLINE_ENV,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    data = tmp_path_factory.mktemp("toy")
    assert run_attnmt("toy-data", str(data), "--train-size", "500", "--dev-size", "5",
                      "--test-size", "5").returncode == 0
    return data


def test_eflomal_links_agree_with_the_toy_gold(toy, tmp_path):
    out = tmp_path / "train.align"
    result = eflomal_align("--src", toy / "train.en", "--tgt", toy / "train.de", "-o", out)
    assert result.returncode == 0, result.stderr
    predicted = [parse_pharaoh(line)[0] for line in out.read_text(encoding="utf-8").splitlines()]
    gold = [parse_pharaoh(line) for line in (toy / "train.align").read_text(encoding="utf-8").splitlines()]
    assert len(predicted) == len(gold) == 500
    score = alignment_scores(predicted, [s for s, _ in gold], [s | p for s, p in gold])
    assert score.aer < 0.15, score  # 6.9% measured; a word index off by one would be far above


def test_an_empty_line_gets_an_empty_line_and_words_are_attnmts(tmp_path):
    src, tgt, out = tmp_path / "a.de", tmp_path / "a.en", tmp_path / "a.align"
    src.write_text("das Haus\n\nein Hund\n我 爱 你\n", encoding="utf-8")
    tgt.write_text("the house\nnothing here\na dog\n我爱你\n", encoding="utf-8")
    assert eflomal_align("--src", src, "--tgt", tgt, "-o", out).returncode == 0
    lines = out.read_text(encoding="utf-8").split("\n")
    assert len(lines) == 5 and lines[1] == "" and lines[4] == ""
    for line, n_src, n_tgt in zip(lines, (2, 0, 2, 3), (2, 2, 2, 3)):  # 我爱你: three CJK words
        assert all(i < n_src and j < n_tgt for i, j in parse_pharaoh(line)[0])


def test_careless_calls_are_refused_and_nothing_is_overwritten(toy, tmp_path):
    src = toy / "train.en"
    before = src.read_bytes()
    result = eflomal_align("--src", src, "--tgt", toy / "train.de", "-o", src)
    assert result.returncode == 2 and "is the same file as --src" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and src.read_bytes() == before
    short = tmp_path / "short.de"
    short.write_text("ein Hund\n", encoding="utf-8")
    result = eflomal_align("--src", src, "--tgt", short, "-o", tmp_path / "x.align")
    assert result.returncode == 3 and "must be aligned by line" in result.stderr
    assert not (tmp_path / "x.align").exists()
    result = eflomal_align("--src", tmp_path / "none.en", "--tgt", short, "-o", tmp_path / "x.align")
    assert result.returncode == 3 and "no such file" in result.stderr


def test_output_to_a_pipe_and_input_from_one(toy):
    """``-o /dev/stdout`` into a pipe (a link to /proc/PID/fd/pipe:[N], which has no name to open) is
    written through, and ``--src /dev/stdin`` reads a pipe."""
    source = (toy / "train.en").read_text(encoding="utf-8")
    command = [sys.executable, str(SCRIPT), "--src", "/dev/stdin", "--tgt", str(toy / "train.de"), "-o",
               "/dev/stdout"]
    result = subprocess.run(command, cwd=REPO, env=OFFLINE_ENV, input=source, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 500 and all(parse_pharaoh(line)[0] for line in lines[:50])
