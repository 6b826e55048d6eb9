"""A pydantic ``ValidationError`` of a config as one line: ``file:line: dotted.key: what is wrong``.

``configs/toy_transformer.yaml:12: model.n_head: unknown key (did you mean n_heads?)``: the file and line
where the key is (from ``yaml12.parse_yaml``), the dotted key without pydantic's union tags, and the problem
in words, with the close valid key for a typo. Imports no attnmt module: the schema comes as an argument.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence
from typing import Any, get_args, get_origin

from pydantic import BaseModel, ValidationError

# What str.splitlines() (and a terminal) breaks a line at: escaped in a key, so the message stays one line.
_LINE_BREAKS = {ord(c): repr(c)[1:-1] for c in "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"}

_TYPE_WORDS = {bool: "boolean", int: "integer", float: "number", str: "string", list: "list", dict: "mapping",
               type(None): "null"}


def describe(error: ValidationError, source: str, lines: dict[tuple[str, ...], int], overrides: Sequence[str],
             schema: type[BaseModel], union_tags: Iterable[str] = ()) -> str:
    """The first error of validating ``schema`` as ``file:line: dotted.key: what is wrong`` (``--set key:
    ...`` when the key came from an override); ``lines`` maps key paths to lines of the file, and
    ``union_tags`` are the tags pydantic puts into the paths of discriminated unions."""
    err = error.errors(include_url=False)[0]
    loc = _clean_loc(err["loc"], frozenset(union_tags))
    key = ".".join(str(p) for p in loc).translate(_LINE_BREAKS) or "(top level)"
    message = _message(err, loc, schema)
    line = None
    for n in range(len(loc), 0, -1):
        line = lines.get(tuple(str(p) for p in loc[:n]))
        if line is not None:
            break
    override_keys = {o.partition("=")[0].strip() for o in overrides}
    if key in override_keys:
        return f"--set {key}: {message}"
    where = f"{source}:{line}" if line else source
    return f"{where}: {key}: {message}"


def _clean_loc(loc: tuple, tags: frozenset[str]) -> tuple:
    """Drop pydantic's union-member tags (``model.transformer.n_heads`` -> ``model.n_heads``)."""
    out: list = []
    for part in loc:
        # A tag right after its union's key (model, data.train, ...) or after a list's index.
        if (out and isinstance(part, str) and part in tags
                and (out[-1] in ("model", "train", "dev", "test") or isinstance(out[-1], int))):
            continue
        if isinstance(part, str) and (part.startswith("function-")
                                      or part in ("list[Path]", "Path", "none", "tuple")):
            continue
        out.append(part)
    return tuple(out)


def _message(err: dict, loc: tuple, schema: type[BaseModel]) -> str:
    kind = err["type"]
    value = err.get("input")
    if kind == "extra_forbidden":
        valid = _valid_keys(loc[:-1], schema)
        close = difflib.get_close_matches(str(loc[-1]), valid, n=1, cutoff=0.6)
        hint = (f" (did you mean {close[0]}?)" if close
                else (f" (valid keys: {', '.join(valid)})" if valid else ""))
        return f"unknown key{hint}"
    if kind == "missing":
        return "required key is missing"
    got = _TYPE_WORDS.get(type(value), type(value).__name__)
    if kind in ("string_type", "string_sub_type"):
        hint = f" (quote it: '{str(value).lower()}')" if isinstance(value, bool) else ""
        return f"expected a string, got {got}{hint}"
    if kind in ("int_type", "int_parsing", "int_from_float"):
        return f"expected an integer, got {got} {value!r}"
    if kind in ("float_type", "float_parsing"):
        return f"expected a number, got {got} {value!r}"
    if kind == "finite_number":
        return "must be a finite number"
    if kind == "bool_type":
        return f"expected true or false, got {got} {value!r}"
    if kind in ("literal_error", "enum"):
        return f"{value!r} is not one of {err['ctx']['expected']}"
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        op = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<",
              "less_than_equal": "<="}[kind]
        bound = next(iter(err["ctx"].values()))
        return f"must be {op} {bound}, got {value!r}"
    if kind == "value_error":
        return str(err["ctx"]["error"])
    if kind in ("model_type", "model_attributes_type", "dict_type"):
        return f"expected a mapping, got {got}"
    if kind == "union_tag_invalid":
        return f"{err['ctx']['tag']!r} is not one of {err['ctx']['expected_tags']}"
    if kind == "union_tag_not_found":
        return f"missing key {err['ctx']['discriminator']}"
    if kind == "string_pattern_mismatch":
        return f"{value!r} is not {_PATTERN_WORDS.get(err['ctx']['pattern'], 'of the expected form')}"
    if kind == "too_short":
        return f"must not be empty (at least {err['ctx']['min_length']} item)"
    return err["msg"]


# The patterns of config strings, in words (``config/data.py``).
_PATTERN_WORDS = {
    r"^[A-Za-z][A-Za-z0-9_-]*$": "a language code (a letter, then letters, digits, - or _; e.g. fr)",
    r"^\S+$": "one token (no spaces; e.g. <bt>)",
}


def _valid_keys(loc: tuple, schema: type[BaseModel]) -> list[str]:
    """The field names allowed at ``loc`` in ``schema`` (used for did-you-mean hints)."""
    classes: list[type[BaseModel]] = [schema]
    for part in loc:
        if isinstance(part, int):  # a list's index: the same classes
            continue
        nxt: list[type[BaseModel]] = []
        for cls in classes:
            field = cls.model_fields.get(str(part))
            if field is not None:
                nxt.extend(_models_in(field.annotation))
        classes = nxt
    keys: list[str] = []
    for cls in classes:
        keys.extend(k for k in cls.model_fields if k not in keys)
    return keys


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    out: list[type[BaseModel]] = []
    if get_origin(annotation) is not None or get_args(annotation):
        for arg in get_args(annotation):
            out.extend(_models_in(arg))
    return out
