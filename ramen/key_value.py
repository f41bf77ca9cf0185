"""Typed confserver key values: one frozen dataclass per key, which writer and reader both import.

A value is built as a frozen dataclass deriving from KeyValue and written with `to_value()`; it is
read with `from_value()`, which checks every field (present, known, of its type) and raises
ContractError naming the key and the field in one line. A field renamed on one side then fails
loudly on the other, instead of reading as a default (Ramen's RamenSync values are one type on both
sides for the same reason).

Values are JSON-shaped: tuples are written as lists, `dict[int, X]` fields with their keys as
strings, nested KeyValues as mappings. A field of another type (the replay's plan) writes itself
with `to_json()` and is read back with its class's `from_json(text)`, or `from_dict(mapping)`.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, ClassVar

__all__ = ["ContractError", "KeyValue"]


class ContractError(Exception):
    """A key value that does not follow its contract: one line naming the key and the field."""


class KeyValue:
    """to_value()/from_value() for a frozen dataclass of JSON-shaped fields."""

    KEY: ClassVar[str]
    """The key pattern, for errors when the caller does not say which key it read."""

    def to_value(self) -> dict:
        """Optional fields left unset (None, empty) are left out, as readers take them as such."""
        return {f.name: _to_json(value) for f in dataclasses.fields(self)
                if not ((value := getattr(self, f.name)) in (None, ()) and f.default is not dataclasses.MISSING)}

    @classmethod
    def from_value(cls, value: Any, key: str | None = None):
        """The value read from `key`; ContractError names the key and the missing, unknown or
        wrongly typed field."""
        key = key or cls.KEY
        if not isinstance(value, dict):
            raise ContractError(f"{key}: not a mapping but {_shown(value)}")
        fields = dataclasses.fields(cls)
        unknown = sorted(set(value) - {f.name for f in fields})
        if unknown:
            raise ContractError(f"{key}: unknown field{'s' if len(unknown) > 1 else ''} "
                                f"{', '.join(map(repr, unknown))}")
        hints = typing.get_type_hints(cls)
        kwargs = {}
        for f in fields:
            if f.name in value:
                kwargs[f.name] = _from_json(key, f.name, hints[f.name], value[f.name])
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ContractError(f"{key}: missing field {f.name!r}")
        made = cls(**kwargs)
        made._check(key)
        return made

    def _check(self, key: str) -> None:
        """Rules across fields, beyond each field's type."""


def _to_json(field: Any) -> Any:
    if isinstance(field, KeyValue):
        return field.to_value()
    if isinstance(field, tuple):
        return [_to_json(item) for item in field]
    if isinstance(field, dict):
        return {str(k): _to_json(v) for k, v in field.items()}
    if hasattr(field, "to_json"):
        return field.to_json()
    return field


def _from_json(key: str, name: str, hint: Any, raw: Any) -> Any:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is types.UnionType and type(None) in args:  # X | None
        if raw is None:
            return None
        (hint,) = [a for a in args if a is not type(None)]
        origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is tuple:
        if not isinstance(raw, (list, tuple)):
            raise _wrong(key, name, raw, "a list")
        return tuple(_from_json(key, f"{name}[{i}]", args[0], item) for i, item in enumerate(raw))
    if origin is dict:  # channel -> count (channels written as strings: JSON keys), or name -> X
        if not isinstance(raw, dict):
            raise _wrong(key, name, raw, "a mapping")
        if args[0] is str:
            return {k: _from_json(key, f"{name}[{k}]", args[1], v) for k, v in raw.items()}
        try:
            return {int(k): _from_json(key, f"{name}[{k}]", args[1], v) for k, v in raw.items()}
        except ValueError:
            raise _wrong(key, name, raw, "a mapping of channel numbers") from None
    if isinstance(hint, type) and issubclass(hint, KeyValue):
        return hint.from_value(raw, f"{key}: {name}")
    if isinstance(hint, type) and hasattr(hint, "from_json"):
        try:
            return hint.from_dict(raw) if isinstance(raw, dict) and hasattr(hint, "from_dict") else hint.from_json(raw)
        except (ValueError, KeyError, TypeError) as e:
            raise ContractError(f"{key}: field {name!r} is not a {hint.__name__} ({type(e).__name__}: {e})") from None
    if hint is float and isinstance(raw, int) and not isinstance(raw, bool):
        return float(raw)
    if not isinstance(raw, hint) or (hint is int and isinstance(raw, bool)):
        raise _wrong(key, name, raw, f"{'an' if hint is int else 'a'} {hint.__name__}")
    return raw


def _wrong(key: str, name: str, raw: Any, expected: str) -> ContractError:
    return ContractError(f"{key}: field {name!r} is {_shown(raw)}, not {expected}")


def _shown(raw: Any) -> str:
    text = repr(raw)
    return f"{type(raw).__name__} {text if len(text) <= 40 else text[:37] + '...'}"
