"""The command line's options, generated from the config dataclasses: one source of truth for every option.

A dataclass field becomes a flag when its metadata holds ``help``; the rest of its metadata says how:

- ``flag``: the flag's name when it is not the field's (``learning_rate`` is ``--lr``);
- ``range``: ``(low, high)`` of an integer, both included; ``interval``: ``"(0, 1]"`` of a float, with ``noun``
  naming what is wanted ("a learning rate"); ``positive``: a positive finite float; ``parse``: any other
  ``text -> value`` (raising ``argparse.ArgumentTypeError``; with ``numeric: True`` a config file must give a
  number, not a string);
- ``choices``: the allowed strings (default: the field's ``Literal``); ``group``: the ``--help`` section;
- ``exclusive``: a mutually exclusive group's name; ``store``: a plain switch storing that value (``True``:
  ``--resume``; ``False``: ``--post-norm`` clears ``norm_first``); other ``bool`` fields get ``--x/--no-x``;
- ``in_file: False``: a flag a ``--config`` file may not hold (it is about one invocation, not the run).

Generated with argparse's public API, not a library: tyro (its own parser, errors in multi-line boxes) and
jsonargparse (flags named ``--max_iters``, no per-field flag name, multi-line ``Parser key`` errors) were tried
and cannot keep the flags' names, their one-line errors and exit code 2.

The same records read a ``--config`` TOML file (:func:`read_config`: ``tomllib`` and these checks, one line per
mistake), so the file's keys, types and ranges are the flags'.
"""

import argparse
import math
import types
import typing
from collections.abc import Callable, Iterable
from dataclasses import MISSING, dataclass, fields
from pathlib import Path
from typing import Any, Literal

__all__ = ["THREADS_HELP", "Flag", "add_flags", "flags_of", "int_in", "interval", "number", "parse_threads",
           "read_config", "values_of"]


def number(convert: Callable[[str], Any], accept: Callable[[Any], bool], wanted: str) -> Callable[[str], Any]:
    """An argparse type: ``convert`` the text, then refuse values ``accept`` rejects, naming what was wanted."""

    def parse(text: str) -> Any:
        try:
            value = convert(text)
        except ValueError:
            kind = "an integer" if convert is int else "a number"
            raise argparse.ArgumentTypeError(f"expected {kind}, got {text!r}") from None
        if not accept(value):
            raise argparse.ArgumentTypeError(f"expected {wanted}, got {text!r}")
        return value

    return parse


def int_in(low: int, high: int) -> Callable[[str], Any]:
    """An argparse type: an integer from ``low`` to ``high``."""
    return number(int, lambda v: low <= v <= high, f"an integer from {low} to {high}")


def interval(spec: str, noun: str = "a number") -> Callable[[str], Any]:
    """An argparse type: a finite float in ``spec``, written ``"(0, 1]"`` or ``"[0, 1)"`` (``inf`` for no bound)."""
    low_text, high_text = spec[1:-1].split(",")
    low, high = float(low_text), float(high_text)

    def accept(v: float) -> bool:
        above = v > low if spec[0] == "(" else v >= low
        below = v < high if spec[-1] == ")" else v <= high
        return above and below and math.isfinite(v)

    return number(float, accept, f"{noun} in {spec}")


THREADS_HELP = ("intra-op threads: auto (default) times real steps at 1 .. usable cores and keeps the fastest, "
                "re-checked when the step time drifts; a number fixes it (as do OMP_NUM_THREADS or the caller's "
                "torch.set_num_threads)")


def parse_threads(text: str) -> int | str:
    """``--threads``: ``auto`` or a positive integer."""
    if text.strip().lower() == "auto":
        return "auto"
    value: int = number(int, lambda v: v > 0, "a positive integer or auto")(text)
    return value


@dataclass(frozen=True)
class Flag:
    """One option: the field it sets (``dest``), its name on the command line and in a config file (``key``),
    and how text or a TOML value becomes the field's value."""

    dest: str
    key: str
    help: str
    default: Any
    kind: Literal["switch", "store", "choice", "path", "text", "number", "parse"]
    parse: Callable[[str], Any] | None = None
    choices: tuple[str, ...] = ()
    store: bool = True
    group: str | None = None
    exclusive: str | None = None
    in_file: bool = True
    metavar: str | None = None

    @property
    def option(self) -> str:
        return "--" + self.key.replace("_", "-")


def _base(annotation: Any) -> Any:
    """``X | None`` -> ``X``."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        members = [a for a in typing.get_args(annotation) if a is not type(None)]
        return members[0] if len(members) == 1 else annotation
    return annotation


#: The metadata keys a flag's field may hold (a misspelt key is an error, not a silently ignored setting).
KEYS = frozenset({"help", "flag", "range", "interval", "noun", "positive", "parse", "numeric", "choices", "group",
                  "exclusive", "store", "in_file", "metavar"})


def _flag(name: str, annotation: Any, meta: dict[str, Any], default: Any) -> Flag:
    if set(meta) - KEYS:
        raise TypeError(f"{name}: unknown flag metadata {sorted(set(meta) - KEYS)} (known: {', '.join(sorted(KEYS))})")
    base = _base(annotation)
    common = {"dest": name, "key": meta.get("flag", name), "help": meta["help"], "default": default,
              "group": meta.get("group"), "exclusive": meta.get("exclusive"), "in_file": meta.get("in_file", True),
              "metavar": meta.get("metavar")}
    choices = meta.get("choices") or (typing.get_args(base) if typing.get_origin(base) is Literal else ())
    if "store" in meta:
        return Flag(kind="store", store=meta["store"], **common)
    if base is bool:
        return Flag(kind="switch", **common)
    if choices:
        return Flag(kind="choice", choices=tuple(choices), **common)
    if base is Path:
        return Flag(kind="path", **common)
    if "parse" in meta:
        return Flag(kind="number" if meta.get("numeric") else "parse", parse=meta["parse"], **common)
    if "range" in meta:
        return Flag(kind="number", parse=int_in(*meta["range"]), **common)
    if meta.get("positive"):
        return Flag(kind="number", parse=number(float, lambda v: v > 0 and math.isfinite(v),
                                                "a positive finite number"), **common)
    if "interval" in meta:
        return Flag(kind="number", parse=interval(meta["interval"], meta.get("noun", "a number")), **common)
    if base is str:
        return Flag(kind="text", **common)
    raise TypeError(f"{name}: give the field's metadata a range, an interval or a parse function")


def flags_of(cls: type, *, own_defaults: bool = False) -> list[Flag]:
    """The flags of a dataclass's fields that have ``help`` in their metadata, in field order. Their default is
    None (a given flag overrides the dataclass's or a preset's value) unless ``own_defaults``."""
    hints = typing.get_type_hints(cls)
    found = []
    for field in fields(cls):
        if "help" in field.metadata:
            default = field.default if own_defaults and field.default is not MISSING else None
            if own_defaults and field.default_factory is not MISSING:
                default = field.default_factory()
            found.append(_flag(field.name, hints[field.name], dict(field.metadata), default))
    return found


def add_flags(parser: argparse.ArgumentParser, flags: Iterable[Flag]) -> None:
    """Add ``flags`` to ``parser`` (in their ``--help`` sections and mutually exclusive groups)."""
    groups: dict[str | None, Any] = {None: parser}
    exclusive: dict[str, Any] = {}
    for flag in flags:
        if flag.group not in groups:
            groups[flag.group] = parser.add_argument_group(flag.group)
        where = groups[flag.group]
        if flag.exclusive is not None:
            if flag.exclusive not in exclusive:
                exclusive[flag.exclusive] = where.add_mutually_exclusive_group()
            where = exclusive[flag.exclusive]
        options: dict[str, Any] = {"dest": flag.dest, "default": flag.default, "help": flag.help}
        if flag.kind == "store":
            options["action"] = "store_true" if flag.store else "store_false"
        elif flag.kind == "switch":
            options["action"] = argparse.BooleanOptionalAction
        elif flag.kind == "choice":
            options["choices"] = list(flag.choices)
        else:
            options["type"] = {"path": Path, "text": str}.get(flag.kind, flag.parse)
            options["metavar"] = flag.metavar or flag.key.upper()
        where.add_argument(flag.option, **options)


def _file_value(flag: Flag, value: Any) -> Any:
    """A TOML value for ``flag``, checked as the flag checks its text; raises ValueError with the reason."""
    if flag.kind in ("switch", "store"):
        if not isinstance(value, bool):
            raise ValueError(f"expected true or false, got {value!r}")
        return value if flag.kind == "switch" or flag.store else not value  # post_norm = true: norm_first False
    if flag.kind == "choice":
        if not isinstance(value, str) or value not in flag.choices:
            raise ValueError(f"expected one of {', '.join(flag.choices)}, got {value!r}")
        return value
    if flag.kind in ("path", "text"):
        if not isinstance(value, str):
            raise ValueError(f"expected a {'path (a string)' if flag.kind == 'path' else 'string'}, got {value!r}")
        return Path(value) if flag.kind == "path" else value
    if isinstance(value, bool) or not isinstance(value, int | float | str) or (
            isinstance(value, str) and flag.kind == "number"):
        raise ValueError(f"expected a number, got {value!r}")
    assert flag.parse is not None
    try:
        return flag.parse(value if isinstance(value, str) else repr(value))
    except argparse.ArgumentTypeError as err:
        raise ValueError(str(err)) from None


def read_config(path: Path, flags: Iterable[Flag], what: str = "the config file") -> dict[str, Any]:
    """The options in the TOML file ``path`` (keys: the flags' names, ``_`` or ``-``), checked as the flags check
    their text: ``{dest: value}``, to become the parser's defaults (``set_defaults``) so that flags override them.

    Raises:
        ValueError: the file is missing, unreadable or not TOML, or holds an unknown key or a value of the wrong
            type or out of range (one line naming the file and the key).
    """
    import tomllib

    from ._files import NotARegularFile, require_regular_file

    try:
        table = tomllib.loads(require_regular_file(path, what).read_text(encoding="utf-8"))
    except NotARegularFile as err:
        raise ValueError(f"--config {err}") from None
    except FileNotFoundError:
        raise ValueError(f"--config {path}: no such file") from None
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"--config {path}: cannot be read ({getattr(err, 'strerror', None) or err})") from None
    except tomllib.TOMLDecodeError as err:
        raise ValueError(f"--config {path}: not valid TOML ({str(err).splitlines()[0]})") from None
    known = {flag.key: flag for flag in flags if flag.in_file}
    values: dict[str, Any] = {}
    for key, value in table.items():
        flag = known.get(key.replace("-", "_"))
        if flag is None:
            raise ValueError(f"--config {path}: unknown key {key!r} (known: {', '.join(sorted(known))})")
        try:
            values[flag.dest] = _file_value(flag, value)
        except ValueError as err:
            raise ValueError(f"--config {path}: {key}: {err}") from None
    return values


def values_of(args: argparse.Namespace, cls: type) -> dict[str, Any]:
    """The flags of ``cls`` given on the command line or in the config file (not None): ``{field: value}``."""
    return {flag.dest: getattr(args, flag.dest) for flag in flags_of(cls)
            if getattr(args, flag.dest, None) is not None}
