"""Accelerator descriptions, the technology roadmap and the design spaces built on it (pure computation)."""

from arch_space.errors import ConfigError
from arch_space.provenance import KINDS, Provenance

__all__ = ["ConfigError", "KINDS", "Provenance"]
