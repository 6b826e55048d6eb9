"""The config reference: every key of ``attnmt.config.schema.Config`` with its type, default and docstring.

Walked from the pydantic models themselves (``model_fields``: annotations, constraints, defaults), so a key
added to the schema is on the page at the next build. The descriptions are the attribute docstrings the
schema writes under each field (read from the classes' source with ``ast``: the schema does not turn on
pydantic's ``use_attribute_docstrings``), and each section's class docstring.

A field whose type is a model is a section of its own (``train.alignment``); a union of models told apart
by a literal field is one table per choice (``model`` with ``arch: lstm`` or ``arch: transformer``); a union
that several keys share (the data sources of ``data.train``, ``data.dev`` and ``data.test``) is written once,
its keys under the placeholder ``SOURCE``.
"""

from __future__ import annotations

import ast
import inspect
import re
import textwrap
import types
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import annotated_types as at
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

PLACEHOLDER = "SOURCE"  # the prefix of a union's keys when several keys share it


def field_docstrings(cls: type) -> dict[str, str]:
    """The docstring written under each field of ``cls`` and of the models it inherits from."""
    found: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not (isinstance(klass, type) and issubclass(klass, BaseModel)) or klass is BaseModel:
            continue
        body = ast.parse(textwrap.dedent(inspect.getsource(klass))).body[0].body
        for stmt, after in zip(body, body[1:]):
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and \
                    isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant) and \
                    isinstance(after.value.value, str):
                found[stmt.target.id] = inspect.cleandoc(after.value.value)
    return found


def class_doc(cls: type) -> str:
    doc = cls.__dict__.get("__doc__")
    return inspect.cleandoc(doc) if doc else ""


def text(doc: str) -> str:
    """A docstring as one Markdown table cell: ``code`` as `code`, angle brackets and pipes escaped outside
    code, one line."""
    parts = re.split(r"(``[^`]+``|`[^`]+`)", " ".join(doc.split()))
    out = []
    for k, part in enumerate(parts):
        if k % 2:
            out.append("`" + part.strip("`") + "`")
        else:
            out.append(part.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
                       .replace("|", "&#124;").replace("*", "\\*"))
    return "".join(out)


# ------------------------------------------------------------------------------------------- types

_BOUNDS = ((at.Gt, "gt", ">"), (at.Ge, "ge", ">="), (at.Lt, "lt", "<"), (at.Le, "le", "<="))


def _constraints(metadata: list) -> list[str]:
    said = []
    for item in metadata:
        if isinstance(item, FieldInfo):
            said += _constraints(item.metadata)
        for kind, attr, sign in _BOUNDS:
            if isinstance(item, kind):
                said.append(f"{sign} {getattr(item, attr)}")
        if isinstance(item, at.MinLen) and item.min_length:
            said.append(f"at least {item.min_length}")
        pattern = getattr(item, "pattern", None)
        if isinstance(pattern, str):
            said.append(f"matching `{pattern}`")
    return said


def is_model(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, BaseModel)


def models_in(tp: Any) -> list[type]:
    """The model classes a type names, in order (through Annotated, unions, lists and tuples)."""
    if is_model(tp):
        return [tp]
    found: list[type] = []
    args = get_args(tp)[:1] if get_origin(tp) is Annotated else get_args(tp)
    for arg in args:
        found += [m for m in models_in(arg) if m not in found]
    return found


def describe(tp: Any, metadata: list | None = None, names: dict | None = None) -> str:
    """A type in words: ``int (> 0)``, ``one of `pre`, `post```, ``list of path``, ``... or null``; a model
    is named by ``names`` (its section)."""
    metadata, names = list(metadata or []), names or {}
    origin = get_origin(tp)
    if origin is Annotated:
        base, *extra = get_args(tp)
        return describe(base, metadata + extra, names)
    if origin in (Union, types.UnionType):
        args = get_args(tp)
        optional = type(None) in args
        parts = [describe(a, [], names) for a in args if a is not type(None)]
        said = " or ".join(dict.fromkeys(parts)) + (" or null" if optional else "")
        return said
    said = _constraints(metadata)
    if origin is Literal:
        base = "one of " + ", ".join(f"`{v}`" for v in get_args(tp)) if len(get_args(tp)) > 1 \
            else f"`{get_args(tp)[0]}`"
    elif isinstance(tp, type) and issubclass(tp, Enum):
        base = "one of " + ", ".join(f"`{m.value}`" for m in tp)
    elif is_model(tp):
        base = names.get(tp, tp.__name__)
    elif origin is list:
        base = "list of " + describe(get_args(tp)[0], [], names)
    elif origin is tuple:
        base = "[" + ", ".join(describe(a, [], names) for a in get_args(tp)) + "]"
    else:
        base = {bool: "bool", int: "int", float: "float", str: "str", Path: "path"}.get(tp, getattr(
            tp, "__name__", str(tp)))
    return f"{base} ({', '.join(said)})" if said else base


def default_of(info: FieldInfo) -> str:
    if info.default is PydanticUndefined and info.default_factory is None:
        return "required"
    value = info.default if info.default_factory is None else info.default_factory()
    if isinstance(value, BaseModel):
        return "its defaults"
    return f"`{yaml_value(value)}`"


def yaml_value(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Enum):
        return str(value.value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(yaml_value(v) for v in value) + "]"
    return str(value)


# ------------------------------------------------------------------------------------------- the walk


def discriminator(variants: list[type]) -> str | None:
    """The literal field every variant has (``arch``, ``format``): what tells them apart."""
    for name in variants[0].model_fields:
        if all(name in v.model_fields and get_origin(v.model_fields[name].annotation) is Literal
               for v in variants):
            return name
    return None


def literal_of(variant: type, name: str) -> str:
    return str(get_args(variant.model_fields[name].annotation)[0])


class Walk:
    """The sections of the page, in order: (heading id, title, intro, rows); a row is (key, type, default,
    description)."""

    def __init__(self, root: type) -> None:
        self.root = root
        self.shared = self._shared_unions(root)
        self.sections: list[tuple[str, str, str, list[tuple[str, str, str, str]]]] = []
        self.pending: list[tuple[type, str, str, str]] = []  # (class, key prefix, title, intro)

    @staticmethod
    def _shared_unions(root: type) -> dict[frozenset, list[str]]:
        """Unions of several models and the keys that hold them (more than one: written once)."""
        seen: dict[frozenset, list[str]] = {}

        def visit(cls: type, prefix: str) -> None:
            for name, info in cls.model_fields.items():
                found = models_in(info.annotation)
                if len(found) > 1:
                    seen.setdefault(frozenset(found), []).append(prefix + name)
                for model in found:
                    visit(model, prefix + name + ".")

        visit(root, "")
        return {k: v for k, v in seen.items() if len(v) > 1}

    def anchor(self, key: str) -> str:
        return re.sub(r"[^a-z0-9]+", "-", key.lower()).strip("-")

    def run(self) -> list:
        for name, info in self.root.model_fields.items():
            self.field_section(name, info)
        return self.sections

    def field_section(self, key: str, info: FieldInfo, intro: str = "") -> None:
        models = models_in(info.annotation)
        if len(models) == 1:
            self.section(models[0], key + ".", f"`{key}`", intro or class_doc(models[0]))
        elif len(models) > 1 and frozenset(models) not in self.shared:
            self.variants(models, key, intro)

    def section(self, cls: type, prefix: str, title: str, intro: str, anchor: str | None = None) -> None:
        docs, rows, later = field_docstrings(cls), [], []
        for name, info in cls.model_fields.items():
            key = prefix + name
            kind = describe(info.annotation, info.metadata, self.names(key, info))
            rows.append((key, kind, default_of(info), docs.get(name, "")))
            if models_in(info.annotation):
                later.append((key, info))
        self.sections.append((anchor or self.anchor(prefix.rstrip(".")), title, intro, rows))
        for key, info in later:
            self.field_section(key, info)

    def variants(self, models: list[type], key: str, intro: str, prefix: str | None = None) -> None:
        tag = discriminator(models)
        for model in models:
            value = literal_of(model, tag) if tag else model.__name__
            choice = f"{tag}: {value}" if tag else value
            self.section(model, (prefix or key) + ".", f"`{prefix or key}` with `{choice}`",
                         class_doc(model), self.anchor(f"{prefix or key}-{value}"))

    def names(self, key: str, info: FieldInfo) -> dict[type, str]:
        """How the type column of ``key`` names a model: a link to its section (a shared union's: to the
        placeholder's)."""
        models = models_in(info.annotation)
        if not models:
            return {}
        if frozenset(models) in self.shared:
            return {model: f"[source](#{self.anchor(PLACEHOLDER)})" for model in models}
        if len(models) == 1:
            return {models[0]: f"section [`{key}`](#{self.anchor(key)})"}
        tag = discriminator(models)
        named = {}
        for model in models:
            value = literal_of(model, tag) if tag else model.__name__
            named[model] = f"[`{value}`](#{self.anchor(f'{key}-{value}')})"
        return named

    def shared_sections(self) -> None:
        for union, keys in self.shared.items():
            models = sorted(union, key=_order(self.root, union))
            where = ", ".join(f"`{k}`" for k in keys)
            self.sections.append((self.anchor(PLACEHOLDER), f"Sources: `{PLACEHOLDER}`",
                                  f"`{PLACEHOLDER}` stands for {where} (a list's item: `KEY.N`). A source is "
                                  "one of these, chosen by its `format`.", []))
            self.variants(models, PLACEHOLDER, "", PLACEHOLDER)


def _order(root: type, union: frozenset):
    """Sort key: a union's models in the order the schema writes them."""
    order: list[type] = []

    def visit(cls: type) -> None:
        for info in cls.model_fields.values():
            for model in models_in(info.annotation):
                if model in union and model not in order:
                    order.append(model)
                visit(model)

    visit(root)
    return order.index


def render(sections: list) -> str:
    lines = []
    for anchor, title, intro, rows in sections:
        lines += [f"## {title} {{ #{anchor} }}", ""]
        if intro:
            lines += [text(intro), ""]
        if rows:
            lines += ["| Key | Type | Default | Description |", "| --- | --- | --- | --- |"]
            lines += [f"| `{key}` | {kind} | {default} | {text(doc)} |" for key, kind, default, doc in rows]
            lines.append("")
    return "\n".join(lines) + "\n"


def walk() -> list:
    from attnmt.config.schema import Config

    walker = Walk(Config)
    walker.run()
    walker.shared_sections()
    return walker.sections


def markdown() -> str:
    return render(walk())

