"""Serving scenarios: what load the chip serves and how it is measured.

- ``closed_loop``: the InferenceX method (reference README): fixed maximum concurrency swept in powers of two,
  infinite request rate, random prompts (no prefix-cache hits), continuous batching with chunked prefill.
- ``offline``: trtllm-bench throughput: every request queued at once, exact lengths; the figure is the best
  throughput over batch sizes that fit.
- ``disaggregated``: separate prefill and decode pools; the pool ratio is given (``prefill_pool_fraction``) or
  searched (the ratio that balances the two pools' request rates).
- ``agentic``: multi-turn sessions: each turn appends ``turn_input_tokens`` (user / tool output) and generates
  ``osl_tokens``; a prefix cache keeps ``prefix_cache_hit_rate`` of the earlier context; ``tool_gap_s`` passes
  between turns; the latency of a chain of ``chain_steps`` dependent turns is reported.
Any kind may add speculative decoding with an MTP draft (``draft_tokens``; ``first_acceptance_rate`` for the first
draft token, ``acceptance_rate`` for each later one given the earlier were accepted).

Lengths are nominal; ``uniform_0.8_1.0`` draws each request's lengths uniformly in [0.8, 1.0] x nominal, so
their means are 0.9 x nominal (memory is sized for the nominal, i.e. longest, request).
"""

from __future__ import annotations

import dataclasses

import jax

from arch_space.errors import ConfigError
from arch_space.validation import build, check_quantities, choice, quantity

INPUT_DISTS = ("fixed", "uniform_0.8_1.0")
KINDS = ("closed_loop", "offline", "disaggregated", "agentic")


@dataclasses.dataclass(frozen=True)
class Scenario:
    name: str
    kind: str = choice(KINDS)
    isl_tokens: int = quantity(integer=True)
    osl_tokens: int = quantity(integer=True)
    input_dist: str = choice(INPUT_DISTS, default="fixed")
    concurrency: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
    max_chips: int = quantity(integer=True, default=8)  # chips one model instance may span (mapping search)
    # speculative decoding (MTP draft head): 0 = off
    draft_tokens: int = quantity(integer=True, allow_zero=True, default=0)
    acceptance_rate: float = quantity(allow_zero=True, default=0.0)  # each later draft token, given the earlier
    # the first draft token (null: acceptance_rate). Kept apart because the one measured figure is for the first
    # draft of a module trained one token ahead (DeepSeek-V3 report, sec. 5.4.3: 85-90%); engines chain that module
    # for longer drafts, where it predicts from its own drafted states and accepts less
    first_acceptance_rate: float | None = quantity(optional=True, allow_zero=True)
    # disaggregated serving
    prefill_batch_tokens: int = quantity(integer=True, default=16384)  # per attention replica (DP rank)
    prefill_pool_fraction: float | None = quantity(optional=True)
    # agentic sessions
    turns: int = quantity(integer=True, default=1)
    turn_input_tokens: int = quantity(integer=True, allow_zero=True, default=0)
    tool_gap_s: float = quantity(allow_zero=True, default=0.0)
    prefix_cache_hit_rate: float = quantity(allow_zero=True, default=0.0)
    chain_steps: int = quantity(integer=True, default=1)
    description: str = ""

    @classmethod
    def from_dict(cls, data, path: str = "scenario") -> "Scenario":
        sc = build(cls, data, path)
        check_quantities(sc.concurrency, f"{path}.concurrency", integer=True, minimum=1)
        if sorted(set(sc.concurrency)) != list(sc.concurrency):
            raise ConfigError(f"{path}.concurrency", f"must be strictly increasing, got {list(sc.concurrency)}")
        for f in ("acceptance_rate", "first_acceptance_rate", "prefix_cache_hit_rate"):
            if getattr(sc, f) is not None and not getattr(sc, f) < 1:
                raise ConfigError(f"{path}.{f}", f"must be < 1, got {getattr(sc, f)}")
        if sc.prefill_pool_fraction is not None and not sc.prefill_pool_fraction < 1:
            raise ConfigError(f"{path}.prefill_pool_fraction", f"must be < 1, got {sc.prefill_pool_fraction}")
        if sc.draft_tokens and sc.acceptance_rate <= 0:
            raise ConfigError(f"{path}.acceptance_rate", "must be > 0 when draft_tokens > 0")
        if sc.draft_tokens and sc.first_acceptance_rate is not None and sc.first_acceptance_rate <= 0:
            raise ConfigError(f"{path}.first_acceptance_rate", "must be > 0 when draft_tokens > 0 (null: "
                                                               "acceptance_rate)")
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

    @property
    def tokens_per_step(self) -> float:
        """Expected tokens a sequence advances per step with an n-token draft whose first token is accepted with
        probability a1 and each later one, given the earlier, with a: the verified prefix plus the target's own
        token, 1 + a1 (1 + a + ... + a^(n-1)) = 1 + a1 (1 - a^n) / (1 - a); with a1 = a it is Leviathan et al.'s
        (1 - a^(n+1)) / (1 - a) (ICML 2023, eq. 1). 1 without speculation."""
        n, a = self.draft_tokens, self.acceptance_rate
        a1 = a if self.first_acceptance_rate is None else self.first_acceptance_rate
        return 1.0 + a1 * (1.0 - a ** n) / (1.0 - a)  # = 1 for n = 0 (a < 1): no branch, so it traces

    @property
    def max_context_tokens(self) -> int:
        if self.kind == "agentic":
            return self.isl_tokens + self.turns * (self.turn_input_tokens + self.osl_tokens)
        return self.isl_tokens + self.osl_tokens


def check_positions(sc: "Scenario", arch, path: str) -> None:
    """A scenario's longest request must fit the positions the model was built for (``max_position_embeddings``:
    RoPE scaled to it, trained to it): Llama 2 70B (4096) cannot serve InferenceX's 8k/1k. ConfigError on ``path``
    naming both."""
    if sc.max_context_tokens > arch.max_position_embeddings:
        raise ConfigError(path, f"the scenario {sc.name!r} reaches {sc.max_context_tokens} tokens of context, "
                                f"{arch.name} attends over at most {arch.max_position_embeddings} positions")


# Numeric fields are pytree leaves, so scenarios that differ only in lengths or rates share one compiled evaluator;
# what changes the program (kind, length distribution, the concurrency grid, a fixed vs searched pool ratio) is static.
_NUMERIC = ("isl_tokens", "osl_tokens", "max_chips", "draft_tokens", "acceptance_rate", "first_acceptance_rate",
            "prefill_batch_tokens", "prefill_pool_fraction", "turns", "turn_input_tokens", "tool_gap_s",
            "prefix_cache_hit_rate", "chain_steps")
jax.tree_util.register_dataclass(Scenario, data_fields=list(_NUMERIC),
                                 meta_fields=[f.name for f in dataclasses.fields(Scenario) if f.name not in _NUMERIC])
