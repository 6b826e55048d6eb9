"""Every ``attnmt ...`` command in a fenced code block of README.md and docs/**/*.md parses against the
current command line (``attnmt.cli:app``): an unknown command, an unknown option, an option without its
value, a value outside an option's choices, or an argument too many fails, naming FILE:LINE.

What counts as a command: a line of a code block (any language) whose first word is ``attnmt`` (or a path
ending in ``/attnmt``), after a ``$ `` prompt and ``VAR=value`` prefixes; also each part of a pipeline or
list (``|``, ``&&``, ``||``, ``;``) that is one. Lines ending in ``\\`` are joined to the next; ``# ...``
comments, redirections (``> FILE``, ``2>&1``, ``< FILE``) and their targets are dropped; ``$(...)`` and
backquotes become one placeholder word. Not executed, only parsed: no file is read.

Placeholders: a value in capitals (``MODEL``, ``N``) or holding ``$``, ``<`` or ``{`` stands for whatever
the user puts there, so it is not checked against an option's choices. A missing required argument or
option fails too, unless the command's line shows an ellipsis (``...``), the one sign that the docs left
arguments out on purpose.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from helpers import REPO

SEPARATORS = {"|", "||", "&&", ";", "&"}


def documents() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def code_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) of every line inside a fenced code block, continuations joined (the number is
    the first line's)."""
    found, fence, pending = [], None, None
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        opening = re.match(r"^(`{3,}|~{3,})", stripped)
        if fence is None:
            fence = opening.group(1) if opening else None
            continue
        if stripped.startswith(fence) and stripped.strip("`~") == "":
            fence, pending = None, None
            continue
        if pending is not None:
            pending = (pending[0], pending[1] + " " + stripped)
        else:
            pending = (number, line)
        if pending[1].endswith("\\"):
            pending = (pending[0], pending[1][:-1])
            continue
        found.append(pending)
        pending = None
    return found


def substituted(line: str) -> str:
    """``$(...)`` (innermost first) and backquotes as one placeholder word."""
    while True:
        replaced = re.sub(r"\$\([^()]*\)", "SUBST", line)
        replaced = re.sub(r"`[^`]*`", "SUBST", replaced)
        if replaced == line:
            return line
        line = replaced


def commands_in(line: str) -> list[list[str]]:
    """The ``attnmt`` commands of a shell line: each as its arguments after ``attnmt``."""
    line = re.sub(r"(?<=\s)\d(?=[<>])", "", substituted(line.strip()))  # the 2 of 2>&1, 2> FILE
    if line.startswith("$ "):
        line = line[2:]
    lexer = shlex.shlex(line, posix=True, punctuation_chars="|&;<>")
    lexer.whitespace_split, lexer.commenters = True, "#"
    try:
        tokens = list(lexer)
    except ValueError as e:  # an unclosed quote: reported as the command it was meant to be
        return [["<unparsable>", str(e)]] if re.match(r"^(\S+=\S+\s+)*(\S*/)?attnmt\s", line) else []
    segments, current, skip = [], [], False
    for token in tokens:
        if skip:  # a redirection's target
            skip = False
        elif token in SEPARATORS:
            segments.append(current)
            current = []
        elif set(token) <= set("<>&|"):  # a redirection: > >> < >& &>
            skip = True
        else:
            current.append(token)
    segments.append(current)
    found = []
    for words in segments:
        while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):
            words = words[1:]
        if words and (words[0] == "attnmt" or words[0].endswith("/attnmt")):
            found.append(words[1:])
    return found


def placeholder(value: str) -> bool:
    return bool(re.fullmatch(r"[A-Z][A-Z0-9_]*", value)) or any(c in value for c in "$<{") or "SUBST" in value


def _values(opts: dict, name: str) -> list:
    value = opts.get(name)
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]


def problem(args: list[str], elided: bool = False) -> str | None:
    """Why ``attnmt ARGS`` does not parse against the app (None: it does); ``elided``: the docs left
    required arguments out on purpose (an ellipsis)."""
    import typer

    from attnmt.cli import app

    if args[:1] == ["<unparsable>"]:
        return f"cannot be read as a shell command ({args[1]})"
    group = typer.main.get_command(app)
    top = group.context_class(group, info_name="attnmt")
    try:
        opts, rest, _ = group.make_parser(top).parse_args(list(args))
        if opts.get("help") or opts.get("version"):
            return None
        if not rest:
            return "no command"
        command = group.get_command(top, rest[0])
        if command is None:
            return f"no such command {rest[0]!r} (the commands: {', '.join(group.list_commands(top))})"
        ctx = command.context_class(command, info_name=rest[0], parent=top)
        opts, left, _ = command.make_parser(ctx).parse_args(rest[1:])
    except Exception as e:  # Click's NoSuchOption, BadOptionUsage, ...: the usage error, as --help would say
        return e.format_message() if hasattr(e, "format_message") else str(e)
    if opts.get("help"):
        return None
    if left:
        return f"unexpected extra argument(s): {' '.join(left)}"
    for param in command.params:
        given = _values(opts, param.name)
        if param.required and not given and not elided:
            return f"missing {param.opts[0] if param.param_type_name == 'option' else param.name.upper()}"
        desc = param.type_descriptor
        if desc.is_choice and desc.choices:
            choices = {str(getattr(c, "value", c)) for c in desc.choices}
            wrong = [v for v in given if str(v) not in choices and not placeholder(str(v))]
            if wrong:
                return f"{param.opts[0]}: {wrong[0]!r} is not one of {', '.join(sorted(choices))}"
    return None


def documented_commands() -> list[tuple[str, list[str], bool]]:
    """(FILE:LINE, the arguments after attnmt, whether the line elides) of every documented command."""
    found = []
    for document in documents():
        where = document.relative_to(REPO)
        for number, line in code_lines(document.read_text(encoding="utf-8")):
            for args in commands_in(line):
                found.append((f"{where}:{number}", args, "..." in line or "…" in line))
    return found


# ------------------------------------------------------------------------------------------ the tests


def test_every_documented_command_parses():
    found = documented_commands()
    assert len(found) > 20, f"only {len(found)} documented commands found: the reader is broken"
    problems = [f"{where}: attnmt {shlex.join(args)}\n    {why}" for where, args, elided in found
                if (why := problem(args, elided))]
    assert not problems, f"{len(problems)} documented commands do not parse:\n" + "\n".join(problems)


@pytest.mark.parametrize("line, expected", [
    ("attnmt translat runs/demo hello", "no such command"),
    ("attnmt translate runs/demo --beam 4", "--beam"),
    ("attnmt --debug eval runs/demo --src a.de --ref a.en --tokenize 14a", "'14a' is not one of"),
    ("attnmt score runs/demo --src a.de", "missing --tgt"),
    ("attnmt info runs/demo extra", "unexpected extra argument"),
    ("echo hi | attnmt translate runs/demo -i - --nbest", "--nbest"),
    ("cat a.txt | CUDA_VISIBLE_DEVICES=0 attnmt translate runs/demo --no-such > out.txt 2>&1", "--no-such"),
])
def test_a_wrong_command_is_caught(line, expected):
    (args,) = commands_in(line)
    why = problem(args)
    assert why is not None and expected in why, why


def test_the_reader_knows_shell():
    text = "\n".join([
        "text", "```bash", "# a comment", "attnmt train \\", "  configs/toy_transformer.yaml  # here",
        "A=1 B=2 attnmt translate runs/x $(cat FILE) -o out 2> err.log && attnmt info runs/x",
        "echo attnmt", "```", "attnmt outside a block", "~~~", ".venv/bin/attnmt info MODEL", "~~~"])
    lines = code_lines(text)
    assert [number for number, _ in lines] == [3, 4, 6, 7, 11]
    found = [args for _, line in lines for args in commands_in(line)]
    assert found == [["train", "configs/toy_transformer.yaml"], ["translate", "runs/x", "SUBST", "-o", "out"],
                     ["info", "runs/x"], ["info", "MODEL"]]
    assert all(problem(args) is None for args in found)
    assert problem(["translate", "MODEL", "..."]) is None and problem(["score", "MODEL"], elided=True) is None
