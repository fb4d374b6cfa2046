"""Typed construction of frozen dataclasses from plain mappings, with one-line errors.

The configs arrive as plain ``dict``/``list`` trees (``codesign/`` converts Hydra's DictConfig before anything else
sees it). :func:`build` turns such a tree into a frozen dataclass, checking on the way:

- unknown keys and missing required keys;
- types (``bool`` is not accepted where a number is expected, a string is never silently parsed);
- physical quantities (fields declared with :func:`quantity`): finite and strictly positive, unless the field is
  optional and the value is ``null`` (unknown / not supported);
- choices (fields declared with ``choices=...``).

Each failure raises :class:`ConfigError` with the dotted path of the field and the rejected value.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from typing import Any

from arch_space.errors import ConfigError


def quantity(*, optional: bool = False, allow_zero: bool = False, integer: bool = False, default=dataclasses.MISSING,
             doc: str = ""):
    """Declare a physical quantity: finite, > 0 (or >= 0 with ``allow_zero``), ``None`` allowed only if optional."""
    meta = {"physical": True, "optional": optional, "allow_zero": allow_zero, "integer": integer, "doc": doc}
    if default is dataclasses.MISSING and optional:
        default = None
    if default is dataclasses.MISSING:
        return dataclasses.field(metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def choice(options: tuple, default=dataclasses.MISSING):
    meta = {"choices": tuple(options)}
    if default is dataclasses.MISSING:
        return dataclasses.field(metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def check_quantity(value: Any, path: str, *, optional=False, allow_zero=False, integer=False):
    """Return ``value`` as a float (or int) if it is a valid physical quantity, else raise ConfigError."""
    if value is None:
        if optional:
            return None
        raise ConfigError(path, "is required (got null)")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(path, f"expected a number, got {value!r}")
    if math.isnan(value) or math.isinf(value):
        raise ConfigError(path, f"must be finite, got {value!r}")
    if value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ConfigError(path, f"must be {bound}, got {value!r}")
    if integer:
        if float(value) != int(value):
            raise ConfigError(path, f"must be a whole number, got {value!r}")
        return int(value)
    return float(value)


def _type_name(tp) -> str:
    return getattr(tp, "__name__", str(tp))


def _coerce(tp, value, path: str):
    """Check ``value`` against annotation ``tp`` and return the typed value."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        non_none = [a for a in args if a is not type(None)]
        if value is None:
            if type(None) in args:
                return None
            raise ConfigError(path, "is required (got null)")
        last = None
        for alt in non_none:
            try:
                return _coerce(alt, value, path)
            except ConfigError as err:
                last = err
        raise last
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(path, f"expected a list, got {value!r}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_coerce(args[0], v, f"{path}[{i}]") for i, v in enumerate(value))
        if len(args) != len(value):
            raise ConfigError(path, f"expected {len(args)} items, got {value!r}")
        return tuple(_coerce(a, v, f"{path}[{i}]") for i, (a, v) in enumerate(zip(args, value)))
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(path, f"expected a mapping, got {value!r}")
        kt, vt = args
        return {_coerce(kt, k, path): _coerce(vt, v, f"{path}.{k}") for k, v in value.items()}
    if tp is Any:
        return value
    if tp is dict:
        if not isinstance(value, dict):
            raise ConfigError(path, f"expected a mapping, got {value!r}")
        return value
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        builder = getattr(tp, "from_dict", None)
        if builder is not None:
            return builder(value, path)
        return build(tp, value, path)
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(path, f"expected true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                return int(value)
            raise ConfigError(path, f"expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(path, f"expected a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(path, f"expected a string, got {value!r}")
        return value
    raise TypeError(f"validation does not support the annotation {_type_name(tp)} at {path}")


def build(cls, data, path: str = "", *, ignore: tuple[str, ...] = ()):
    """Build dataclass ``cls`` from mapping ``data``, validating every field (see module docstring)."""
    if isinstance(data, cls):
        return data
    if not isinstance(data, dict):
        raise ConfigError(path, f"expected a mapping for {cls.__name__}, got {data!r}")
    prefix = f"{path}." if path else ""
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    for key in data:
        if key not in fields and key not in ignore:
            raise ConfigError(f"{prefix}{key}", f"unknown key for {cls.__name__} (known: {', '.join(fields)})")
    kwargs = {}
    for name, f in fields.items():
        fpath = f"{prefix}{name}"
        if name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ConfigError(fpath, "is missing")
            continue
        value = data[name]
        meta = f.metadata
        if meta.get("physical"):
            kwargs[name] = check_quantity(value, fpath, optional=meta["optional"], allow_zero=meta["allow_zero"],
                                          integer=meta["integer"])
            continue
        typed = _coerce(hints[name], value, fpath)
        if "choices" in meta and typed not in meta["choices"]:
            raise ConfigError(fpath, f"must be one of {', '.join(map(str, meta['choices']))}, got {value!r}")
        kwargs[name] = typed
    try:
        return cls(**kwargs)
    except ConfigError as err:
        if err.path.startswith(prefix) or not prefix:
            raise
        raise ConfigError(f"{prefix}{err.path}", err.detail) from None


def check_quantities(values, path: str, *, integer: bool = False, minimum: float | None = None) -> tuple:
    """A non-empty list of physical quantities (each finite and > 0; ``minimum`` tightens the bound)."""
    if not values:
        raise ConfigError(path, "needs at least one value")
    out = []
    for i, v in enumerate(values):
        q = check_quantity(v, f"{path}[{i}]", integer=integer)
        if minimum is not None and q < minimum:
            raise ConfigError(f"{path}[{i}]", f"must be >= {minimum:g}, got {v!r}")
        out.append(q)
    return tuple(out)


def check_names(values, path: str, *, what: str = "name") -> tuple[str, ...]:
    """A non-empty list of distinct, non-empty strings (mapping names, parameter names...). A bare string is refused
    rather than read as a list of its characters."""
    if not isinstance(values, (list, tuple)):
        raise ConfigError(path, f"expected a list of {what}s, got {values!r}")
    if not values:
        raise ConfigError(path, f"needs at least one {what}")
    for i, v in enumerate(values):
        if not isinstance(v, str) or not v:
            raise ConfigError(f"{path}[{i}]", f"expected a {what}, got {v!r}")
        if v in values[:i]:
            raise ConfigError(f"{path}[{i}]", f"{v!r} is listed twice")
    return tuple(values)
