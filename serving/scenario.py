"""Serving scenarios: what load the chip serves and how it is measured.

``closed_loop`` is the InferenceX method (reference README): a fixed maximum concurrency swept in powers of two,
infinite request rate, random prompts (no prefix-cache hits). ``offline`` is trtllm-bench throughput: every request
queued at once, exact lengths. Lengths are nominal; ``uniform_0.8_1.0`` draws each request's input and output
length uniformly in [0.8, 1.0] x nominal, so their means are 0.9 x nominal.
"""

from __future__ import annotations

import dataclasses

from arch_space.errors import ConfigError
from arch_space.validation import build, check_quantities, choice, quantity

INPUT_DISTS = ("fixed", "uniform_0.8_1.0")


@dataclasses.dataclass(frozen=True)
class Scenario:
    name: str
    kind: str = choice(("closed_loop", "offline"))
    isl_tokens: int = quantity(integer=True)
    osl_tokens: int = quantity(integer=True)
    input_dist: str = choice(INPUT_DISTS, default="fixed")
    concurrency: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
    description: str = ""

    @classmethod
    def from_dict(cls, data, path: str = "scenario") -> "Scenario":
        sc = build(cls, data, path)
        check_quantities(sc.concurrency, f"{path}.concurrency", integer=True, minimum=1)
        if sorted(set(sc.concurrency)) != list(sc.concurrency):
            raise ConfigError(f"{path}.concurrency", f"must be strictly increasing, got {list(sc.concurrency)}")
        return sc

    @property
    def length_scale(self) -> float:
        """Mean length as a fraction of nominal (0.9 for lengths drawn uniformly in [0.8, 1.0])."""
        return 0.9 if self.input_dist == "uniform_0.8_1.0" else 1.0

    @property
    def mean_isl_tokens(self) -> float:
        return self.isl_tokens * self.length_scale

    @property
    def mean_osl_tokens(self) -> float:
        return self.osl_tokens * self.length_scale
