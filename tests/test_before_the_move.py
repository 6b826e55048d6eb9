"""A checkpoint written before attnmt's modules moved into packages (issue 41) still loads, translates and
scores as it did: the log-probabilities of its toy pairs equal those the commit before the move printed
(``tests/fixtures/before_the_move/README.md`` says how they were made). A checkpoint holds tensors and
plain values only, so no module path was pickled into it; this proves it on a real file."""

from __future__ import annotations

import json

from helpers import REPO, run_attnmt

FIXTURE = REPO / "tests" / "fixtures" / "before_the_move"


def test_a_checkpoint_from_before_the_move_scores_as_it_did(tmp_path):
    pairs = ("--src", FIXTURE / "pairs.en", "--tgt", FIXTURE / "pairs.de")
    scored = run_attnmt("score", FIXTURE / "checkpoint.pt", *pairs, "--json")
    assert scored.returncode == 0, scored.stderr
    got = [json.loads(line) for line in scored.stdout.splitlines()]
    then = [json.loads(line) for line in (FIXTURE / "scores.jsonl").read_text(encoding="utf-8").splitlines()]
    assert len(got) == len(then) == 8
    for now, before in zip(got, then):
        assert now["tokens"] == before["tokens"]
        assert abs(now["logprob"] - before["logprob"]) < 1e-3 * max(1.0, abs(before["logprob"]))
    translated = run_attnmt("translate", FIXTURE / "checkpoint.pt", "-i", FIXTURE / "pairs.en",
                            "-o", tmp_path / "out.de")
    assert translated.returncode == 0, translated.stderr
    assert len((tmp_path / "out.de").read_text(encoding="utf-8").split("\n")) == 9  # 8 lines, each ended
