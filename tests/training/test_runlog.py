"""``MetricsLog``: one JSON line per record (``event`` first, then the record's fields, then
``elapsed_s``), the reporter told of every event, nothing written or shown off the main rank, resume's
``truncate``, and the TensorBoard scalars (through a recording stand-in for ``SummaryWriter``)."""

import json
from dataclasses import fields

import pytest

from attnmt.runfiles import RunDir
from attnmt.training.runlog import (
    Finished,
    Message,
    MetricsLog,
    NonfiniteRecord,
    Started,
    StopReason,
    TrainRecord,
    ValidRecord,
    quiet,
)


class FakeTensorboard:
    """What ``MetricsLog`` needs of a ``SummaryWriter``, recorded."""

    def __init__(self):
        self.scalars, self.flushes, self.closed = [], 0, False

    def add_scalar(self, tag, value, step):
        self.scalars.append((tag, value, step))

    def flush(self):
        self.flushes += 1

    def close(self):
        self.closed = True


def train_record(step=10, grad_norm=1.25):
    return TrainRecord(step=step, epoch=0.5, loss=3.25, nll=3.0, lr=1e-3, tokens_per_s=1234.5,
                       grad_norm=grad_norm)


def valid_record(step=20):
    return ValidRecord(step=step, loss=2.5, ppl=12.18, bleu=17.5, chrf=40.25, bleu_signature="nrefs:1|bleu",
                       chrf_signature="nrefs:1|chrf", example="Grüße, 3. März")


def nonfinite_record(step=7):
    return NonfiniteRecord(step=step, skips=2, sentences=[4, 8, 15])


def make_log(tmp_path, main=True, tensorboard=None, elapsed=12.3456):
    reported = []
    log = MetricsLog(RunDir(tmp_path), main, reported.append, lambda: elapsed, tensorboard)
    return log, reported


def lines(run_dir):
    return (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()


@pytest.mark.parametrize("make", [train_record, valid_record, nonfinite_record])
def test_record_appends_one_json_line_event_first_then_fields_then_elapsed(tmp_path, make):
    log, reported = make_log(tmp_path)
    record = make()
    log.record(record)
    (line,) = lines(tmp_path)
    written = json.loads(line)
    names = [f.name for f in fields(record)]
    assert list(written) == ["event", *names, "elapsed_s"]
    assert written["event"] == type(record).event
    assert {name: written[name] for name in names} == {name: getattr(record, name) for name in names}
    assert written["elapsed_s"] == 12.35
    assert reported == [record]


def test_records_append_in_order_and_keep_earlier_lines(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"event": "train", "step": 1}\n', encoding="utf-8")
    log, reported = make_log(tmp_path)
    records = [train_record(10), valid_record(10), nonfinite_record(11), train_record(20, grad_norm=None)]
    for record in records:
        log.record(record)
    written = [json.loads(line) for line in lines(tmp_path)]
    assert [(r["event"], r["step"]) for r in written] == [("train", 1), ("train", 10), ("valid", 10),
                                                          ("nonfinite", 11), ("train", 20)]
    assert written[-1]["grad_norm"] is None
    assert reported == records


def test_non_ascii_text_is_written_as_it_is(tmp_path):
    log, _ = make_log(tmp_path)
    log.record(valid_record())
    assert '"example": "Grüße, 3. März"' in lines(tmp_path)[0]


def test_off_the_main_rank_nothing_is_written_or_reported(tmp_path):
    tensorboard = FakeTensorboard()
    log, reported = make_log(tmp_path, main=False, tensorboard=tensorboard)
    log.record(train_record())
    log.record(valid_record())
    log.show(Message("hello"))
    assert not (tmp_path / "metrics.jsonl").exists()
    assert reported == [] and tensorboard.scalars == [] and tensorboard.flushes == 0


@pytest.mark.parametrize("event", [
    Started(step=0, total=30, steps_per_epoch=10, world_size=1, device="cpu", parameters=1000),
    Message("resumed from step 10"),
    Finished(step=30, reason=StopReason.max_steps, best_score=12.5, best_step=20),
    Finished(step=0, reason=None, best_score=None, best_step=None),
])  # fmt: skip
def test_show_reports_but_never_writes(tmp_path, event):
    tensorboard = FakeTensorboard()
    log, reported = make_log(tmp_path, tensorboard=tensorboard)
    log.show(event)
    assert reported == [event]
    assert not (tmp_path / "metrics.jsonl").exists()
    assert tensorboard.scalars == []


def test_show_off_the_main_rank_reports_nothing(tmp_path):
    log, reported = make_log(tmp_path, main=False)
    log.show(Message("hello"))
    assert reported == []


def test_quiet_reporter_accepts_every_event(tmp_path):
    log = MetricsLog(RunDir(tmp_path), True, quiet, lambda: 0.0)
    log.record(train_record())
    log.show(Message("x"))
    assert len(lines(tmp_path)) == 1


def write_metrics(run_dir, text):
    (run_dir / "metrics.jsonl").write_bytes(text.encode("utf-8") if isinstance(text, str) else text)


def test_truncate_keeps_records_up_to_the_step(tmp_path):
    log, _ = make_log(tmp_path)
    for step in (5, 10, 15, 20):
        log.record(train_record(step))
        if step % 10 == 0:
            log.record(valid_record(step))
    before = lines(tmp_path)
    log.truncate(10)
    after = lines(tmp_path)
    assert [(json.loads(line)["event"], json.loads(line)["step"]) for line in after] == [
        ("train", 5), ("train", 10), ("valid", 10)]
    assert after == before[:3]  # kept lines are kept byte for byte


def test_truncate_drops_a_half_written_last_line(tmp_path):
    log, _ = make_log(tmp_path)
    log.record(train_record(5))
    full = lines(tmp_path)[0]
    with open(tmp_path / "metrics.jsonl", "a", encoding="utf-8") as handle:
        handle.write(full[: len(full) // 2])  # killed mid-write: no newline, not JSON
    log.truncate(100)
    assert lines(tmp_path) == [full]
    assert (tmp_path / "metrics.jsonl").read_text(encoding="utf-8").endswith("\n")


def test_truncate_drops_a_line_cut_inside_a_character(tmp_path):
    """``ensure_ascii=False`` writes "ü" as two bytes; a run killed between them leaves a last line that is
    not JSON (nor UTF-8), which must go like any other half-written line."""
    log, _ = make_log(tmp_path)
    log.record(train_record(5))
    full = lines(tmp_path)[0]
    torn = '{"event": "valid", "step": 5, "example": "Grü'.encode()[:-1]
    with open(tmp_path / "metrics.jsonl", "ab") as handle:
        handle.write(torn)
    log.truncate(100)
    assert lines(tmp_path) == [full]


def test_truncate_to_zero_keeps_nothing_of_a_killed_first_run(tmp_path):
    log, _ = make_log(tmp_path)
    log.record(train_record(1))
    log.record(train_record(2))
    log.truncate(0)
    assert (tmp_path / "metrics.jsonl").read_text(encoding="utf-8") == ""


def test_truncate_without_a_log_or_off_the_main_rank_does_nothing(tmp_path):
    log, _ = make_log(tmp_path)
    log.truncate(10)
    assert not (tmp_path / "metrics.jsonl").exists()
    text = '{"event": "train", "step": 50}\n{"event": "tr'
    write_metrics(tmp_path, text)
    other, _ = make_log(tmp_path, main=False)
    other.truncate(10)
    assert (tmp_path / "metrics.jsonl").read_text(encoding="utf-8") == text


def test_tensorboard_gets_one_scalar_per_numeric_field_but_step(tmp_path):
    tensorboard = FakeTensorboard()
    log, _ = make_log(tmp_path, tensorboard=tensorboard)
    log.record(train_record(10))
    assert tensorboard.scalars == [("train/epoch", 0.5, 10), ("train/loss", 3.25, 10), ("train/nll", 3.0, 10),
                                   ("train/lr", 1e-3, 10), ("train/tokens_per_s", 1234.5, 10),
                                   ("train/grad_norm", 1.25, 10)]
    assert tensorboard.flushes == 1
    tensorboard.scalars.clear()
    log.record(train_record(11, grad_norm=None))  # no gradient norm: no scalar for it
    tags = [tag for tag, _, _ in tensorboard.scalars]
    assert tags == ["train/epoch", "train/loss", "train/nll", "train/lr", "train/tokens_per_s"]


def test_tensorboard_skips_text_and_lists(tmp_path):
    tensorboard = FakeTensorboard()
    log, _ = make_log(tmp_path, tensorboard=tensorboard)
    log.record(valid_record(20))
    log.record(nonfinite_record(21))
    assert tensorboard.scalars == [("valid/loss", 2.5, 20), ("valid/ppl", 12.18, 20),
                                   ("valid/bleu", 17.5, 20), ("valid/chrf", 40.25, 20),
                                   ("nonfinite/skips", 2, 21)]
    assert tensorboard.flushes == 2


def test_close_closes_tensorboard(tmp_path):
    tensorboard = FakeTensorboard()
    log, _ = make_log(tmp_path, tensorboard=tensorboard)
    assert not tensorboard.closed
    log.close()
    assert tensorboard.closed
    make_log(tmp_path)[0].close()  # without TensorBoard: nothing to close


def test_valid_record_score_reads_the_metric():
    record = valid_record()
    assert record.score("bleu") == 17.5 and record.score("chrf") == 40.25


def test_stop_reasons_are_the_strings_the_command_line_prints():
    assert {reason.name: reason.value for reason in StopReason} == {
        "max_steps": "max_steps", "max_epochs": "max_epochs", "max_minutes": "max_minutes",
        "early_stopping": "early stopping", "signal": "signal"}
    assert StopReason("early stopping") is StopReason.early_stopping
    assert f"{StopReason.early_stopping.value}" == "early stopping"
    assert StopReason.early_stopping == "early stopping"  # a str Enum: compares as its text
