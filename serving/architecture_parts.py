"""The parts of a published architecture that are records of their own: RoPE scaling, a vision tower, the
publisher's size figures (``serving.architecture.ModelArchitecture`` holds one of each where the model has it) and
the kind of one layer (``ModelArchitecture.layer_kinds``).
"""

from __future__ import annotations

import dataclasses

from arch_space.errors import ConfigError
from arch_space.validation import choice, quantity

ROPE_SCALING_TYPES = ("llama3", "yarn")


@dataclasses.dataclass(frozen=True, kw_only=True)
class RopeScaling:
    """RoPE frequency scaling for long context (transformers ``rope_scaling``; only the keys the config sets)."""
    type: str = choice(ROPE_SCALING_TYPES)
    factor: float = quantity()
    original_max_position_embeddings: int = quantity(integer=True)
    low_freq_factor: float | None = quantity(optional=True)  # llama3
    high_freq_factor: float | None = quantity(optional=True)  # llama3
    beta_fast: float | None = quantity(optional=True)  # yarn
    beta_slow: float | None = quantity(optional=True)  # yarn
    mscale: float | None = quantity(optional=True)  # yarn (DeepSeek)
    mscale_all_dim: float | None = quantity(optional=True)  # yarn (DeepSeek)
    truncate: bool | None = None  # yarn (gpt-oss: false)

    def __post_init__(self):
        needed = {"llama3": ("low_freq_factor", "high_freq_factor"), "yarn": ()}[self.type]
        for name in needed:
            if getattr(self, name) is None:
                raise ConfigError(name, f"is required for rope scaling type {self.type!r}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class VisionTower:
    """A MoonViT-style vision encoder and its projector (Kimi K2.5; Kimi-VL's ``modeling_kimi_vl.py``).

    ViT blocks: LayerNorm (weight+bias) -> fused qkv with bias -> output projection with bias -> LayerNorm -> GELU MLP
    ``hidden -> intermediate -> hidden`` with biases. Patch embedding: a ``patch_size`` convolution with bias over
    ``in_channels``; ``pos_emb_grid`` (height, width) of learned position embeddings. After a final LayerNorm,
    ``merge_size x merge_size`` patches are concatenated and projected: LayerNorm(hidden) -> Linear(hidden *
    merge_size^2 -> projector_hidden_size) -> GELU -> Linear(-> projector_output_size), both with bias.
    """
    num_layers: int = quantity(integer=True)
    hidden_size: int = quantity(integer=True)
    intermediate_size: int = quantity(integer=True)
    num_heads: int = quantity(integer=True)
    patch_size: int = quantity(integer=True)
    merge_size: int = quantity(integer=True)
    projector_hidden_size: int = quantity(integer=True)
    projector_output_size: int = quantity(integer=True)
    in_channels: int = quantity(integer=True, default=3)
    pos_emb_grid: tuple[int, int] | None = None

    def __post_init__(self):
        if self.hidden_size % self.num_heads:
            raise ConfigError("num_heads", f"must divide hidden_size ({self.hidden_size}), got {self.num_heads}")
        if self.pos_emb_grid is not None and min(self.pos_emb_grid) <= 0:
            raise ConfigError("pos_emb_grid", f"must be two positive sizes, got {list(self.pos_emb_grid)}")

    def param_count(self) -> int:
        h, m = self.hidden_size, self.intermediate_size
        block = (2 * 2 * h  # two LayerNorms, weight + bias
                 + 3 * h * h + 3 * h  # fused qkv + bias
                 + h * h + h  # output projection + bias
                 + h * m + m + m * h + h)  # MLP fc0, fc1 with biases
        patch_embed = self.in_channels * self.patch_size ** 2 * h + h
        pos_emb = self.pos_emb_grid[0] * self.pos_emb_grid[1] * h if self.pos_emb_grid else 0
        merged = h * self.merge_size ** 2
        projector = (2 * h  # pre-norm LayerNorm
                     + merged * self.projector_hidden_size + self.projector_hidden_size
                     + self.projector_hidden_size * self.projector_output_size + self.projector_output_size)
        return self.num_layers * block + patch_embed + pos_emb + 2 * h + projector


@dataclasses.dataclass(frozen=True, kw_only=True)
class Published:
    """The publisher's own size figures (the oracle a count from the config is checked against)."""
    total_params: float = quantity()  # excludes MTP, includes any vision tower
    active_params: float = quantity()
    active_counts_input_embedding: bool  # whether active_params includes the input embedding table
    source: str
    mtp_params: float | None = quantity(optional=True)

    def __post_init__(self):
        if self.active_params > self.total_params:
            raise ConfigError("active_params",
                              f"exceeds total_params ({self.total_params:g}), got {self.active_params:g}")
        if not self.source.strip():
            raise ConfigError("source", "a published figure needs its source")


@dataclasses.dataclass(frozen=True)
class LayerKind:
    attention: str  # full / sliding / chunked
    rope: bool  # whether the layer applies RoPE (Llama 4's global layers do not)
    ffn: str  # dense / moe
