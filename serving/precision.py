"""Precision recipes: the storage dtype of each tensor class, the math dtype it is computed in, and the KV cache.

A recipe says, per tensor class (attention, dense FFN, routed experts, shared experts, embeddings / lm_head), which
format the weights are stored in and which math rate the matmul runs at. Storage formats count their block scales
in the bytes (OCP Microscaling spec v1.0 for MXFP4: 32-element blocks sharing an 8-bit E8M0 scale = 4.25 bits per
weight; NVIDIA NVFP4: 16-element blocks with an FP8 E4M3 scale = 4.5 bits; W4A16 INT4 with group 32 and a BF16
scale = 4.5 bits; DeepSeek-V3 FP8 with one FP32 scale per 128 x 128 block = 8 + 32/16384 bits).

On a chip without native math in a dtype the math runs at the next supported rate (``Chip.math_rate``); the weights
still move in their stored size, which is the whole point of weight-only quantisation on bandwidth-bound decode.
"""

from __future__ import annotations

import dataclasses

from arch_space.errors import ConfigError
from arch_space.validation import build, choice

TENSOR_CLASSES = ("attention", "dense_ffn", "routed_experts", "shared_experts", "embeddings")
STORAGE_FORMATS = ("bf16", "fp8", "int8", "mxfp4", "nvfp4", "int4", "fp32")
MATH_DTYPES = ("bf16", "fp8", "int8", "fp4")

# Bits per stored element, scales included (sources in the module docstring).
BITS_PER_ELEMENT = {
    "bf16": 16.0,
    "fp8": 8.0 + 32.0 / (128 * 128),
    "int8": 8.0,
    "mxfp4": 4.0 + 8.0 / 32,
    "nvfp4": 4.0 + 8.0 / 16,
    "int4": 4.0 + 16.0 / 32,
    "fp32": 32.0,  # IEEE float32, no scales (codesign.execute runs the models in float32 on CPUs)
}
ACTIVATION_BYTES = {"bf16": 2.0, "fp8": 1.0, "fp32": 4.0}

# Parameter class (ModelArchitecture.param_counts / the graph's tensor classes) -> the recipe class that sets its
# storage and math dtype. Routers, norms and the vision tower follow the attention recipe; the MTP head the experts'.
RECIPE_CLASS = {
    "attention": "attention", "dense_ffn": "dense_ffn", "routed_experts": "routed_experts",
    "shared_experts": "shared_experts", "router": "attention", "norms": "attention",
    "embedding": "embeddings", "lm_head": "embeddings", "vision": "attention", "mtp": "routed_experts",
}
KV_BYTES = {"bf16": 2.0, "fp8": 1.0, "fp4": 0.5 + 1.0 / 16, "fp32": 4.0}
# A token sent to experts whose GEMMs take quantised activations travels quantised: FP8 with one FP32 scale per 128
# channels (DeepSeek-V3 report, arXiv 2412.19437, sec. 3.3.2: activations quantised to FP8 before the dispatch,
# 1 x 128 tile scales; DeepEP's dispatch kernels take FP8). The combine returns the experts' outputs unquantised.
# FP4 expert math dispatches FP8 too: DeepEP has no FP4 dispatch (an engine that sends NVFP4 would move ~0.56 B).
DISPATCH_BYTES_QUANTISED = 1.0 + 4.0 / 128


@dataclasses.dataclass(frozen=True)
class TensorPrecision:
    weights: str = choice(STORAGE_FORMATS)
    math: str = choice(MATH_DTYPES)

    @property
    def bytes_per_weight(self) -> float:
        return BITS_PER_ELEMENT[self.weights] / 8.0


@dataclasses.dataclass(frozen=True)
class Precision:
    name: str
    attention: TensorPrecision
    dense_ffn: TensorPrecision
    routed_experts: TensorPrecision
    shared_experts: TensorPrecision
    embeddings: TensorPrecision
    activations: str = choice(tuple(ACTIVATION_BYTES))
    kv_cache: str = choice(tuple(KV_BYTES))
    # The attention core's math dtype (scores and values), where it differs from what the attention recipe implies
    # (``attention_core_math``). null: the engines' practice as modelled. A value is a what-if for a serving stack
    # that quantises Q, K and V itself: FP8 (FlashAttention-3's FP8 forward, Shah et al. 2024), INT8 (SageAttention,
    # Zhang et al. 2024) or FP4 (SageAttention3's microscaling FP4 attention, Zhang et al. 2025).
    attention_core: str | None = choice(MATH_DTYPES + (None,), default=None)
    description: str = ""
    # Per-model refinements of this recipe, keyed by workload name: partial mappings of the fields above. The
    # published checkpoints differ (gpt-oss ships MXFP4 experts with BF16 attention; NVIDIA's FP4 Llama
    # checkpoints are NVFP4; Kimi K2.5 is INT4 W4A16 on routed experts only), so "fp4" means the FP4 serving
    # recipe *of that model*. :meth:`for_workload` applies them.
    per_model: dict[str, dict] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_dict(cls, data, path: str = "precision") -> "Precision":
        recipe = build(cls, data, path)
        for model, over in recipe.per_model.items():
            if not isinstance(over, dict):
                raise ConfigError(f"{path}.per_model.{model}", f"expected a mapping of overrides, got {over!r}")
            for key in over:
                if key in ("name", "description", "per_model") or key not in {f.name for f in dataclasses.fields(cls)}:
                    raise ConfigError(f"{path}.per_model.{model}.{key}", "unknown recipe field")
            recipe._merged(model, path)  # validate now, not when first used
        for tc in TENSOR_CLASSES:
            tp = getattr(recipe, tc)
            if tp.weights in ("mxfp4", "nvfp4") and tp.math not in ("fp4", "fp8", "bf16"):
                raise ConfigError(f"{path}.{tc}.math", f"FP4 weights cannot be computed in {tp.math!r}")
        return recipe

    def _merged(self, model: str, path: str = "precision") -> "Precision":
        over = self.per_model.get(model, {})
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "per_model"}
        for key, value in over.items():
            if key in TENSOR_CLASSES:
                base = dataclasses.asdict(data[key])
                if not isinstance(value, dict):
                    raise ConfigError(f"{path}.per_model.{model}.{key}", f"expected a mapping, got {value!r}")
                data[key] = base | value
            else:
                data[key] = value
        data = {k: dataclasses.asdict(v) if isinstance(v, TensorPrecision) else v for k, v in data.items()}
        try:
            return build(type(self), data, f"{path}.per_model.{model}")
        except ConfigError:
            raise

    def for_workload(self, model: str) -> "Precision":
        """This recipe as it applies to workload ``model`` (its per-model refinements applied)."""
        return self._merged(model) if model in self.per_model else self

    def of(self, tensor_class: str) -> TensorPrecision:
        if tensor_class not in TENSOR_CLASSES:
            raise ConfigError("tensor_class", f"unknown tensor class {tensor_class!r}")
        return getattr(self, tensor_class)

    @property
    def attention_core_math(self) -> str:
        """The math dtype of the attention core (scores and values, activation x activation): the attention recipe's,
        but not narrower than FP8. Serving engines' fused attention kernels (FlashAttention-3, TensorRT-LLM's FMHA
        and XQA, FlashInfer) run FP8 Q/K/V at the narrowest; an FP4 attention recipe (NVIDIA's NVFP4 Llama
        checkpoints) quantises the projection weights, and the attention itself runs on the FP8 KV cache.
        ``attention_core``, where set, overrides this."""
        if self.attention_core is not None:
            return self.attention_core
        return "fp8" if self.attention.math == "fp4" else self.attention.math

    @property
    def kv_bytes_per_element(self) -> float:
        return KV_BYTES[self.kv_cache]

    @property
    def activation_bytes(self) -> float:
        return ACTIVATION_BYTES[self.activations]

    @property
    def dispatch_bytes(self) -> float:
        """Bytes per element of a token dispatched to the routed experts by EP all-to-all (the combine moves
        ``activation_bytes``): quantised to FP8 where the experts compute in FP8 or narrower (or INT8), else the
        activations' own size (W4A16 and BF16 experts dequantise weights, not activations)."""
        if self.routed_experts.math in ("fp8", "fp4", "int8"):
            return min(DISPATCH_BYTES_QUANTISED, self.activation_bytes)
        return self.activation_bytes
