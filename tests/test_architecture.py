"""docs/ARCHITECTURE.md's layer charts against the code, at two scales.

The package chart puts every package (and every module at the top of ``attnmt/``) in a layer; a module
imports only from rooms of lower layers, or from its own package. The module chart puts every module of
each package in a layer of that package; a module imports only modules of lower layers of its own
package. Every import counts, at the top of a module or inside a function, relative or absolute. A
package's ``__init__`` that imports nothing (a docstring) needs no place; one that does is charted as
``__init__``. The rooms' sizes: no module over 450 lines, no function over 70.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from helpers import REPO

PACKAGE = REPO / "attnmt"
DOC = REPO / "docs" / "ARCHITECTURE.md"


def package_chart(text: str | None = None) -> dict[str, int]:
    """Room -> layer, from the ``P<n>  room room ...`` lines (a package is written ``name/``)."""
    text = DOC.read_text(encoding="utf-8") if text is None else text
    layers: dict[str, int] = {}
    for number, rooms in re.findall(r"^P(\d+)  (.+)$", text, re.M):
        for room in rooms.split():
            assert room.rstrip("/") not in layers, f"{room} appears twice in the package chart"
            layers[room.rstrip("/")] = int(number)
    return layers


def module_chart(text: str | None = None) -> dict[str, dict[str, int]]:
    """Package -> (module -> layer), from the ``package/  L<n>  module module ...`` lines."""
    text = DOC.read_text(encoding="utf-8") if text is None else text
    charts: dict[str, dict[str, int]] = {}
    for package, number, modules in re.findall(r"^(\w+)/ +L(\d+)  (.+)$", text, re.M):
        chart = charts.setdefault(package, {})
        for module in modules.split():
            assert module not in chart, f"{package}/{module} appears twice in the module chart"
            chart[module] = int(number)
    return charts


def imports(path: Path, root: Path = REPO) -> set[str]:
    """The attnmt modules ``path`` (a file under ``root``) imports, resolved to absolute names."""
    module = ".".join(path.relative_to(root).with_suffix("").parts)
    package = module.removesuffix(".__init__") if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package.split(".")[: len(package.split(".")) - node.level + 1]
            target = ".".join(base + ([node.module] if node.module else []))
            found |= _from(target, node, root)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("attnmt"):
            found |= _from(node.module, node, root)
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("attnmt")}
    return found


def _from(target: str, node: ast.ImportFrom, root: Path) -> set[str]:
    """``from TARGET import a, b``: the modules a and b where they are modules, else TARGET itself."""
    folder = root.joinpath(*target.split("."))
    return {f"{target}.{a.name}" if _is_module(folder / a.name) else target for a in node.names}


def _is_module(path: Path) -> bool:
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def place(module: str, root: Path = REPO) -> tuple[str, str]:
    """A dotted module -> (its room at the package scale, its name inside that package): ``attnmt.data.
    batching`` -> ("data", "batching"); ``attnmt.data`` -> ("data", "__init__"); ``attnmt.errors`` ->
    ("errors", "errors"); the package itself -> ("attnmt", "__init__")."""
    parts = module.split(".")[1:]
    if not parts:
        return "attnmt", "__init__"
    if not (root / "attnmt" / parts[0]).is_dir():
        return parts[0], parts[0]
    inside = len(parts) > 1 and _is_module(root.joinpath("attnmt", *parts[:2]))
    return parts[0], parts[1] if inside else "__init__"


def modules(root: Path = REPO) -> list[Path]:
    return sorted(p for p in (root / "attnmt").rglob("*.py") if p.name != "__main__.py")


def dotted(path: Path, root: Path = REPO) -> str:
    return ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")


def violations(root: Path, packages: dict[str, int], charts: dict[str, dict[str, int]]) -> list[str]:
    """Every import that goes to a room of the same or a higher layer, at either scale."""
    wrong = []
    for path in modules(root):
        room, name = place(dotted(path, root), root)
        for target in imports(path, root):
            there, its = place(target, root)
            if there == "attnmt" or (there, its) == (room, name):
                continue  # the package's __init__ holds only __version__
            if there != room and packages[there] >= packages[room]:
                wrong.append(f"{path.relative_to(root)} ({room}/, P{packages[room]}) imports {target} "
                             f"({there}, P{packages[there]})")
            elif there == room and room in charts and charts[room][its] >= charts[room][name]:
                wrong.append(f"{path.relative_to(root)} ({room}/ L{charts[room][name]}) imports {target} "
                             f"(L{charts[room][its]})")
    return wrong


def test_every_module_has_one_place_in_the_charts():
    packages, charts = package_chart(), module_chart()
    found: dict[str, set[str]] = {}
    for path in modules():
        room, name = place(dotted(path))
        if room != "attnmt" and not (name == "__init__" and not imports(path)):
            found.setdefault(room, set()).add(name)
    assert set(found) == set(packages), (f"in the code, not the package chart: {set(found) - set(packages)}; "
                                         f"in the chart only: {set(packages) - set(found)}")
    for room, names in found.items():
        if room in charts or names != {room}:  # a package (a module at the top is its own room)
            assert set(charts.get(room, {})) == names, (
                f"{room}/: in the code, not the chart: {names - set(charts.get(room, {}))}; "
                f"in the chart only: {set(charts.get(room, {})) - names}")


def test_every_import_goes_to_a_lower_layer_at_both_scales():
    wrong = violations(REPO, package_chart(), module_chart())
    assert not wrong, "\n".join(wrong)


def test_the_check_has_teeth(tmp_path):
    """The import reader sees relative, absolute and function-level imports and tells a module from a name
    defined in a package; an upward import between packages, and one inside a package, are both found."""
    for name in ("errors", "decoding/__init__", "decoding/search", "decoding/translator", "training/__init__",
                 "training/trainer", "cli/__init__", "cli/app"):
        (tmp_path / "attnmt" / f"{name}.py").parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "attnmt" / f"{name}.py").write_text("")
    source = tmp_path / "attnmt" / "cli" / "x.py"
    source.write_text("from ..training.trainer import fit\nfrom . import app\n"
                      "def f():\n    import attnmt.decoding.search\n    from .. import errors, __version__\n")
    assert imports(source, tmp_path) == {"attnmt.training.trainer", "attnmt.cli.app",
                                         "attnmt.decoding.search", "attnmt.errors", "attnmt"}
    packages = package_chart("P0  errors\nP1  decoding/\nP2  training/\nP3  cli/\n")
    charts = module_chart("decoding/  L1  translator\ndecoding/  L0  search\ncli/  L1  x\ncli/  L0  app\n"
                          "training/  L0  trainer\n")
    assert violations(tmp_path, packages, charts) == []
    (tmp_path / "attnmt" / "decoding" / "search.py").write_text("from ..training import trainer\n")
    (tmp_path / "attnmt" / "decoding" / "translator.py").write_text("from . import search\n")
    (tmp_path / "attnmt" / "cli" / "app.py").write_text("def f():\n    from .x import g\n")
    assert violations(tmp_path, packages, charts) == [
        "attnmt/cli/app.py (cli/ L0) imports attnmt.cli.x (L1)",
        "attnmt/decoding/search.py (decoding/, P1) imports attnmt.training.trainer (training, P2)"]


def test_the_top_of_the_package_stays_short():
    """``ls attnmt/`` shows at most 15 entries and no package holds more than 15 modules."""
    top = [p.name for p in PACKAGE.iterdir() if p.name != "__pycache__"]
    assert len(top) <= 15, sorted(top)
    for package in (p for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()):
        assert len(list(package.glob("*.py"))) <= 15, package


# ----------------------------------------------------------------------------------------- room sizes

MAX_MODULE_LINES, MAX_FUNCTION_LINES = 450, 70


def sizes() -> tuple[dict[str, int], dict[str, int]]:
    """Lines of every module of the package, and of every function (its signature and decorators too)."""
    lines, functions = {}, {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = str(path.relative_to(REPO))
        text = path.read_text(encoding="utf-8")
        lines[name] = len(text.splitlines())
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                first = min([node.lineno] + [d.lineno for d in node.decorator_list])
                functions[f"{name}:{node.name}"] = max(functions.get(f"{name}:{node.name}", 0),
                                                      node.end_lineno - first + 1)
    return lines, functions


def test_every_room_is_within_its_size():
    """Modules hold at most 450 lines and functions 70 (docs/ARCHITECTURE.md); the list of rooms allowed
    over it emptied in issue 41."""
    lines, functions = sizes()
    too_long = [f"{name}: {n} lines" for name, n in lines.items() if n > MAX_MODULE_LINES]
    too_long += [f"{name}: {n} lines" for name, n in functions.items() if n > MAX_FUNCTION_LINES]
    assert not too_long, "split by idea: " + "; ".join(too_long)
