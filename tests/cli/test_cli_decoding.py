"""``attnmt translate``, ``eval`` and ``average`` as a user runs them, on a tiny model trained once for this
module: line alignment whatever the input, n-best output, atomic ``-o``, the exit-code contract, scores
equal to the sacrebleu command line, and averaged checkpoints checked against a float64 mean."""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
from helpers import OFFLINE_ENV, REPO, assert_one_error_line, hash_tree, trained_for_decoding
from typer.testing import CliRunner

from attnmt.cli import app

SACREBLEU = Path(sys.executable).with_name("sacrebleu")
# Toy-task sources (English dates); the model below translates each to a non-empty line.
SOURCES = [
    "monday , 3 june 2001",
    "saturday , 4th april 2004 at 3:15 pm",
    "friday , december 1st , 1999 at 11:30 am",
    "the 2nd of may 2010",
    "sunday , 7 july 1987 at 9:00 am",
]


@pytest.fixture(scope="module")
def run(tiny, tmp_path_factory) -> Path:
    """The tiny config trained to step 150 without dropout (the conftest reference, at step 30, still
    outputs empty lines); checkpoints at steps 100 and 150."""
    return trained_for_decoding(tiny, tmp_path_factory.mktemp("translate") / "run", save_every=50)


@pytest.fixture(scope="module")
def ckpt(run) -> Path:
    return run / "checkpoints" / "step_00000150.pt"


def invoke(*args, input: str | bytes | None = None):
    return CliRunner().invoke(app, [str(a) for a in args], input=input)


def translate(ckpt: Path, *args, input: str | bytes | None = None) -> list[str]:
    result = invoke("translate", ckpt, *args, input=input)
    assert result.exit_code == 0, result.output
    assert result.stdout == "" or result.stdout.endswith("\n")
    return result.stdout.split("\n")[:-1]


# ----------------------------------------------------------------------------------------- translate


def test_arguments_file_and_stdin_give_the_same_lines(ckpt, tmp_path):
    source = tmp_path / "in.en"
    source.write_text("\n".join(SOURCES) + "\n", encoding="utf-8")
    from_args = translate(ckpt, *SOURCES)
    assert len(from_args) == len(SOURCES) and all(from_args), from_args
    assert translate(ckpt, "-i", source) == from_args
    assert translate(ckpt, "-i", "-", input=source.read_bytes()) == from_args


@pytest.mark.parametrize(
    "data",
    [b"A\n\nB\n", b"A\n\nB", b"\n", b"\n\n\n", b"\nA\n\n\nB\n\n"],
    ids=["inner", "no-final-newline", "one-empty", "only-empty", "runs"],
)
def test_empty_lines_give_empty_lines(ckpt, tmp_path, data):
    text = data.replace(b"A", SOURCES[0].encode()).replace(b"B", SOURCES[1].encode())
    lines = text.decode().split("\n")
    lines = lines[:-1] if text.endswith(b"\n") else lines
    alone = dict(zip(SOURCES[:2], translate(ckpt, *SOURCES[:2])))
    source = tmp_path / "in.en"
    source.write_bytes(text)
    for out in (translate(ckpt, "-i", source), translate(ckpt, "-i", "-", input=text)):
        assert out == [alone[line] if line else "" for line in lines]


def test_nbest_is_sorted_and_its_first_is_the_one_best(ckpt):
    # The third: its 3-best has a longer hypothesis ranked above a shorter one with a higher log-probability
    # sum, so only the length-normalised score (the beam's ranking key) falls down the list.
    sources = SOURCES[:2] + ["thursday the 3rd of january 2087"]
    rows = [line.split("\t") for line in translate(ckpt, "--nbest", "3", "--beam-size", "3", *sources)]
    assert [int(r[0]) for r in rows] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    for i in range(3):
        scores = [float(r[1]) for r in rows if r[0] == str(i)]
        assert scores == sorted(scores, reverse=True) and all(s < 0 for s in scores)
        assert len({r[2] for r in rows if r[0] == str(i)}) > 1
    assert [r[2] for r in rows[::3]] == translate(ckpt, "--beam-size", "3", *sources)


def test_output_file_is_written_whole(ckpt, tmp_path):
    source, out = tmp_path / "in.en", tmp_path / "out" / "hyp.de"
    source.write_text("\n".join(SOURCES) + "\n", encoding="utf-8")
    result = invoke("translate", ckpt, "-i", source, "-o", out)
    assert result.exit_code == 0 and result.stdout == ""
    assert out.read_text(encoding="utf-8").split("\n")[:-1] == translate(ckpt, *SOURCES)
    assert os.listdir(out.parent) == ["hyp.de"]  # no temporary file left


def test_outputs_never_destroy_links_pipes_or_devices(ckpt, tmp_path):
    """-o through a symbolic link replaces the file it points to and keeps the link; into a named pipe or
    a device it writes straight through (the path stays what it was); a full device exits 5, one line."""
    import stat
    import threading

    expected = "".join(line + "\n" for line in translate(ckpt, *SOURCES))
    target, link = tmp_path / "real.de", tmp_path / "link.de"
    target.write_text("old\n", encoding="utf-8")
    link.symlink_to(target)
    result = invoke("translate", ckpt, *SOURCES, "-o", link)
    assert result.exit_code == 0, result.output
    assert link.is_symlink() and target.read_text(encoding="utf-8") == expected
    assert sorted(os.listdir(tmp_path)) == ["link.de", "real.de"]

    fifo = tmp_path / "pipe.de"
    os.mkfifo(fifo)
    received = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_text(encoding="utf-8")))
    reader.start()
    result = invoke("translate", ckpt, *SOURCES, "-o", fifo)
    reader.join(timeout=60)
    assert result.exit_code == 0, result.output
    assert received == [expected] and stat.S_ISFIFO(os.stat(fifo).st_mode)

    result = invoke("translate", ckpt, *SOURCES, "-o", "/dev/full")
    assert result.exit_code == 5, result.output
    assert assert_one_error_line(result.stderr) == "error: /dev/full: cannot write: no space left on device"
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode)


@pytest.mark.parametrize("existing", [None, b"old translations\n"])
def test_invalid_utf8_leaves_no_partial_output(ckpt, tmp_path, existing):
    source, out = tmp_path / "in.en", tmp_path / "hyp.de"
    source.write_bytes(f"{SOURCES[0]}\n{SOURCES[1]}\nbad \xff\xfe bytes\n{SOURCES[2]}\n".encode("latin-1"))
    if existing is not None:
        out.write_bytes(existing)
    before = hash_tree(tmp_path)
    result = invoke("translate", ckpt, "-i", source, "-o", out)
    assert result.exit_code == 3
    assert f"{source}:3:" in assert_one_error_line(result.stderr)
    assert hash_tree(tmp_path) == before  # output unchanged or absent, and no tmp file


@pytest.mark.parametrize("target", ["input", "checkpoint"])
def test_output_equal_to_an_input_is_refused(ckpt, tmp_path, target):
    model = tmp_path / "model.pt"
    shutil.copy(ckpt, model)
    source = tmp_path / "in.en"
    source.write_text(SOURCES[0] + "\n", encoding="utf-8")
    before = hash_tree(tmp_path)
    result = invoke("translate", model, "-i", source, "-o", {"input": source, "checkpoint": model}[target])
    assert result.exit_code == 2
    assert "refusing to overwrite the input" in assert_one_error_line(result.stderr)
    assert hash_tree(tmp_path) == before


@pytest.mark.parametrize(
    "args, fragment",
    [(["--beam-size", "100"], "exceeds the target vocabulary (64 pieces)"),
     (["--nbest", "4", "--beam-size", "3"], "--nbest 4 must not exceed the beam size 3")],
)  # fmt: skip
def test_impossible_beam_settings_exit_2(ckpt, args, fragment):
    result = invoke("translate", ckpt, *args, SOURCES[0])
    assert result.exit_code == 2
    assert fragment in assert_one_error_line(result.stderr)
    assert result.stdout == ""


def test_beam_size_zero_is_a_usage_error(ckpt):
    result = invoke("translate", ckpt, "--beam-size", "0", SOURCES[0])
    assert result.exit_code == 2 and "Traceback" not in result.output and result.stdout == ""


def test_empty_stdin_gives_no_output(ckpt):
    result = invoke("translate", ckpt, "-i", "-", input=b"")
    assert result.exit_code == 0 and result.stdout == "" and result.stderr == ""


def test_closed_pipe_stops_quietly(ckpt, tmp_path):
    """``| head -1`` closes the pipe after the first chunk of 1000 lines: no error, no traceback, exit 0."""
    big = tmp_path / "big.en"
    big.write_text("\n".join(SOURCES[i % 3] for i in range(3000)) + "\n", encoding="utf-8")
    script = (f'"{sys.executable}" -m attnmt translate "{ckpt}" -i "{big}" --beam-size 1 '
              f'2>"{tmp_path}/err" | head -1; exit "${{PIPESTATUS[0]}}"')
    result = subprocess.run(["bash", "-c", script], cwd=REPO, env={**os.environ, **OFFLINE_ENV},
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert (tmp_path / "err").read_text() == ""
    assert result.returncode == 0
    assert result.stdout.count("\n") == 1 and result.stdout.strip()


def test_a_pipe_gets_each_answer_before_it_sends_the_next_line(ckpt):
    """Streaming: a program that writes one line into attnmt's stdin and waits reads its translation
    while stdin is still open; then a second line; closing stdin ends the run with exit 0."""
    import select

    process = subprocess.Popen([sys.executable, "-m", "attnmt", "translate", str(ckpt), "--beam-size", "1"],
                               cwd=REPO, env={**os.environ, **OFFLINE_ENV}, stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1)
    try:
        answers = []
        for source in SOURCES[:2]:
            process.stdin.write(source + "\n")
            process.stdin.flush()
            ready, _, _ = select.select([process.stdout], [], [], 90)
            assert ready, "no translation came out while stdin stayed open"
            answers.append(process.stdout.readline().rstrip("\n"))
        process.stdin.close()
        assert process.wait(timeout=60) == 0, process.stderr.read()
    finally:
        process.kill()
    assert answers == translate(ckpt, *SOURCES[:2], "--beam-size", "1")


def test_ctrl_c_while_a_pipe_stays_open_exits_130(ckpt):
    """SIGINT after two answers, stdin still open (its reader thread blocked in a read): exit 130 with
    nothing on stderr. The reader held ``sys.stdin``'s lock, and the interpreter's shutdown aborted on it
    (SIGABRT, "could not acquire lock for <stdin> at interpreter shutdown") every time. SIGINT's default
    is restored for the child: a suite started in the background (``make test &``) ignores SIGINT, and so
    would every process it starts (the shell's rule for background jobs)."""
    process = subprocess.Popen([sys.executable, "-m", "attnmt", "translate", str(ckpt), "--beam-size", "1"],
                               cwd=REPO, env={**os.environ, **OFFLINE_ENV}, stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    said: list[str] = []  # stderr read as it comes: a full pipe would stop the process, not the signal
    reader = threading.Thread(target=lambda: said.extend(process.stderr), daemon=True)
    reader.start()
    try:
        for source in SOURCES[:2]:
            process.stdin.write(source + "\n")
            process.stdin.flush()
            assert process.stdout.readline().strip()
        process.send_signal(signal.SIGINT)
        code = process.wait(timeout=60)
        reader.join(10)
        assert (code, said) == (130, [])
    finally:
        process.kill()
        process.stdin.close()


def test_megabyte_line_is_truncated_with_one_warning(ckpt):
    huge = ("monday , 3 june 2001 " * 50_000)[:1_000_000]
    result = invoke("translate", ckpt, "-i", "-", "--beam-size", "1", input=f"{huge}\n{SOURCES[1]}\n")
    assert result.exit_code == 0, result.output
    lines = result.stdout.split("\n")
    assert len(lines) == 3 and lines[2] == ""
    assert lines[1] == translate(ckpt, "--beam-size", "1", SOURCES[1])[0]
    warning = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(warning) == 1 and warning[0].startswith(
        "warning: 1 line(s) longer than decode.max_src_len"
    ), result.stderr


def test_any_script_and_control_characters_keep_one_line_each(ckpt, tmp_path):
    lines = [
        "Привет, мир! 你好世界 🎉👩‍👩‍👧 العربية",
        "\x00nul\x00 and \x1b[31mred\x1b[0m",
        "carriage\rreturn, vertical\x0btab, form\x0cfeed",
        "next\x85line and line\u2028separator",
        "\x1b[31m\x1b[0m\x00",  # nothing left after cleaning: an empty output line
        "e\u0301 \u200b zero width",
        SOURCES[0],
    ]
    source = tmp_path / "mixed.txt"
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = translate(ckpt, "-i", source)
    assert len(out) == len(lines)
    assert out[4] == "" and out[6] == translate(ckpt, SOURCES[0])[0]


def test_a_file_translates_as_its_lines_do_alone(ckpt, tmp_path):
    """Batching (sorted by length, padded) does not change any sentence's translation."""
    source = tmp_path / "in.en"
    source.write_text("\n".join(SOURCES) + "\n", encoding="utf-8")
    assert translate(ckpt, "-i", source) == [translate(ckpt, line)[0] for line in SOURCES]


@pytest.mark.parametrize("damage", ["truncated", "random", "empty"])
def test_damaged_checkpoint_exits_4(ckpt, tmp_path, damage):
    bad = tmp_path / "bad.pt"
    data = ckpt.read_bytes()
    bad.write_bytes({"truncated": data[: len(data) // 2], "random": os.urandom(4096), "empty": b""}[damage])
    result = invoke("translate", bad, SOURCES[0])
    assert result.exit_code == 4
    assert str(bad) in assert_one_error_line(result.stderr)
    assert result.stdout == ""


def test_run_folder_without_checkpoint_exits_4(tiny, tmp_path):
    run_dir = tiny.copy_prepared(tmp_path / "run")
    result = invoke("translate", run_dir, SOURCES[0])
    assert result.exit_code == 4
    assert "no checkpoint" in assert_one_error_line(result.stderr)


# ---------------------------------------------------------------------------------------------- eval

HYPS = ["The cat sat on the mat .", "Hello World", "it is 7:05 pm on tuesday", "Das ist gut!"]
REFS = [
    ["the cat sat on a mat .", "hello world !", "It is 7:05 pm, Tuesday", "Das ist sehr gut!"],
    ["The cat was sitting on the mat.", "Hello, world.", "it's 19:05 on tuesday", "das ist gut !"],
]
HYPS_ZH = ["猫坐在垫子上。", "你好，世界", "今天是星期二"]
REFS_ZH = [["猫坐在席子上。", "你好世界！", "今天星期二"]]


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def sacrebleu_cli(refs: list[Path], hyp: Path, *flags: str) -> list[dict]:
    cmd = [str(SACREBLEU), *map(str, refs), "-i", str(hyp), "-m", "bleu", "chrf", "ter", "-w", "4", *flags]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def eval_json(*args) -> list[dict]:
    result = invoke("eval", "--json", *args)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.mark.parametrize(
    "case, attnmt_flags, sacrebleu_flags",
    [("one-ref", [], ["--ter-case-sensitive"]),
     ("two-refs", [], ["--ter-case-sensitive"]),
     ("lowercase", ["--lowercase"], ["-lc", "--chrf-lowercase"]),
     ("zh", ["--tokenize", "zh"], ["--tokenize", "zh", "--ter-case-sensitive"])],
)  # fmt: skip
def test_eval_equals_the_sacrebleu_command_line(tmp_path, case, attnmt_flags, sacrebleu_flags):
    hyps, refs = (HYPS_ZH, REFS_ZH) if case == "zh" else (HYPS, REFS[: 2 if case == "two-refs" else 1])
    hyp = write_lines(tmp_path / "hyp.txt", hyps)
    ref_files = [write_lines(tmp_path / f"ref{i}.txt", r) for i, r in enumerate(refs)]
    ours = eval_json("--hyp", hyp, *[a for r in ref_files for a in ("--ref", r)], *attnmt_flags)
    theirs = sacrebleu_cli(ref_files, hyp, *sacrebleu_flags)
    assert [s["metric"] for s in ours] == ["bleu", "chrf", "ter"]
    for mine, oracle in zip(ours, theirs):
        assert mine["signature"] == oracle["signature"]
        assert mine["score"] == pytest.approx(oracle["score"], abs=1.5e-4)
    assert 0 < ours[0]["score"] < 100


def test_eval_of_a_model_equals_translate_then_score(run, ckpt, tmp_path):
    src = write_lines(tmp_path / "src.en", SOURCES)
    ref = write_lines(tmp_path / "ref.de", ["montag , 3. juni 2001", "samstag , 4. april 2004 um 15:15 uhr",
                                            "freitag , 1. dezember 1999 um 11:30 uhr", "2. mai 2010",
                                            "sonntag , 7. juli 1987 um 09:00 uhr"])  # fmt: skip
    hyp = tmp_path / "hyp.de"
    hyp_out = tmp_path / "hyp_out.de"
    assert invoke("translate", ckpt, "-i", src, "-o", hyp).exit_code == 0
    direct = eval_json(ckpt, "--src", src, "--ref", ref, "--hyp-out", hyp_out)
    assert direct == eval_json("--hyp", hyp, "--ref", ref, "--tgt-lang", "de")
    assert hyp_out.read_bytes() == hyp.read_bytes()


@pytest.mark.parametrize(
    "hyp_lines, ref_lines, args, code, fragments",
    [(["a", "b", "c"], ["a", "b"], [], 3, ["hyp has 3 lines", "ref has 2"]),
     (["a"], [], [], 3, ["reference file is empty"]),
     (["a"], ["a"], ["--metrics", "bleu,meteor"], 2, ["meteor"])],
    ids=["count-mismatch", "empty-ref", "unknown-metric"],
)  # fmt: skip
def test_eval_refuses_bad_input(tmp_path, hyp_lines, ref_lines, args, code, fragments):
    hyp, ref = write_lines(tmp_path / "hyp", hyp_lines), write_lines(tmp_path / "ref", ref_lines)
    result = invoke("eval", "--hyp", hyp, "--ref", ref, *args)
    assert result.exit_code == code
    message = assert_one_error_line(result.stderr)
    assert all(f in message for f in fragments), message


# ------------------------------------------------------------------------------------------- average


def test_average_is_the_mean_and_translates(run, ckpt, tmp_path):
    first = run / "checkpoints" / "step_00000100.pt"
    out = tmp_path / "avg" / "average.pt"
    before = hash_tree(run / "checkpoints")
    result = invoke("average", first, ckpt, "--out", out)
    assert result.exit_code == 0, result.output
    assert os.listdir(out.parent) == ["average.pt"] and hash_tree(run / "checkpoints") == before
    payload = torch.load(out, weights_only=True)
    a, b = (torch.load(p, weights_only=True) for p in (first, ckpt))
    assert payload["averaged_from"] == [first.name, ckpt.name]
    assert payload["optimizer"] is None and payload["schedule"] is None
    assert payload["progress"] == a["progress"] and payload["config"] == a["config"]
    for name, tensor in payload["model"].items():
        assert tensor.dtype == a["model"][name].dtype
        if tensor.is_floating_point():
            mean = (a["model"][name].double() + b["model"][name].double()) / 2
            assert torch.allclose(tensor.double(), mean, rtol=0, atol=1e-7), name
        else:
            assert torch.equal(tensor, a["model"][name])
    # else the mean proves nothing
    assert any(not torch.equal(a["model"][n], b["model"][n]) for n in a["model"])
    assert len(translate(out, *SOURCES[:2])) == 2
    src, ref = write_lines(tmp_path / "src.en", SOURCES[:2]), write_lines(tmp_path / "ref.de", ["x", "y"])
    assert [s["metric"] for s in eval_json(out, "--src", src, "--ref", ref)] == ["bleu", "chrf", "ter"]


@pytest.mark.parametrize("change", ["model", "tokenizer"])
def test_average_of_different_models_exits_4(run, ckpt, tmp_path, change):
    other = torch.load(ckpt, weights_only=True)
    if change == "model":
        other["fingerprint"]["model"]["d_model"] = 32
        other["fingerprint"]["model_sha256"] = "0" * 64
    else:
        other["fingerprint"]["tokenizer"]["src_sha256"] = "0" * 64
    torch.save(other, tmp_path / "other.pt")
    result = invoke("average", run / "checkpoints" / "step_00000100.pt", tmp_path / "other.pt",
                    "--out", tmp_path / "avg.pt")
    assert result.exit_code == 4
    message = assert_one_error_line(result.stderr)
    assert "other.pt" in message and ("d_model: 16 -> 32" in message if change == "model"
                                      else "tokenizer" in message)
    assert not (tmp_path / "avg.pt").exists()


@pytest.mark.parametrize("case", ["one-input", "out-is-input", "twice"])
def test_average_usage_errors_exit_2(run, tmp_path, case):
    checkpoints = shutil.copytree(run / "checkpoints", tmp_path / "checkpoints")
    a, b = checkpoints / "step_00000100.pt", checkpoints / "step_00000150.pt"
    before = hash_tree(tmp_path)
    args = {"one-input": [a, "--out", tmp_path / "avg.pt"], "out-is-input": [a, b, "--out", b],
            "twice": [a, a, "--out", tmp_path / "avg.pt"]}[case]  # fmt: skip
    result = invoke("average", *args)
    assert result.exit_code == 2
    assert_one_error_line(result.stderr)
    assert hash_tree(tmp_path) == before


# ---------------------------------------------------------------------------------------------- score


def test_score_equals_what_beam_search_reports_for_its_own_outputs(ckpt, tmp_path):
    """Teacher-forced scores of the hypotheses beam search found are the scores it reports: the sum of
    log-probabilities (EOS included), and over the GNMT penalty the n-best score translate prints."""
    from attnmt.cli.common import open_translator
    from attnmt.decoding.search import gnmt_penalty
    from attnmt.decoding.translator import DecodeOverrides

    translator, _, _ = open_translator(ckpt, "cpu", DecodeOverrides(4, 3))
    hyps = translator.search(translator.encode(SOURCES).ids)
    pairs, expected = [], []
    for source, found in zip(SOURCES, hyps):
        for h in found:
            text = translator.tokenizer.decode_tgt([h.tokens])[0]
            # A barely trained model's text may not encode back to its own pieces ("..." as one piece);
            # those score other pieces, so only round trips are compared.
            if translator.tokenizer.encode_tgt([text])[0] == h.tokens:
                pairs.append((source, text))
                expected.append(h.score)
    assert len(pairs) >= len(SOURCES)
    scored = translator.score([p[0] for p in pairs], [p[1] for p in pairs])
    for s, total, (_, text) in zip(scored, expected, pairs):
        assert s.logprob == pytest.approx(total, abs=1e-4)
        assert s.tokens == len(translator.tokenizer.encode_tgt([text])[0]) + 1
        assert s.normalized == pytest.approx(total / gnmt_penalty(s.tokens, translator.decode.length_penalty))
    # The command prints the same, one line per pair in input order: TSV or JSON.
    src, tgt = tmp_path / "src.en", tmp_path / "hyp.de"
    src.write_text("".join(p[0] + "\n" for p in pairs), encoding="utf-8")
    tgt.write_text("".join(p[1] + "\n" for p in pairs), encoding="utf-8")
    result = invoke("score", ckpt, "--src", src, "--tgt", tgt, "--json")
    assert result.exit_code == 0, result.output
    printed = [json.loads(line) for line in result.stdout.splitlines()]
    assert [p["logprob"] for p in printed] == pytest.approx([s.logprob for s in scored], abs=1e-5)
    assert all(p["per_token"] == pytest.approx(p["logprob"] / p["tokens"], abs=1e-5) for p in printed)
    tsv = invoke("score", ckpt, "--src", src, "--tgt", tgt, "--length-penalty", "0")
    first = tsv.stdout.splitlines()[0].split("\t")
    assert len(first) == 4 and float(first[3]) == pytest.approx(float(first[0]), abs=1e-6)


def test_score_with_a_line_count_mismatch_exits_3(ckpt, tmp_path):
    src, tgt = tmp_path / "src.en", tmp_path / "hyp.de"
    src.write_text("a\nb\n", encoding="utf-8")
    tgt.write_text("x\n", encoding="utf-8")
    out = tmp_path / "scores.tsv"
    result = invoke("score", ckpt, "--src", src, "--tgt", tgt, "-o", out)
    assert result.exit_code == 3
    assert assert_one_error_line(result.stderr) == f"error: {src} has 2 lines, {tgt} has 1"
    assert not out.exists()


# -------------------------------------------------------------------------------------------- sampling


def test_sampling_gives_nbest_samples_per_line_and_repeats_with_its_seed(ckpt):
    args = ["--sampling", "--nbest", "3", "--temperature", "1.3", "--top-p", "0.95"]
    first = translate(ckpt, *SOURCES[:2], *args, "--seed", "5")
    assert first == translate(ckpt, *SOURCES[:2], *args, "--seed", "5")
    assert first != translate(ckpt, *SOURCES[:2], *args, "--seed", "6")
    assert [line.split("\t")[0] for line in first] == ["0", "0", "0", "1", "1", "1"]


@pytest.mark.parametrize("args, fragment", [
    (["--sampling", "--beam-size", "4"], "--sampling draws instead of searching"),
    (["--sampling", "--top-p", "0"], "--top-p 0.0: expected a value in (0, 1]"),
    (["--sampling", "--top-p", "1.5"], "--top-p 1.5: expected a value in (0, 1]"),
    (["--sampling", "--temperature", "0"], "--temperature 0.0: expected a number > 0"),
    (["--seed", "3"], "--seed is a sampling option: add --sampling"),
])
def test_bad_sampling_options_exit_2(ckpt, tmp_path, args, fragment):
    out = tmp_path / "out.de"
    result = invoke("translate", ckpt, SOURCES[0], *args, "-o", out)
    assert result.exit_code == 2, result.output
    assert fragment in assert_one_error_line(result.stderr)
    assert not out.exists()


# ------------------------------------------------------------------------------------------- ensembles


def test_an_ensemble_of_a_checkpoint_with_itself_translates_and_evaluates_as_it(ckpt, tmp_path):
    for beam in ("1", "4"):
        assert translate(ckpt, *SOURCES, "--ensemble", ckpt, "--beam-size", beam) == \
            translate(ckpt, *SOURCES, "--beam-size", beam)
    src, ref = tmp_path / "src.en", tmp_path / "ref.de"
    src.write_text("".join(s + "\n" for s in SOURCES), encoding="utf-8")
    ref.write_text("".join(s + "\n" for s in translate(ckpt, *SOURCES)), encoding="utf-8")
    alone = invoke("eval", ckpt, "--src", src, "--ref", ref, "--json")
    together = invoke("eval", ckpt, "--src", src, "--ref", ref, "--json", "--ensemble", ckpt)
    assert alone.exit_code == together.exit_code == 0
    assert json.loads(alone.stdout) == json.loads(together.stdout)


def test_an_ensemble_with_another_tokenizer_exits_4(ckpt, tiny, tmp_path):
    other = tmp_path / "other"  # the tiny recipe with another vocabulary: another tokenizer
    sets = ["tokenizer.vocab_size=50", "train.max_steps=2", "train.save_every=2", "train.eval_every=2"]
    trained = invoke("train", tiny.config["transformer"], "--run-dir", other,
                     *[x for item in sets for x in ("--set", item)])
    assert trained.exit_code == 0, trained.output
    out = tmp_path / "out.de"
    result = invoke("translate", ckpt, SOURCES[0], "--ensemble", other, "-o", out)
    assert result.exit_code == 4, result.output
    assert "must share one tokenizer" in assert_one_error_line(result.stderr)
    assert not out.exists()


# ------------------------------------------------------------------------------------------- --prefix


def test_translate_prefix_from_a_file(run, tmp_path):
    run_dir = run
    src, prefixes = tmp_path / "src.txt", tmp_path / "prefixes.txt"
    src.write_text("may 22nd 2040\nnovember 19th 1982\n1982\n", encoding="utf-8")
    prefixes.write_text("22\n\n1983\n", encoding="utf-8")
    result = CliRunner().invoke(app, ["translate", str(run_dir), "-i", str(src), "--prefix", str(prefixes)])
    assert result.exit_code == 0, result.output
    first, second, third = result.stdout.splitlines()
    assert first.startswith("22") and third.startswith("1983")
    free = CliRunner().invoke(app, ["translate", str(run_dir), "november 19th 1982"])
    assert second == free.stdout.strip()


@pytest.mark.parametrize("how", ["file", "arguments", "stdin"])
def test_a_prefix_file_of_another_line_count_is_refused(run, tmp_path, how):
    run_dir = run
    prefixes = tmp_path / "prefixes.txt"
    prefixes.write_text("22\n\n", encoding="utf-8")
    args, stdin = ["translate", str(run_dir), "--prefix", str(prefixes)], None
    if how == "file":
        (tmp_path / "src.txt").write_text("a\nb\nc\n", encoding="utf-8")
        args += ["-i", str(tmp_path / "src.txt"), "-o", str(tmp_path / "out.txt")]
    elif how == "arguments":
        args += ["may 22nd 2040"]
    else:
        stdin = "a\nb\nc\n"
    result = CliRunner().invoke(app, args, input=stdin)
    assert result.exit_code == 3
    line = assert_one_error_line(result.stderr)
    assert f"--prefix {prefixes} has 2 lines, but the input has" in line
    assert not (tmp_path / "out.txt").exists()


# ------------------------------------------------------------------------------------- --scores words


def test_translate_scores_words_agree_with_score_words(run, tmp_path):
    """``translate --scores words`` prints each output's words with their probabilities; ``score --words``
    on those outputs prints the same words and probabilities (teacher forcing of the same pieces)."""
    src = tmp_path / "src.txt"
    src.write_text("may 22nd 2040\n\nnovember 19th 1982\n", encoding="utf-8")
    result = CliRunner().invoke(app, ["translate", str(run), "-i", str(src), "--scores", "words",
                                      "--beam-size", "3", "--nbest", "2", "--length-penalty", "0"])
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(records) == 3 and [len(r["outputs"]) for r in records] == [2, 1, 2]
    assert records[1]["outputs"][0]["words"] == [] and records[1]["outputs"][0]["text"] == ""
    first = records[0]["outputs"][0]
    assert first["text"] and all(0 < w["prob"] <= 1 for w in first["words"])
    logprob = sum(math.log(w["prob"]) for w in first["words"]) + math.log(first["end"])
    assert logprob == pytest.approx(first["score"], abs=1e-4)
    hyp = tmp_path / "hyp.txt"
    hyp.write_text(first["text"] + "\n", encoding="utf-8")
    one = tmp_path / "one.txt"
    one.write_text("may 22nd 2040\n", encoding="utf-8")
    scored = CliRunner().invoke(app, ["score", str(run), "--src", str(one), "--tgt", str(hyp), "--words"])
    assert scored.exit_code == 0, scored.output
    (record,) = [json.loads(line) for line in scored.stdout.splitlines()]
    assert [w["word"] for w in record["words"]] == [w["word"] for w in first["words"]]
    expected = [w["prob"] for w in first["words"]]
    assert [w["prob"] for w in record["words"]] == pytest.approx(expected, abs=1e-5)
    assert record["logprob"] == pytest.approx(first["score"], abs=1e-4)


def test_prefixes_and_input_cannot_both_come_from_stdin(run):
    result = CliRunner().invoke(app, ["translate", str(run), "-i", "-", "--prefix", "-"], input="a\nb\n")
    assert result.exit_code == 2
    assert "the input and --prefix - would both read stdin" in assert_one_error_line(result.stderr)


# ------------------------------------------------------------------------------------- --constraints


def test_translate_constraints_from_a_file(run, tmp_path):
    src, phrases = tmp_path / "src.txt", tmp_path / "constraints.txt"
    src.write_text("may 22nd 2040\nnovember 19th 1982\n1982\n", encoding="utf-8")
    phrases.write_text("1983\n\n2041\t07\n", encoding="utf-8")
    result = CliRunner().invoke(app, ["translate", str(run), "-i", str(src), "--constraints", str(phrases),
                                      "--beam-size", "4", "--nbest", "2"])
    assert result.exit_code == 0, result.output
    rows = [line.split("\t") for line in result.stdout.splitlines()]
    assert [int(r[0]) for r in rows] == [0, 0, 1, 1, 2, 2]
    assert all("1983" in r[2] for r in rows[:2])
    assert all("2041" in r[2] and "07" in r[2] for r in rows[4:])
    free = CliRunner().invoke(app, ["translate", str(run), "november 19th 1982", "--beam-size", "4",
                                    "--nbest", "2"])
    assert [r[2] for r in rows[2:4]] == [line.split("\t")[2] for line in free.stdout.splitlines()]


@pytest.mark.parametrize("how", ["file", "arguments"])
def test_a_constraints_file_of_another_line_count_is_refused(run, tmp_path, how):
    phrases = tmp_path / "constraints.txt"
    phrases.write_text("22\n\n", encoding="utf-8")
    args = ["translate", str(run), "--constraints", str(phrases)]
    if how == "file":
        (tmp_path / "src.txt").write_text("a\nb\nc\n", encoding="utf-8")
        args += ["-i", str(tmp_path / "src.txt"), "-o", str(tmp_path / "out.txt")]
    else:
        args += ["may 22nd 2040"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 3
    assert f"--constraints {phrases} has 2 lines, but the input has" in assert_one_error_line(result.stderr)
    assert not (tmp_path / "out.txt").exists()


def test_phrases_longer_than_the_length_limit_are_refused_with_their_line(run, tmp_path):
    src, phrases, out = tmp_path / "src.txt", tmp_path / "constraints.txt", tmp_path / "out.txt"
    src.write_text("may 22nd 2040\n1982\n", encoding="utf-8")
    phrases.write_text("22\n" + "\t".join(str(n) for n in range(60)) + "\n", encoding="utf-8")
    out.write_text("kept\n", encoding="utf-8")
    result = CliRunner().invoke(app, ["translate", str(run), "-i", str(src), "--constraints", str(phrases),
                                      "-o", str(out)])
    assert result.exit_code == 3
    line = assert_one_error_line(result.stderr)
    assert line.startswith(f"error: --constraints {phrases} line 2: the phrases take ")
    assert "more than the line's length limit" in line
    assert out.read_text(encoding="utf-8") == "kept\n"


@pytest.mark.parametrize("args, message", [
    (["--sampling"], "--constraints needs a search: it cannot be used with --sampling"),
    (["--prefix", "-"], "--prefix - and --constraints - would both read stdin"),
    (["-i", "-"], "the input and --constraints - would both read stdin"),
])
def test_constraints_refuse_sampling_and_a_second_reader_of_stdin(run, args, message):
    constraints = "-" if "-" in args else __file__
    sentence = [] if "-i" in args else ["1982"]
    result = CliRunner().invoke(app, ["translate", str(run), *sentence, "--constraints", constraints, *args],
                                input="a\n")
    assert result.exit_code == 2
    assert message in assert_one_error_line(result.stderr)
