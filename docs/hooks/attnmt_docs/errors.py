"""The errors reference: every error class of ``attnmt/errors.py`` with its exit code and docstring, the
exit codes they make, and the module's other messages and mappings (the out-of-memory line, the operating
system's resource errors)."""

from __future__ import annotations

import errno
import inspect

from .config import text


def error_classes() -> list[type]:
    """``AttnmtError`` and every subclass defined in ``attnmt.errors``, in the module's order."""
    from attnmt import errors

    found = [value for value in vars(errors).values()
             if isinstance(value, type) and issubclass(value, errors.AttnmtError)
             and value.__module__ == errors.__name__]
    return sorted(found, key=lambda cls: inspect.getsourcelines(cls)[1])


def exit_codes() -> dict[int, list[type]]:
    """Each exit code the error classes make, with its classes."""
    codes: dict[int, list[type]] = {}
    for cls in error_classes():
        codes.setdefault(cls.exit_code, []).append(cls)
    return dict(sorted(codes.items()))


def _doc(cls: type) -> str:
    return text(inspect.cleandoc(cls.__dict__.get("__doc__") or ""))


def markdown() -> str:
    from attnmt import errors

    lines = ["## Exit codes", "", "| Exit code | Error classes | What it means |", "| --- | --- | --- |"]
    for code, classes in exit_codes().items():
        names = ", ".join(f"[`{c.__name__}`](#{c.__name__.lower()})" for c in classes)
        lines.append(f"| {code} | {names} | {_doc(classes[0])} |")
    lines += ["", "## Error classes", ""]
    for cls in error_classes():
        base = cls.__mro__[1].__name__
        lines += [f"### `{cls.__name__}` {{ #{cls.__name__.lower()} }}", "",
                  f"Exit code **{cls.exit_code}**" + (f"; a kind of `{base}`." if base != "Exception"
                                                      else "."),
                  "", _doc(cls), ""]
    lines += ["## Out of memory", "", "Exit code 5 (`errors.OUT_OF_MEMORY`), whatever ran out:", "",
              f"```text\nerror: {errors.OUT_OF_MEMORY}\n```", "",
              "## Operating-system errors", "",
              "These `errno`s are the machine's resources, not a bug of attnmt nor a mistake in the data: "
              "exit code 5 (`ResourceError`) naming the file, or 3 (`DataError`) when a user's input file "
              "cannot be read for a reason that is not the process's own. The message says the cause in "
              "these words:", "", "| errno | The message says |", "| --- | --- |"]
    lines += [f"| `{errno.errorcode[number]}` | {text(words)} |"
              for number, words in errors.RESOURCE_ERRNOS.items()]
    return "\n".join(lines) + "\n"
