"""Provenance: where a number comes from and how much to trust it.

Every physical figure in a preset or a technology file carries a :class:`Provenance`: the source it was taken from
and its kind. The kinds follow the reference data's vocabulary (``../shared/reference/README.md``):

- ``datasheet``: a vendor's published figure (or a constant read from a public repository's code);
- ``measured``: a measurement (ours or a cited benchmark);
- ``reported``: a third party's report of a primary figure;
- ``projected``: a roadmap target or a value extrapolated for a part that does not ship yet;
- ``derived``: computed here from other cited figures (the arithmetic is in the source text);
- ``assumed``: our own choice where nothing is published, with the reasoning in the source text.
"""

from __future__ import annotations

import dataclasses

from arch_space.errors import ConfigError

KINDS = ("datasheet", "measured", "reported", "projected", "derived", "assumed")


@dataclasses.dataclass(frozen=True)
class Provenance:
    kind: str
    source: str

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ConfigError("kind", f"unknown provenance kind {self.kind!r} (one of {', '.join(KINDS)})")
        if not isinstance(self.source, str) or not self.source.strip():
            raise ConfigError("source", f"a provenance needs a non-empty source, got {self.source!r}")

    @classmethod
    def from_dict(cls, data, path: str) -> "Provenance":
        if not isinstance(data, dict):
            raise ConfigError(path, f"expected a mapping with 'kind' and 'source', got {data!r}")
        unknown = set(data) - {"kind", "source"}
        if unknown:
            raise ConfigError(f"{path}.{sorted(unknown)[0]}", "unknown key (a provenance has 'kind' and 'source')")
        for key in ("kind", "source"):
            if key not in data:
                raise ConfigError(f"{path}.{key}", "missing")
        try:
            return cls(kind=data["kind"], source=data["source"])
        except ConfigError as err:
            raise ConfigError(f"{path}.{err.path}", err.detail) from None


COMMAND_LINE = Provenance("assumed", "set on the command line (overrides the preset's value)")
