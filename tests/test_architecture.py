"""docs/ARCHITECTURE.md's layer chart against the code: every module of the package sits in exactly one
layer, and every import (at the top of a module or inside a function) goes to a lower layer."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from helpers import REPO

PACKAGE = REPO / "attnmt"
UNITS = ("models", "cli", "config")  # packages that count as one room: their modules import each other


def chart() -> dict[str, int]:
    """Room -> layer, from the ``L<n>  room room ...`` lines of the architecture document."""
    text = (REPO / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    layers: dict[str, int] = {}
    for number, rooms in re.findall(r"^L(\d+)  (.+)$", text, re.M):
        for room in rooms.split():
            assert room.rstrip("/") not in layers, f"{room} appears twice in the chart"
            layers[room.rstrip("/")] = int(number)
    return layers


def room_of(module: str) -> str:
    """``attnmt.models.lstm`` -> ``models``; ``attnmt.decode`` -> ``decode``; the package itself ->
    ``attnmt``."""
    parts = module.split(".")[1:]
    return parts[0] if parts else "attnmt"


def imports(path: Path, root: Path = REPO) -> set[str]:
    """The attnmt modules ``path`` (a file under ``root``) imports, resolved to absolute names."""
    module = ".".join(path.relative_to(root).with_suffix("").parts)
    package = module.removesuffix(".__init__") if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package.split(".")[: len(package.split(".")) - node.level + 1]
            target = ".".join(base + ([node.module] if node.module else []))
            if node.module:
                found.add(target)
            else:  # ``from . import x``: the module x, or a name defined in the package (``__version__``)
                folder = root.joinpath(*target.split("."))
                found |= {f"{target}.{a.name}" if _is_module(folder / a.name) else target for a in node.names}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("attnmt"):
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("attnmt")}
    return found


def _is_module(path: Path) -> bool:
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if p.name != "__main__.py")


def test_every_module_has_one_place_in_the_chart():
    layers = chart()
    rooms = {room_of(".".join(p.relative_to(REPO).with_suffix("").parts))
             for p in modules()} - {"attnmt", "__init__"}
    assert rooms == set(layers), (
        f"in the code, not the chart: {rooms - set(layers)}; in the chart only: {set(layers) - rooms}"
    )


def test_every_import_goes_to_a_lower_layer():
    layers = {**chart(), "attnmt": -1, "__init__": -1}  # the package's __init__ holds only __version__
    wrong = []
    for path in modules():
        here = room_of(".".join(path.relative_to(REPO).with_suffix("").parts))
        for target in imports(path):
            there = room_of(target)
            if there == here and here in UNITS:
                continue
            if layers[there] >= layers[here]:
                wrong.append(f"{path.relative_to(REPO)} (L{layers[here]}) imports {target} "
                             f"(L{layers[there]})")
    assert not wrong, "\n".join(wrong)


def test_the_check_has_teeth(tmp_path):
    """The import reader sees relative, absolute and function-level imports, and tells a module from a name
    defined in a package; the chart orders the layers it names."""
    source = tmp_path / "attnmt" / "cli" / "x.py"
    source.parent.mkdir(parents=True)
    for name in ("train", "plot", "decode", "cli/app"):
        (tmp_path / "attnmt" / f"{name}.py").write_text("")
    source.write_text("from ..train import fit\nfrom . import app\n"
                      "def f():\n    import attnmt.plot\n    from .. import decode, __version__\n")
    expected = {"attnmt.train", "attnmt.cli.app", "attnmt.plot", "attnmt.decode", "attnmt"}
    assert imports(source, tmp_path) == expected
    layers = chart()
    assert layers["train"] > layers["decode"] > layers["models"]


# ----------------------------------------------------------------------------------------- room sizes

MAX_MODULE_LINES, MAX_FUNCTION_LINES = 450, 70
# The rooms that were over the limits when the rule came in, with their size then: each could only shrink,
# and left the list once it fitted (the last two, `plot` and `align`, in issue 41). A room over a limit
# fails the test.
TOO_LONG_MODULES: dict[str, int] = {}
TOO_LONG_FUNCTIONS: dict[str, int] = {}


def sizes() -> tuple[dict[str, int], dict[str, int]]:
    """Lines of every module of the package, and of every function (its signature and decorators too)."""
    modules, functions = {}, {}
    for path in modules_of_the_package():
        name = str(path.relative_to(REPO))
        text = path.read_text(encoding="utf-8")
        modules[name] = len(text.splitlines())
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                first = min([node.lineno] + [d.lineno for d in node.decorator_list])
                functions[f"{name}:{node.name}"] = max(functions.get(f"{name}:{node.name}", 0),
                                                      node.end_lineno - first + 1)
    return modules, functions


def modules_of_the_package() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_no_room_grows_past_its_size():
    """Modules hold at most 450 lines and functions 70 (docs/ARCHITECTURE.md), but for the listed rooms,
    which may not grow; a listed room that now fits must leave the list."""
    modules, functions = sizes()
    too_long = [f"{name}: {n} lines" for name, n in modules.items()
                if n > TOO_LONG_MODULES.get(name, MAX_MODULE_LINES)]
    too_long += [f"{name}: {n} lines" for name, n in functions.items()
                 if n > TOO_LONG_FUNCTIONS.get(name, MAX_FUNCTION_LINES)]
    assert not too_long, "split by idea: " + "; ".join(too_long)
    fit = [name for name, _ in TOO_LONG_MODULES.items() if modules.get(name, 0) <= MAX_MODULE_LINES]
    fit += [name for name, _ in TOO_LONG_FUNCTIONS.items() if functions.get(name, 0) <= MAX_FUNCTION_LINES]
    assert not fit, f"now within the limits, take them off the list: {fit}"
