"""``attnmt distill`` and ``decoding.distill``: sequence-level knowledge distillation into a student's run
folder, resumable, refusing a second teacher.

Oracles: ``attnmt translate`` of the same sources with the same teacher and beam (the distilled corpus is
its output, line for line); an uninterrupted distillation (a stopped one, resumed, writes the same bytes);
the corpus's own pairs as the readers read them (one line each, in order, whatever they hold). The teacher
is the tiny model trained 150 steps (``helpers.trained_for_decoding``), whose outputs end on their own;
the student is the tiny config, trained a few steps. In-process (``CliRunner``), but for the teacher.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from helpers import expect_error, hash_tree, trained_for_decoding
from typer.testing import CliRunner

from attnmt.cli import app
from attnmt.cli.common import open_translator
from attnmt.config.choices import Device
from attnmt.config.schema import DataConfig, load_config
from attnmt.data.readers import clean, raw_pairs
from attnmt.decoding import distill as distill_module
from attnmt.decoding.distill import RECORD, Teacher, distill, student_config
from attnmt.decoding.translator import DecodeOverrides, Translator
from attnmt.errors import ConfigError

pytestmark = pytest.mark.usefixtures("restore_torch_state")  # in-process training: conftest.py

# A few steps: the student's training is `attnmt train`'s, tested elsewhere. The teacher's empty outputs
# are pairs that prepare drops, as it drops any empty pair.
STUDENT = ["--set", "train.max_steps=2", "--set", "train.eval_every=2", "--set", "train.save_every=2",
           "--set", "data.max_dropped_fraction=1"]
CHUNK = 16


def invoke(*args):
    deterministic = torch.are_deterministic_algorithms_enabled()
    try:
        return CliRunner().invoke(app, [str(a) for a in args])
    finally:
        torch.use_deterministic_algorithms(deterministic)  # the tiny config trains deterministically


def lines(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8")
    assert text == "" or text.endswith("\n")
    return text.split("\n")[:-1]


@pytest.fixture(scope="module")
def teacher_run(tiny, tmp_path_factory) -> Path:
    return trained_for_decoding(tiny, tmp_path_factory.mktemp("distill") / "teacher")


@pytest.fixture(scope="module")
def student(tiny, teacher_run, tmp_path_factory):
    """A student distilled from the teacher and trained 2 steps, uninterrupted: (run folder, result)."""
    run = tmp_path_factory.mktemp("distill") / "student"
    return run, invoke("distill", teacher_run, tiny.config["transformer"], "--run-dir", run, *STUDENT)


@pytest.fixture
def student_copy(student, tmp_path) -> Path:
    run, result = student
    assert result.exit_code == 0, result.output
    return Path(shutil.copytree(run, tmp_path / "student"))


@pytest.fixture(scope="module")
def teacher(teacher_run) -> Teacher:
    translator, cfg, path = open_translator(teacher_run, Device.cpu, DecodeOverrides())
    return Teacher(translator, cfg.data, (path,))


@pytest.fixture(scope="module")
def uninterrupted(tiny, teacher, tmp_path_factory) -> Path:
    """The tiny config's corpus distilled ``CHUNK`` lines at a time without a stop: its folder."""
    folder = tmp_path_factory.mktemp("distill") / "uninterrupted"
    distill(teacher, load_config(tiny.config["transformer"]).data, folder, CHUNK)
    return folder


def toy_sources(config: Path) -> list[str]:
    cfg = load_config(config)
    return [clean(src) for src, _, _, _ in raw_pairs(cfg.data.train, "train")]


# ------------------------------------------------------------------------------------ the command


def test_the_distilled_corpus_is_what_translate_gives_line_for_line(tiny, teacher_run, student):
    run, result = student
    assert result.exit_code == 0, result.output
    folder = run / "distilled"
    assert lines(folder / "train.src") == toy_sources(tiny.config["transformer"])
    oracle = invoke("translate", teacher_run, "--input", folder / "train.src")
    assert oracle.exit_code == 0, oracle.output
    assert (folder / "train.tgt").read_text(encoding="utf-8") == oracle.stdout
    assert len(lines(folder / "train.tgt")) == 200 and any(lines(folder / "train.tgt"))
    record = json.loads((folder / RECORD).read_text())
    assert record["done"] == [True] and record["decode"]["beam_size"] == 5  # the teacher's own beam
    assert "distilled data.train: 200 lines (200 translated by this run)" in result.stdout


def test_the_student_trains_on_the_distilled_corpus(student):
    run, _ = student
    assert (run / "checkpoints" / "step_00000002.pt").is_file()
    train = yaml.safe_load((run / "config.yaml").read_text())["data"]["train"]
    assert (train["src"], train["tgt"]) == (str(run / "distilled" / "train.src"),
                                           str(run / "distilled" / "train.tgt"))
    stats = {s["name"]: s for s in json.loads((run / "data" / "stats.json").read_text())}
    assert stats["train"]["read"] == 200


def test_the_same_command_again_translates_nothing_and_goes_on_training(tiny, teacher_run, student_copy,
                                                                        monkeypatch):
    before = hash_tree(student_copy / "distilled")
    monkeypatch.setattr(Translator, "translate", lambda *a, **k: pytest.fail("translated again"))
    result = invoke("distill", teacher_run, tiny.config["transformer"], "--run-dir", student_copy, *STUDENT,
                    "--set", "train.max_steps=3")
    assert result.exit_code == 0, result.output
    assert "200 lines (0 translated by this run)" in result.stdout
    assert hash_tree(student_copy / "distilled") == before
    assert (student_copy / "checkpoints" / "step_00000003.pt").is_file()


def test_ctrl_c_keeps_the_chunks_written_and_the_same_command_goes_on(tiny, teacher_run, student, tmp_path,
                                                                        monkeypatch):
    run = tmp_path / "student"
    monkeypatch.setattr(distill_module, "CHUNK_LINES", 64)
    translate, calls = Translator.translate, []

    def stopped_in_the_third(self, chunk, *args, **kwargs):
        calls.append(len(chunk))
        if len(calls) == 3:
            raise KeyboardInterrupt
        return translate(self, chunk, *args, **kwargs)

    monkeypatch.setattr(Translator, "translate", stopped_in_the_third)
    args = ["distill", teacher_run, tiny.config["transformer"], "--run-dir", run, *STUDENT]
    result = invoke(*args)
    assert result.exit_code == 130, result.output
    assert result.stderr.startswith("attnmt: stopped by SIGINT") and len(result.stderr.splitlines()) == 1
    assert len(lines(run / "distilled" / "train.src")) == len(lines(run / "distilled" / "train.tgt")) == 128
    assert not (run / "checkpoints").exists()
    calls.clear()
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    assert calls == [64, 8] and "200 lines (72 translated by this run)" in result.stdout
    done = student[0] / "distilled"
    assert hash_tree(run / "distilled") == hash_tree(done)


def test_keep_original_trains_on_both(tiny, teacher_run, tmp_path):
    run = tmp_path / "student"
    result = invoke("distill", teacher_run, tiny.config["transformer"], "--run-dir", run, "--keep-original",
                    *STUDENT)
    assert result.exit_code == 0, result.output
    train = yaml.safe_load((run / "config.yaml").read_text())["data"]["train"]
    assert [(c["format"], c.get("src")) for c in train] == [("text", str(run / "distilled" / "train.src")),
                                                           ("toy", None)]
    stats = {s["name"]: s for s in json.loads((run / "data" / "stats.json").read_text())}
    assert stats["train"]["read"] == 400
    assert (run / "checkpoints" / "step_00000002.pt").is_file()


@pytest.mark.parametrize("change, fragment", [
    (["--beam-size", "2"], "the decode settings changed: {folder} was started with --beam-size 5, now 2"),
    (["--ensemble", "<teacher>"], "the teacher changed: {folder} was started with"),
    ("<another teacher>", "the teacher changed: {folder} was started with"),
])
def test_another_teacher_or_beam_is_refused_in_one_line_and_nothing_changes(tiny, teacher_run, student_copy,
                                                                              change, fragment):
    teacher = tiny.reference("transformer") if change == "<another teacher>" else teacher_run
    extra = [] if isinstance(change, str) else [teacher_run if c == "<teacher>" else c for c in change]
    before = hash_tree(student_copy)
    result = invoke("distill", teacher, tiny.config["transformer"], "--run-dir", student_copy, *STUDENT,
                    *extra)
    expect_error(result, 2, fragment.format(folder=student_copy / "distilled"), "another --run-dir")
    assert hash_tree(student_copy) == before


def test_a_moved_run_folder_goes_on(tiny, teacher_run, student_copy, tmp_path):
    """Its data.train names files inside it: compared relative to the run folder, they are the same."""
    moved = tmp_path / "elsewhere" / "student"
    moved.parent.mkdir()
    student_copy.rename(moved)
    result = invoke("distill", teacher_run, tiny.config["transformer"], "--run-dir", moved, *STUDENT,
                    "--set", "train.max_steps=3")
    assert result.exit_code == 0, result.output
    assert (moved / "checkpoints" / "step_00000003.pt").is_file()


@pytest.mark.parametrize("where, fragment", [
    ("<teacher run>", "is the same file as TEACHER"),
    ("<teacher's checkpoint's run>", "this run was prepared with other data"),
    ("<a project>", "not an attnmt run folder"),
])
def test_a_run_folder_that_is_not_the_students_is_refused_untouched(tiny, teacher_run, tmp_path, where,
                                                                   fragment):
    run = Path(shutil.copytree(teacher_run, tmp_path / "teacher"))
    project = tmp_path / "project"
    (project / "data").mkdir(parents=True)
    (project / "data" / "mine.txt").write_text("keep\n")
    teacher = sorted(run.glob("checkpoints/step_*.pt"))[-1] if "checkpoint" in where else run
    target = project if where == "<a project>" else run
    before = hash_tree(tmp_path)
    result = invoke("distill", teacher, tiny.config["transformer"], "--run-dir", target, *STUDENT)
    expect_error(result, 2, fragment)
    assert hash_tree(tmp_path) == before


def test_a_missing_corpus_file_is_one_line_naming_it(teacher_run, tmp_path):
    config = tmp_path / "student.yaml"
    config.write_text(json.dumps({"data": {"train": {"src": "gone.en", "tgt": "gone.de"}},
                                  "model": {"arch": "transformer", "d_model": 16, "n_heads": 2}}))
    result = invoke("distill", teacher_run, config, "--run-dir", tmp_path / "run")
    expect_error(result, 3, str(tmp_path / "gone.en"), "file not found")


# ------------------------------------------------------------------------------------- the library


def stop(lines: int) -> None:
    raise KeyboardInterrupt


def test_a_stopped_distillation_resumed_writes_the_uninterrupted_bytes(tiny, teacher, uninterrupted,
                                                                        tmp_path):
    data, folder, chunks = load_config(tiny.config["transformer"]).data, tmp_path / "distilled", []

    def stop_after_three(n: int) -> None:
        chunks.append(n)
        if len(chunks) == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        distill(teacher, data, folder, CHUNK, stop_after_three)
    assert len(lines(folder / "train.tgt")) == 3 * CHUNK
    (done,) = distill(teacher, data, folder, CHUNK)
    assert (done.lines, done.translated) == (200, 200 - 3 * CHUNK)
    assert hash_tree(folder) == hash_tree(uninterrupted)


@pytest.mark.parametrize("src_tail, tgt_tail", [
    (b"", b"half a li"),  # a line cut in the middle
    (b"one more\nand half", b""),  # the source file a chunk ahead of the target's
    (b"a\n" * 5, b"x\n" * 3 + b"y"),  # part of a chunk on both sides: cut back to the chunk before
])
def test_a_half_written_end_is_cut_and_done_again(tiny, teacher, uninterrupted, tmp_path, src_tail, tgt_tail):
    data, folder = load_config(tiny.config["transformer"]).data, tmp_path / "distilled"
    with pytest.raises(KeyboardInterrupt):
        distill(teacher, data, folder, CHUNK, stop)
    with open(folder / "train.src", "ab") as src, open(folder / "train.tgt", "ab") as tgt:
        src.write(src_tail)
        tgt.write(tgt_tail)
    (done,) = distill(teacher, data, folder, CHUNK)
    assert done.translated == 200 - CHUNK
    assert hash_tree(folder) == hash_tree(uninterrupted)


def test_a_changed_corpus_is_refused_naming_it(tiny, teacher, uninterrupted, tmp_path):
    folder = shutil.copytree(uninterrupted, tmp_path / "distilled")
    data = load_config(tiny.config["transformer"], ["data.train.size=100"]).data
    with pytest.raises(ConfigError, match=r"^data.train changed: .* was started from another corpus"):
        distill(teacher, data, folder, CHUNK)


def test_a_changed_corpus_file_is_refused_naming_it(teacher, tmp_path):
    src, tgt = tmp_path / "train.en", tmp_path / "train.de"
    src.write_text("monday , 3 june 2001\n")
    tgt.write_text("montag , 3. juni 2001\n")
    data = DataConfig.model_validate({"train": {"src": src, "tgt": tgt}})
    distill(teacher, data, tmp_path / "distilled")
    src.write_text("tuesday , 4 june 2001\n")
    changed = rf"^data.train: {re.escape(str(src))} changed \(its size or time\)"
    with pytest.raises(ConfigError, match=changed):
        distill(teacher, data, tmp_path / "distilled")


def test_lines_without_their_record_are_refused(tiny, teacher, uninterrupted, tmp_path):
    folder = shutil.copytree(uninterrupted, tmp_path / "distilled")
    (folder / RECORD).unlink()
    with pytest.raises(ConfigError, match="distilled lines without their record"):
        distill(teacher, load_config(tiny.config["transformer"]).data, folder, CHUNK)


def test_every_pair_read_gives_one_line_whatever_it_holds(teacher, tmp_path):
    """Blank lines, an empty source, control characters and line separators, a field with a line break, a
    source over decode.max_src_len: one line each, in order, on both sides (an empty source's translation
    empty); two corpora, two pairs of files, each with its corpus's weight and tag."""
    tsv, jsonl = tmp_path / "a.tsv", tmp_path / "b.jsonl"
    long = " ".join(["monday , 3 june 2001"] * 80)
    tsv.write_text("monday , 3 june 2001\tx\n\n\ty\nfri\x1bday\u2028the 5th\tz\n" + long + "\tw\n",
                   encoding="utf-8")
    jsonl.write_text(json.dumps({"en": "sunday ,\n7 may 1999", "de": "x"}) + "\n" + "\n", encoding="utf-8")
    data = DataConfig.model_validate({"src_lang": "en", "tgt_lang": "de", "train": [
        {"format": "tsv", "path": tsv}, {"format": "jsonl", "path": jsonl, "src_field": "en",
                                         "tgt_field": "de", "weight": 2.0, "tag": "<bt>"}]})
    first, second = distill(teacher, data, tmp_path / "distilled")
    assert (first.source.src.name, second.source.tgt.name) == ("train.0.src", "train.1.tgt")
    assert lines(first.source.src) == ["monday , 3 june 2001", "", "", "fri day the 5th", clean(long)]
    assert lines(second.source.src) == ["sunday , 7 may 1999", ""]
    for corpus in (first, second):
        outputs = lines(corpus.source.tgt)
        assert len(outputs) == corpus.lines == len(lines(corpus.source.src))
        assert all(out == "" for src, out in zip(lines(corpus.source.src), outputs, strict=True) if not src)
    assert (second.source.weight, second.source.tag) == (2.0, "<bt>")


def test_the_student_config_lists_the_distilled_corpora_first_and_keeps_their_settings(tiny, tmp_path):
    cfg = load_config(tiny.config["transformer"], ["data.train={format: toy, split: train, size: 9, "
                                                   "tag: <bt>, weight: 3}"])
    only = student_config(cfg, tmp_path)
    assert (only.data.train.src, only.data.train.tag, only.data.train.weight) == (tmp_path / "train.src",
                                                                                   "<bt>", 3.0)
    both = student_config(cfg, tmp_path, keep_original=True)
    assert [c.format for c in both.data.corpora()] == ["text", "toy"]
    assert both.data.corpora()[1] == cfg.data.train


def test_a_multilingual_teacher_is_asked_for_each_corpuss_target_language(multilingual, tmp_path,
                                                                          monkeypatch):
    """Oracle: the teacher's translator asked for that language (``translate --tgt-lang``); and the source
    prefix each chunk went with (the tiny teacher's outputs may all be empty)."""
    translator, cfg, path = open_translator(multilingual, Device.cpu, DecodeOverrides())
    translate, prefixes = Translator.translate, []

    def seen(self, chunk, *args, **kwargs):
        prefixes.append(self.source_prefix)
        return translate(self, chunk, *args, **kwargs)

    monkeypatch.setattr(Translator, "translate", seen)
    toy = {"format": "toy", "split": "train", "size": 12}
    data = DataConfig.model_validate({"src_lang": "en", "tgt_lang": "de", "train": [
        {**toy, "tgt_lang": "de"}, {**toy, "seed": 2, "lang": "zh", "tgt_lang": "zh"}]})
    distilled = distill(Teacher(translator, cfg.data, (path,)), data, tmp_path / "distilled")
    assert prefixes == ["<2de>", "<2zh>"]
    for corpus, lang in zip(distilled, ("de", "zh"), strict=True):
        oracle, _, _ = open_translator(multilingual, Device.cpu, DecodeOverrides(tgt_lang=lang))
        assert lines(corpus.source.tgt) == oracle.best(lines(corpus.source.src))
