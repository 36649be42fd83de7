"""The core's settings: one table, declared in C (``csrc/core/rb_config.c``) and read here.

Every layer that takes a setting reads it from this table: ``RawBlockCoreConfig``'s fields,
the plugin's ``rust_raw_block.<name>`` keys, the MP adapter's keys and ``_native.Core``'s
keywords all carry the same name, type, range and default, and :func:`parse_value` is the one
place a user's value (a Python object, or a string from YAML, JSON or the environment) becomes
a setting's value. A bad value raises ``ValueError`` naming the setting and the value.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass
from typing import Any, Literal, overload

from . import _native

__all__ = ["Setting", "SETTINGS", "parse_value", "parse_bool", "parse_int", "parse_id_list"]


@dataclass(frozen=True)
class Setting:
    """One entry of the core's settings table (see ``_native.settings()``)."""

    name: str
    type: str  # "path", "int", "bool", "choice" or "bytes"
    min: int
    max: int
    default: Any  # None: no default (required, or unset)
    choices: tuple[str, ...] | None  # the values of a "choice" setting, else None
    lmcache: bool  # a field of LMCache's RawBlockCoreConfig
    required: bool  # RawBlockCoreConfig has no default for it
    config: bool  # a RawBlockCoreConfig field (LMCache's or ours)
    plugin: bool  # read from extra_config as rust_raw_block.<name>
    nonpositive_is_zero: bool  # LMCache takes values <= 0 as 0
    clamp_to_min: bool  # LMCache raises values below min to min
    power_of_two: bool
    none_is_zero: bool  # None means unset and reaches C as 0
    policy: bool  # an FDP placement-policy setting (lmcache_rawblock.fdp), not a core field
    lmcache_mp: bool  # a key of LMCache's MP adapter JSON
    auto: bool  # an "int" setting that also takes the word "auto" (resolved by the core at open)
    help: str


SETTINGS: dict[str, Setting] = {d["name"]: Setting(**d) for d in _native.settings()}

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


def parse_bool(value: Any, label: str) -> bool:
    """True/False, the ints 0 and 1, or a boolean word (true/false, yes/no, on/off, 1/0; any
    case). Anything else raises: the string ``"false"`` is False, never truthy."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        word = value.strip().lower()
        if word in _TRUE:
            return True
        if word in _FALSE:
            return False
    raise ValueError(f"{label} must be a boolean (true/false), got {value!r}")


def finite_number(value: Any) -> float | None:
    """An int, a float or a decimal string (YAML and the environment give strings) as a finite
    float; None for anything else, booleans, NaN and infinities included. The caller checks the
    range and names the setting."""
    if isinstance(value, bool):
        return None
    try:
        number = float(value.strip() if isinstance(value, str) else value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def parse_int(value: Any, label: str) -> int:
    """An int, an integral float, or a string holding a decimal integer (YAML and the environment
    give strings). Booleans are refused: ``True`` is not a size."""
    if isinstance(value, bool):
        raise ValueError(f"{label} must be an integer, got {value!r}")
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            return int(value.strip(), 10)
        except ValueError:
            pass
    raise ValueError(f"{label} must be an integer, got {value!r}")


def _check_range(s: Setting, v: int, label: str, logger: logging.Logger | None) -> int:
    if s.nonpositive_is_zero and v <= 0:
        return 0
    if s.clamp_to_min and v < s.min:
        (logger or logging.getLogger(__name__)).warning(
            "%s=%d is below the minimum %d; using %d", label, v, s.min, s.min)
        return s.min
    if s.power_of_two and (v <= 0 or v & (v - 1)):
        raise ValueError(f"{label} must be a power of two > 0, got {v}")
    if v < s.min:
        bound = "> 0" if s.min == 1 else f">= {s.min}"
        raise ValueError(f"{label} must be {bound}, got {v}")
    if v > s.max:
        raise ValueError(f"{label} must be <= {s.max}, got {v}")
    return v


@overload
def check_placement_id(pid: Any, label: str, *, allow_none: Literal[False], show_value: bool = False) -> int: ...
@overload
def check_placement_id(pid: Any, label: str, *, allow_none: bool = True, show_value: bool = False) -> int | None: ...
def check_placement_id(pid: Any, label: str, *, allow_none: bool = True, show_value: bool = False) -> int | None:
    """One FDP placement identifier: None (no directive, when allowed) or 1..=65535, with
    LMCache's messages (``show_value`` appends the value given)."""
    suffix = " or None" if allow_none else ""
    got = f", got {pid!r}" if show_value else ""
    if pid is None:
        if not allow_none:
            raise ValueError(f"{label} must contain integers{got}")
        return None
    if not isinstance(pid, int) or isinstance(pid, bool):
        raise ValueError(f"{label} must contain integers{suffix}{got}")
    if pid == 0:
        raise ValueError(f"{label} must not contain placement identifier 0")
    if pid < 0:
        raise ValueError(f"{label} must contain positive integers{suffix}{got}")
    if pid > 0xFFFF:
        raise ValueError(f"{label} must contain placement identifiers in range 1..=65535{suffix}{got}")
    return int(pid)


def parse_id_list(value: Any, label: str, s: Setting) -> tuple[int, ...]:
    """A list of distinct identifiers in ``s.min..s.max``: a list or tuple, or the text of one
    ("1,2,3" or "[1, 2, 3]", as YAML templates and the environment give it). Each element is
    checked as a placement identifier; the message names the setting and the whole value."""
    ids = [_id_list_element(item, value, label, s) for item in _id_list_items(value, label)]
    if not ids:
        raise ValueError(f"{label} must not be empty, got {value!r}")
    dups = sorted({i for i in ids if ids.count(i) > 1})
    if dups:
        raise ValueError(f"{label} must not contain duplicates, got {value!r} ({', '.join(map(str, dups))} repeated)")
    return tuple(ids)


def _id_list_items(value: Any, label: str) -> list | tuple:
    """The elements of an identifier list: ``value`` itself when a list or tuple, the
    comma-separated words of a string (brackets optional); anything else raises."""
    items = value
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("[") and text.endswith("]"):
            text = text[1:-1]
        items = [t.strip() for t in text.split(",")] if text.strip() else []
    if not isinstance(items, (list, tuple)):
        raise ValueError(f"{label} must be a list of integers, got {value!r}")
    return items


def _id_list_element(item: Any, value: Any, label: str, s: Setting) -> int:
    """One element of the identifier list ``value`` (a decimal string or an int) as a placement
    identifier in ``s.min..s.max``; errors name the whole list."""
    if isinstance(item, str):
        try:
            item = int(item, 10)
        except ValueError:
            raise ValueError(f"{label} must contain integers, got {value!r}") from None
    try:
        pid = check_placement_id(item, label, allow_none=False, show_value=True)
    except ValueError as e:
        raise ValueError(f"{e} (in {value!r})") from None
    if pid < s.min or pid > s.max:  # the table's range (1..65535 for placement ids)
        raise ValueError(f"{label} must contain integers in {s.min}..{s.max}, got {value!r}")
    return pid


def parse_value(name: str, value: Any, *, label: str | None = None,
                logger: logging.Logger | None = None) -> Any:
    """``value`` as setting ``name`` takes it: parsed, range-checked, with LMCache's leniencies
    (values <= 0 meaning 0 where LMCache allows it, an interval below 1 s raised to 1 s with a
    warning). ``label`` is how errors name the setting (default: its name)."""
    s = SETTINGS[name]
    label = label or name
    if s.none_is_zero:
        if isinstance(value, str):
            value = parse_int(value, label)
        return check_placement_id(value, label, show_value=True)
    if s.type == "bool":
        return parse_bool(value, label)
    if s.type == "id_list":
        return parse_id_list(value, label, s)
    if s.type == "int":
        if s.auto and isinstance(value, str) and value.strip().lower() == "auto":
            return "auto"
        return _check_range(s, parse_int(value, label), label, logger)
    if s.type == "path":
        return _parse_path(value, label)
    if s.type == "choice":
        return _parse_choice(name, value, label, s.choices or ())
    if s.type == "bytes":
        return _parse_bytes(value, label)
    raise AssertionError(f"setting {name} has unknown type {s.type}")


def _parse_path(value: Any, label: str) -> str:
    """A non-empty path (str, bytes or os.PathLike) as a str; anything else raises."""
    if isinstance(value, (str, bytes, os.PathLike)):
        path = os.fsdecode(value)
        if path:
            return path
    if value is None or value == "":
        raise ValueError(f"{label} must be non-empty")
    raise ValueError(f"{label} must be a path, got {value!r}")


def _parse_choice(name: str, value: Any, label: str, choices: tuple[str, ...]) -> str:
    """One of ``choices``, given in any case (or a YAML boolean for an on/off choice)."""
    if isinstance(value, str) and value.strip().lower() in choices:
        return value.strip().lower()
    # YAML 1.1 (PyYAML) reads a bare on/off/true/false as a boolean
    if isinstance(value, bool) and {"on", "off"} <= set(choices):
        return "on" if value else "off"
    if name == "io_engine":
        raise ValueError(f"io_engine must be one of: {', '.join(sorted(choices))}; got {value!r}")
    raise ValueError(f"{label} must be one of: {', '.join(choices)}; got {value!r}")


def _parse_bytes(value: Any, label: str) -> bytes:
    """Exactly 8 ASCII bytes, given as bytes, a bytearray or an ASCII str."""
    if isinstance(value, str):
        if not value.isascii():
            raise ValueError(f"{label} must be ASCII bytes, got {value!r}")
        value = value.encode("ascii")
    if not isinstance(value, (bytes, bytearray)) or len(value) != 8:
        raise ValueError(f"{label} must be exactly 8 bytes, got {value!r}")
    if not bytes(value).isascii():
        raise ValueError(f"{label} must be ASCII bytes, got {bytes(value)!r}")
    return bytes(value)
