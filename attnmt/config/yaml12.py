"""A YAML 1.2 reader for attnmt's configs: strict scalars, no duplicate keys, no aliases, line numbers kept.

PyYAML's ``SafeLoader`` reads YAML 1.1, whose implicit types are traps in a config: ``no`` is the
boolean false, ``1e-3`` is a string, ``010`` is octal 8 and ``1:30`` is sexagesimal 90. This loader
replaces those resolvers with the YAML 1.2 core schema: only ``true``/``false`` are booleans, ``1e-3``
is a float, ``010`` is an error and ``1:30`` a string. Duplicate keys are errors (PyYAML silently
keeps the last), and so are aliases (they allow "billion laughs" bombs when a config is dumped or
hashed). ``parse_yaml`` also returns the line of every key, so that a schema error can name it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from ..errors import ConfigError

MAX_CONFIG_BYTES = 1 << 20


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2 core-schema scalars, no duplicate keys and no aliases."""


# Replace the YAML 1.1 implicit resolvers for bool, int and float with YAML 1.2 core-schema ones.
_StrictLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers
            if tag not in ("tag:yaml.org,2002:bool", "tag:yaml.org,2002:int", "tag:yaml.org,2002:float")]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_StrictLoader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)
_StrictLoader.add_implicit_resolver(
    "tag:yaml.org,2002:int", re.compile(r"^(?:[-+]?(?:0|[1-9][0-9_]*)|0o[0-7]+|0x[0-9a-fA-F]+)$"),
    list("-+0123456789")
)
# Before the float resolver, which would otherwise read "010" as 10.0 (resolvers are tried in order).
_LEADING_ZERO_TAG = "tag:attnmt,2026:leading-zero"
_StrictLoader.add_implicit_resolver(_LEADING_ZERO_TAG, re.compile(r"^[-+]?0[0-9_]+$"), list("-+0"))
_StrictLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^(?:[-+]?(?:\.[0-9]+|[0-9][0-9_]*(?:\.[0-9_]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"),
    list("-+.0123456789"),
)


def _construct_int(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> int:
    return int(loader.construct_scalar(node).replace("_", ""), 0)


def _reject_leading_zero(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> Any:
    raise yaml.constructor.ConstructorError(
        None, None, f"{node.value!r}: leading zeros are not allowed (YAML 1.1 reads it as octal; "
                    "quote it if it is a string)", node.start_mark
    )


def _construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: dict[Any, yaml.Mark] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        try:
            hash(key)
        except TypeError:  # a list, mapping or set as a key (``? [a, b]``)
            raise yaml.constructor.ConstructorError(
                None, None, f"a {type(key).__name__} cannot be a key", key_node.start_mark
            ) from None
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r} (first defined on line {seen[key].line + 1})",
                key_node.start_mark
            )
        seen[key] = key_node.start_mark
    return loader.construct_mapping(node, deep=deep)


def _compose_node(self: _StrictLoader, parent: Any, index: Any) -> Any:
    if self.check_event(yaml.AliasEvent):
        event = self.peek_event()
        raise yaml.composer.ComposerError(None, None, "aliases are not allowed in attnmt configs",
                                          event.start_mark)
    return yaml.SafeLoader.compose_node(self, parent, index)


def _construct_object(self: _StrictLoader, node: yaml.Node, deep: bool = False) -> Any:
    """SafeLoader's constructors fail with plain Python errors on what they cannot read (``!!float abc``,
    ``!!bool maybe``, ``!!timestamp x``, an integer past int()'s 4300 digits); make those YAML errors at
    the node."""
    try:
        return yaml.SafeLoader.construct_object(self, node, deep=deep)
    except (ValueError, TypeError, KeyError, AttributeError, OverflowError):
        value = str(node.value) if isinstance(node, yaml.ScalarNode) else node.id
        shown = value if len(value) <= 40 else value[:40] + "..."
        raise yaml.constructor.ConstructorError(
            None, None, f"cannot read {shown!r} as {node.tag.rsplit(':', 1)[-1]}", node.start_mark
        ) from None


_StrictLoader.add_constructor("tag:yaml.org,2002:int", _construct_int)
_StrictLoader.add_constructor(_LEADING_ZERO_TAG, _reject_leading_zero)
_StrictLoader.add_constructor("tag:yaml.org,2002:map", _construct_mapping)
_StrictLoader.compose_node = _compose_node  # type: ignore[method-assign]
_StrictLoader.construct_object = _construct_object  # type: ignore[method-assign]


def parse_yaml(text: str, source: str) -> tuple[Any, dict[tuple[str, ...], int]]:
    """Parse ``text`` with the strict loader; return the data and a map from key path to line number."""
    try:
        loader = _StrictLoader(text)
        try:
            node = loader.get_single_node()
            data = loader.construct_document(node) if node is not None else None
        finally:
            loader.dispose()
        lines: dict[tuple[str, ...], int] = {}
        if node is not None:
            _collect_lines(node, (), lines)
    except RecursionError:  # PyYAML composes and constructs recursively
        raise ConfigError(f"{source}: YAML error: nested too deeply") from None
    except yaml.reader.ReaderError as e:  # its text has two lines; give the place as the others do
        line = text.count("\n", 0, e.position) + 1
        column = e.position - (text.rfind("\n", 0, e.position) + 1) + 1
        character = f"#x{e.character:04x}" if isinstance(e.character, int) else repr(e.character)
        raise ConfigError(f"{source}:{line}:{column}: YAML error: unacceptable character {character}: "
                          f"{e.reason}") from None
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source
        problem = e.problem or e.context or "invalid YAML"
        kind = ("YAML syntax error" if isinstance(e, (yaml.scanner.ScannerError, yaml.parser.ParserError))
                else "YAML error")
        raise ConfigError(f"{where}: {kind}: {problem}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{source}: YAML error: {' '.join(str(e).split())}") from None
    return data, lines


def _collect_lines(node: yaml.Node, path: tuple[str, ...], out: dict[tuple[str, ...], int]) -> None:
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            sub = (*path, str(key_node.value))
            out[sub] = key_node.start_mark.line + 1
            _collect_lines(value_node, sub, out)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            sub = (*path, str(i))
            out[sub] = item.start_mark.line + 1
            _collect_lines(item, sub, out)


def read_yaml_file(path: Path) -> tuple[Any, dict[tuple[str, ...], int]]:
    """``parse_yaml`` of a file of at most ``MAX_CONFIG_BYTES`` bytes of UTF-8; every problem is a
    ConfigError."""
    source = str(path)
    if not path.exists():
        raise ConfigError(f"{source}: config file not found")
    if path.is_dir():
        raise ConfigError(f"{source}: is a directory, not a config file")
    try:
        raw_bytes = path.read_bytes()
    except OSError as e:
        raise ConfigError(f"{source}: cannot read: {e.strerror}") from None
    if len(raw_bytes) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{source}: config is larger than {MAX_CONFIG_BYTES} bytes")
    try:
        text = raw_bytes.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{source}: invalid UTF-8 at byte offset {e.start}") from None
    return parse_yaml(text, source)
