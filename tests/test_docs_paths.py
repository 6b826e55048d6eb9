"""Every file of this repository that the docs name exists: a command in the README that runs
``scripts/bench/bench_align.py``, a config's comment that points at ``scripts/bootstrap_guided.py``, a
script's docstring that cites ``attnmt/decoding/fastpath.py``.

Read: ``README.md``, ``docs/**/*.md``, ``data/README.md``, ``configs/*.yaml`` (their comments), every file in
``scripts/`` (docstrings, usage lines, help texts, comments), ``Makefile`` and ``pyproject.toml``'s comments.

What counts as a path of the repository (``repository_paths``): a word that starts with one of its folders
``scripts/``, ``configs/``, ``docs/``, ``attnmt/`` or ``tests/`` and stands alone, not the tail of another
path (``../shared/data/multi30k/...``, ``RUN/data/...``, ``runs/demo/...``, a URL: those are not this
repository's files). ``data/`` is left out: it is also every run folder's data (``data/train``,
``data/stats.json``), and the repository's own holds only its README. A placeholder stands for any name:
``<src>``, a brace without a comma (``{name}``), ``*``, or one of ``PLACEHOLDERS`` (``scripts/NAME``);
``{en,de}`` is each of its words, and every one must be there. A path names a folder when it ends in ``/``.
In the docs, the configs and the scripts' docstrings (their code joins the peers' file names to
``../shared/peers``), a bare file name of a script or a module (``bench_align.py``, ``decode.py``,
``gpu_check.sh``: no folder before it) must be the name of a file somewhere in the repository
(``bare_names``).
"""

from __future__ import annotations

import ast
import fnmatch
import itertools
import re
from pathlib import Path

from helpers import REPO

FOLDERS = ("scripts", "configs", "docs", "attnmt", "tests")
PLACEHOLDERS = {"NAME", "FILE", "DIR", "RUN", "MODEL", "CONFIG", "SPLIT", "LANG", "SRC", "TGT"}
# A path's characters: word characters, . * - and /; a <placeholder>; a {brace} (its commas inside it).
_PART = r"(?:[\w.*/-]|<[^<>\s]*>|\{[^{}\s]*\})"
# Not the tail of a longer path or word (``../shared/data``, ``RUN/tests``, ``$OUT/x``, ``~/x``).
_ALONE = r"(?<![\w./~$<>{}@:-])"
PATH = re.compile(_ALONE + rf"((?:{'|'.join(FOLDERS)})/{_PART}*)")
BARE = re.compile(_ALONE + r"([\w-]+\.(?:py|sh))\b(?![\w/.-])")


def documents() -> list[Path]:
    """The files whose text names repository paths."""
    found = [REPO / "README.md", REPO / "data" / "README.md", REPO / "Makefile", REPO / "pyproject.toml"]
    found += sorted((REPO / "docs").rglob("*.md")) + sorted((REPO / "configs").glob("*.yaml"))
    found += sorted(p for p in (REPO / "scripts").rglob("*") if p.suffix in (".py", ".sh"))
    found += sorted((REPO / "attnmt").rglob("*.py"))  # the package's docstrings name files and scripts too
    return found


def expand(word: str) -> list[str]:
    """The glob patterns a documented path stands for: ``{a,b}`` each of its words, a placeholder ``*``."""
    word = re.sub(r"<[^<>]*>", "*", word)
    word = re.sub(r"\{([^{},]*)\}", "*", word)  # an f-string's {name}
    word = re.sub(r"(?<![A-Za-z0-9])[A-Z]+(?![A-Za-z0-9])",
                  lambda m: "*" if m.group() in PLACEHOLDERS else m.group(), word)
    parts = re.split(r"\{([^{}]*)\}", word)  # literal, choices, literal, ...
    choices = [[p] if k % 2 == 0 else p.split(",") for k, p in enumerate(parts)]
    return ["".join(c) for c in itertools.product(*choices)]


def repository_paths(text: str) -> list[str]:
    """The repository paths a text names, trailing punctuation off (``scripts/x.py.``, ``tests/,``)."""
    return [m.group(1).rstrip(".,") for m in PATH.finditer(text)]


def bare_names(text: str) -> list[str]:
    return [m.group(1) for m in BARE.finditer(text)]


def exists(word: str, root: Path = REPO) -> bool:
    """Whether ``word`` (a documented path, placeholders and all) names something under ``root``: each of
    its brace's words, a placeholder at least one; a word ending in ``/`` a folder."""
    folder = word.endswith("/")

    def there(pattern: str) -> bool:
        if any(c in pattern for c in "*?["):
            return any(p.is_dir() or not folder for p in root.glob(pattern))
        return (root / pattern).is_dir() if folder else (root / pattern).exists()

    return all(there(pattern) for pattern in expand(word.rstrip("/")))


def missing(text: str, root: Path = REPO, names: set[str] | None = None, bare: bool = True) -> list[str]:
    """What ``text`` names that is not there: repository paths, then (with ``bare``) bare script and
    module names."""
    gone = [word for word in repository_paths(text) if not exists(word, root)]
    if bare:
        names = file_names(root) if names is None else names
        gone += [name for name in bare_names(text) if not any(fnmatch.fnmatch(n, name) for n in names)]
    return gone


def file_names(root: Path = REPO) -> set[str]:
    """The names of the repository's files (not its virtual environment's, nor git's)."""
    names = {p.name for p in root.iterdir() if p.is_file()}
    for folder in (*FOLDERS, "data"):
        names |= {p.name for p in (root / folder).rglob("*") if p.is_file()}
    return names


# ------------------------------------------------------------------------------------------ the tests


def test_every_path_the_docs_name_exists():
    names = file_names()
    problems = []
    for document in documents():
        text, where = document.read_text(encoding="utf-8"), document.relative_to(REPO)
        script = document.suffix in (".py", ".sh")
        for number, line in enumerate(text.splitlines(), 1):
            problems += [f"{where}:{number}: {word}" for word in missing(line, names=names, bare=not script)]
        if document.suffix == ".py":  # its docstring's bare names
            docstring = ast.get_docstring(ast.parse(text)) or ""
            problems += [f"{where} (docstring): {name}" for name in bare_names(docstring)
                         if not any(fnmatch.fnmatch(n, name) for n in names)]
    assert not problems, "named but not there:\n" + "\n".join(problems)


def test_the_docs_are_read():
    """The patterns find what the docs are known to name (a pattern that matches nothing passes anything)."""
    benchmarks = (REPO / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    assert "scripts/bench/bench_decode.py" in repository_paths(benchmarks)
    started = (REPO / "docs" / "getting-started.md").read_text(encoding="utf-8")
    assert "configs/toy_transformer.yaml" in repository_paths(started)
    assert any(p.parent.name == "bench" for p in documents())
    assert len(documents()) > 30


def test_a_wrong_path_is_found(tmp_path):
    """The checker on a made-up tree: every kind of wrong name is reported, and nothing else."""
    (tmp_path / "scripts" / "bench").mkdir(parents=True)
    (tmp_path / "scripts" / "bench" / "bench_align.py").write_text("")
    (tmp_path / "scripts" / "tool.py").write_text("")
    (tmp_path / "configs").mkdir()
    for name in ("a_en_de.yaml", "a_de_en.yaml"):
        (tmp_path / "configs" / name).write_text("")
    text = ("python scripts/bench/bench_align.py --out runs/demo/scripts/x; scripts/bench_align.py; "
            "`configs/a_{en_de,de_en}.yaml` `configs/a_<src>_<tgt>.yaml` configs/a_{fr_en,de_en}.yaml "
            "scripts/bench/bench_NAME.py, scripts/bench/ scripts/tool.py/ ../shared/peers/setup.sh "
            "bench_align.py tool.py gone.py https://example.org/scripts/missing.py $OUT/tests/x.py "
            "scripts/missing.py.")
    assert missing(text, tmp_path) == ["scripts/bench_align.py", "configs/a_{fr_en,de_en}.yaml",
                                       "scripts/tool.py/", "scripts/missing.py", "gone.py"]


def test_a_wrong_path_in_the_docs_is_found():
    """The benchmarks page as it is, one path in it misspelt: found."""
    page = (REPO / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    assert missing(page) == []
    broken = page.replace("scripts/bench/bench_decode.py", "scripts/bench_decode.py", 1)
    assert missing(broken) == ["scripts/bench_decode.py"]
