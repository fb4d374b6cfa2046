"""One LLM's published architecture, and the sizes derived from it (parameters, KV cache, attention FLOPs).

:class:`ModelArchitecture` holds the numbers of a model's published configuration (Hugging Face ``config.json``,
the authors' reference code) for two families:

- ``gqa``: grouped-query attention transformers, dense or MoE (Llama 2/3, gpt-oss, Qwen3 MoE, Llama 4 Maverick);
- ``mla``: DeepSeek-V3-style multi-head latent attention with MoE (DeepSeek-R1/V3, Kimi K2.5).

Everything else (parameter counts by tensor class, KV cache sizes, attention FLOPs, which layers are MoE) is derived
on demand from those fields; nothing derived is stored. Configs arrive either as the ``workload`` config group
(``conf/workload/NAME.yaml``, via :meth:`ModelArchitecture.from_dict`) or straight from a Hugging Face
``config.json`` (:meth:`ModelArchitecture.from_hf_config`).

Conventions:

- Every linear layer is counted as its weight matrix plus its bias where the model has one. FFNs are SwiGLU
  (gate, up, down: ``3 x hidden x width``). Norms of the text model are RMSNorm (one weight vector, no bias).
- Layer ``i`` (0-based) is MoE when the model has experts, ``i >= first_k_dense_layers`` and
  ``(i + 1) % moe_layer_step == 0`` (the rule of transformers' Qwen3-MoE ``decoder_sparse_step`` and Llama 4
  ``interleave_moe_layer_step``; with step 1 it is DeepSeek's ``first_k_dense_replace``).
- ``attention_pattern`` and ``rope_pattern`` repeat over the layers: layer ``i`` has kind
  ``attention_pattern[i % len(attention_pattern)]`` (gpt-oss ``[sliding, full]``: even layers sliding; Llama 4
  ``[chunked, chunked, chunked, full]`` with ``rope_pattern [true, true, true, false]``: every 4th layer global
  and without RoPE).
- Active parameters: see :meth:`ModelArchitecture.active_params`. ``active_params_per_token`` counts what one
  decoded token multiplies by: attention, dense FFNs, the ``experts_per_token`` routed experts and the shared
  experts of every MoE layer, routers, norms and the lm_head, but *not* the input embedding (a row gather, no
  FLOPs), nor the MTP head or the vision tower. So ``decode FLOPs/token = 2 x active_params_per_token +
  decode_attention_flops_per_token(context)``. Publishers differ on the input embedding: OpenAI's gpt-oss
  figures exclude it (5.13B = experts 3.58B + attention 0.96B + unembedding 0.58B), Qwen, Meta and Moonshot
  include it (Qwen3-30B-A3B's 3.3B is only reached with both embedding tables).
  ``published.active_counts_input_embedding`` records which convention the published figure uses, and
  ``active_params(include_input_embedding=...)`` gives either.
- KV cache: one sequence of ``context_len`` tokens keeps, per layer, ``min(context_len, window)`` entries on
  sliding-window layers and ``min(context_len, chunk)`` on chunked-attention layers (the bound reached at the
  last token of a chunk). ``kv_cache_bytes_per_token`` is the marginal growth per extra token at long context,
  i.e. full-attention layers only. The MTP layer's own cache (used only by speculative decoding) is not counted.
"""

from __future__ import annotations

import dataclasses

from arch_space.errors import ConfigError
from arch_space.validation import build, choice, quantity
from serving.architecture_parts import LayerKind, Published, RopeScaling, VisionTower

FAMILIES = ("gqa", "mla")
ATTENTION_KINDS = ("full", "sliding", "chunked")
FFN_KINDS = ("dense", "moe")
# softmax_topk: softmax over all experts, then top-k (Qwen3 MoE; renormalised when router_normalize_topk).
# topk_softmax: top-k of the logits, softmax over the k (gpt-oss).   topk_sigmoid: top-k, sigmoid of the k (Llama 4).
# sigmoid_grouped: sigmoid scores + per-expert correction bias, top-k within the topk_group best of n_group groups,
#   normalised and scaled by routed_scaling_factor (DeepSeek-V3 "noaux_tc"; Kimi K2 uses a single group).
ROUTERS = ("none", "softmax_topk", "topk_softmax", "topk_sigmoid", "sigmoid_grouped")
QK_NORMS = ("none", "rmsnorm", "l2")  # rmsnorm: learned per-head_dim weight (Qwen3); l2: weightless (Llama 4 Scout)
PARAM_CLASSES = ("embedding", "lm_head", "attention", "dense_ffn", "routed_experts", "shared_experts", "router",
                 "norms", "mtp", "vision")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelArchitecture:
    # --- identity and trunk
    name: str
    family: str = choice(FAMILIES)
    num_layers: int = quantity(integer=True)
    hidden_size: int = quantity(integer=True)
    vocab_size: int = quantity(integer=True)
    tie_word_embeddings: bool = False
    norm_eps: float = quantity()
    max_position_embeddings: int = quantity(integer=True)
    rope_theta: float = quantity()
    rope_scaling: RopeScaling | None = None
    native_format: str = ""  # the checkpoint's weight format, as published (free text)
    # --- attention (both families)
    num_attention_heads: int = quantity(integer=True)
    attention_pattern: tuple[str, ...] = ("full",)
    rope_pattern: tuple[bool, ...] = (True,)
    sliding_window: int | None = quantity(optional=True, integer=True)  # tokens, on "sliding" layers
    attention_chunk_size: int | None = quantity(optional=True, integer=True)  # tokens, on "chunked" layers
    attention_sinks: bool = False  # one learned logit per head (gpt-oss)
    # --- GQA attention
    num_kv_heads: int | None = quantity(optional=True, integer=True)
    head_dim: int | None = quantity(optional=True, integer=True)
    attention_bias: bool = False  # q/k/v projection biases
    o_bias: bool = False  # output projection bias
    qk_norm: str = choice(QK_NORMS, default="none")
    # --- MLA attention (q_lora_rank null: a plain q projection, as DeepSeek-V2-Lite)
    q_lora_rank: int | None = quantity(optional=True, integer=True)
    kv_lora_rank: int | None = quantity(optional=True, integer=True)
    qk_nope_head_dim: int | None = quantity(optional=True, integer=True)
    qk_rope_head_dim: int | None = quantity(optional=True, integer=True)
    v_head_dim: int | None = quantity(optional=True, integer=True)
    # --- FFN
    intermediate_size: int | None = quantity(optional=True, integer=True)  # dense FFN width
    num_experts: int = quantity(integer=True, allow_zero=True, default=0)  # routed experts per MoE layer
    experts_per_token: int = quantity(integer=True, allow_zero=True, default=0)
    expert_intermediate_size: int | None = quantity(optional=True, integer=True)
    num_shared_experts: int = quantity(integer=True, allow_zero=True, default=0)
    shared_expert_intermediate_size: int | None = quantity(optional=True, integer=True)  # per shared expert
    first_k_dense_layers: int = quantity(integer=True, allow_zero=True, default=0)
    moe_layer_step: int = quantity(integer=True, default=1)
    expert_bias: bool = False  # biases on the routed experts' linear layers (gpt-oss)
    swiglu_limit: float | None = quantity(optional=True)  # gpt-oss clamped SwiGLU (7.0)
    # --- router
    router: str = choice(ROUTERS, default="none")
    router_bias: bool = False  # bias of the router linear layer (gpt-oss)
    router_score_correction_bias: bool = False  # per-expert selection bias (DeepSeek-V3 e_score_correction_bias)
    router_normalize_topk: bool = False  # renormalise the k selected weights to sum 1
    n_group: int | None = quantity(optional=True, integer=True)
    topk_group: int | None = quantity(optional=True, integer=True)
    routed_scaling_factor: float = quantity(default=1.0)
    # --- extras
    num_mtp_layers: int = quantity(integer=True, allow_zero=True, default=0)  # DeepSeek multi-token prediction
    vision: VisionTower | None = None
    published: Published | None = None

    # ------------------------------------------------------------------ construction and cross-field checks
    @classmethod
    def from_dict(cls, data, path: str = "workload") -> "ModelArchitecture":
        return build(cls, data, path)

    @classmethod
    def from_hf_config(cls, path, name: str | None = None) -> "ModelArchitecture":
        """Build from a Hugging Face ``config.json`` (see :func:`serving.hf_config.from_hf_config`)."""
        from serving.hf_config import from_hf_config

        return from_hf_config(path, name)

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name.strip():
            raise ConfigError("name", f"expected a non-empty string, got {self.name!r}")
        self._check_attention()
        self._check_ffn()
        if self.vision is not None and self.vision.projector_output_size != self.hidden_size:
            raise ConfigError("vision.projector_output_size",
                              f"must equal hidden_size ({self.hidden_size}), got {self.vision.projector_output_size}")

    def _check_attention(self):
        gqa_fields = ("num_kv_heads", "head_dim")
        mla_fields = ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
        own, other = (gqa_fields, mla_fields + ("q_lora_rank",)) if self.family == "gqa" else (mla_fields, gqa_fields)
        for f in own:
            if getattr(self, f) is None:
                raise ConfigError(f, f"is required for family {self.family!r}")
        for f in other:
            if getattr(self, f) is not None:
                raise ConfigError(f, f"does not apply to family {self.family!r}, got {getattr(self, f)!r}")
        if self.family == "gqa" and self.num_attention_heads % self.num_kv_heads:
            raise ConfigError("num_kv_heads",
                              f"must divide num_attention_heads ({self.num_attention_heads}), got {self.num_kv_heads}")
        if self.family == "mla":
            for f, off in (("attention_bias", False), ("o_bias", False), ("qk_norm", "none"),
                           ("attention_sinks", False)):
                if getattr(self, f) != off:
                    raise ConfigError(f, f"is not modelled for MLA attention, got {getattr(self, f)!r}")
        for key, pattern, kinds in (("attention_pattern", self.attention_pattern, ATTENTION_KINDS),
                                    ("rope_pattern", self.rope_pattern, (True, False))):
            if not pattern:
                raise ConfigError(key, "must list at least one layer")
            for i, v in enumerate(pattern):
                if v not in kinds:
                    raise ConfigError(f"{key}[{i}]", f"must be one of {', '.join(map(str, kinds))}, got {v!r}")
        for kind, field in (("sliding", "sliding_window"), ("chunked", "attention_chunk_size")):
            used = kind in self.attention_pattern
            if used and getattr(self, field) is None:
                raise ConfigError(field, f"is required when attention_pattern has {kind!r} layers")
            if not used and getattr(self, field) is not None:
                raise ConfigError(field,
                                  f"is set ({getattr(self, field)}) but no layer of attention_pattern is {kind!r}")

    def _check_ffn(self):
        if self.num_experts == 0:
            for f in ("experts_per_token", "num_shared_experts"):
                if getattr(self, f):
                    raise ConfigError(f, f"needs routed experts (num_experts is 0), got {getattr(self, f)}")
            if self.router != "none":
                raise ConfigError("router", f"a dense model has no router, got {self.router!r}")
        else:
            if not 1 <= self.experts_per_token <= self.num_experts:
                raise ConfigError("experts_per_token", f"must be between 1 and num_experts ({self.num_experts}), "
                                                       f"got {self.experts_per_token}")
            if self.expert_intermediate_size is None:
                raise ConfigError("expert_intermediate_size", "is required when num_experts > 0")
            if self.router == "none":
                raise ConfigError("router", "an MoE model needs a router (one of "
                                  f"{', '.join(r for r in ROUTERS if r != 'none')})")
            if self.num_moe_layers == 0:
                raise ConfigError("first_k_dense_layers", f"leaves no MoE layer, got {self.first_k_dense_layers}")
        if self.num_shared_experts and self.shared_expert_intermediate_size is None:
            raise ConfigError("shared_expert_intermediate_size", "is required when num_shared_experts > 0")
        if self.num_dense_layers and self.intermediate_size is None:
            raise ConfigError("intermediate_size",
                              f"is required: the model has {self.num_dense_layers} dense FFN layers")
        if self.router == "sigmoid_grouped":
            if self.n_group is None or self.topk_group is None:
                raise ConfigError("n_group" if self.n_group is None else "topk_group",
                                  "is required for router 'sigmoid_grouped'")
            if self.num_experts % self.n_group:
                raise ConfigError("n_group", f"must divide num_experts ({self.num_experts}), got {self.n_group}")
            if self.topk_group > self.n_group:
                raise ConfigError("topk_group", f"must be <= n_group ({self.n_group}), got {self.topk_group}")
            if self.experts_per_token > self.topk_group * (self.num_experts // self.n_group):
                raise ConfigError("experts_per_token",
                                  f"exceeds the experts in topk_group groups, got {self.experts_per_token}")
        elif self.n_group is not None or self.topk_group is not None:
            raise ConfigError("n_group", f"applies to router 'sigmoid_grouped' only (router is {self.router!r})")

    # ------------------------------------------------------------------ layer structure
    def is_moe_layer(self, index: int) -> bool:
        return (self.num_experts > 0 and index >= self.first_k_dense_layers
                and (index + 1) % self.moe_layer_step == 0)

    @property
    def moe_layer_indices(self) -> tuple[int, ...]:
        return tuple(i for i in range(self.num_layers) if self.is_moe_layer(i))

    @property
    def num_moe_layers(self) -> int:
        return len(self.moe_layer_indices)

    @property
    def num_dense_layers(self) -> int:
        return self.num_layers - self.num_moe_layers

    def layer_kinds(self) -> tuple[LayerKind, ...]:
        """Per layer: attention kind, RoPE or not, FFN kind."""
        return tuple(LayerKind(attention=self.attention_pattern[i % len(self.attention_pattern)],
                               rope=self.rope_pattern[i % len(self.rope_pattern)],
                               ffn="moe" if self.is_moe_layer(i) else "dense")
                     for i in range(self.num_layers))

    def num_layers_by_attention(self) -> dict[str, int]:
        counts = dict.fromkeys(ATTENTION_KINDS, 0)
        for kind in self.layer_kinds():
            counts[kind.attention] += 1
        return counts

    # ------------------------------------------------------------------ parameter counts
    def attention_params_per_layer(self) -> int:
        h, heads = self.hidden_size, self.num_attention_heads
        if self.family == "gqa":
            # transformers LlamaAttention / GptOssAttention / Qwen3MoeAttention / Llama4TextAttention
            q, kv = heads * self.head_dim, self.num_kv_heads * self.head_dim
            n = h * q + 2 * h * kv + q * h
            n += (q + 2 * kv) if self.attention_bias else 0
            n += h if self.o_bias else 0
            n += 2 * self.head_dim if self.qk_norm == "rmsnorm" else 0  # q_norm, k_norm over head_dim
            n += heads if self.attention_sinks else 0
            return n
        # MLA (DeepSeek-V3 inference/model.py MLA; README_WEIGHTS.md):
        #   q: q_a_proj h->q_lora, q_a_layernorm, q_b_proj q_lora->heads*(nope+rope)   (or q_proj h->heads*(nope+rope))
        #   kv: kv_a_proj_with_mqa h->kv_lora+rope, kv_a_layernorm, kv_b_proj kv_lora->heads*(nope+v);  o: heads*v->h
        qk = self.qk_nope_head_dim + self.qk_rope_head_dim
        if self.q_lora_rank:
            q_params = h * self.q_lora_rank + self.q_lora_rank + self.q_lora_rank * heads * qk
        else:
            q_params = h * heads * qk
        kv_params = (h * (self.kv_lora_rank + self.qk_rope_head_dim) + self.kv_lora_rank
                     + self.kv_lora_rank * heads * (self.qk_nope_head_dim + self.v_head_dim))
        return q_params + kv_params + heads * self.v_head_dim * h

    def dense_ffn_params_per_layer(self) -> int:
        return 3 * self.hidden_size * self.intermediate_size if self.intermediate_size else 0  # SwiGLU, no bias

    @property
    def expert_params(self) -> int:
        """Parameters of one routed expert in one MoE layer (SwiGLU; gpt-oss adds gate_up and down biases)."""
        if not self.num_experts:
            return 0
        width = self.expert_intermediate_size
        return 3 * self.hidden_size * width + ((2 * width + self.hidden_size) if self.expert_bias else 0)

    def shared_expert_params_per_layer(self) -> int:
        return self.num_shared_experts * 3 * self.hidden_size * (self.shared_expert_intermediate_size or 0)

    def router_params_per_layer(self) -> int:
        n = self.hidden_size * self.num_experts
        n += self.num_experts if self.router_bias else 0
        n += self.num_experts if self.router_score_correction_bias else 0
        return n

    def _layer_params(self, moe: bool) -> dict[str, int]:
        """One decoder layer, all experts resident."""
        out = {"attention": self.attention_params_per_layer(), "norms": 2 * self.hidden_size}
        if moe:
            out |= {"routed_experts": self.num_experts * self.expert_params,
                    "shared_experts": self.shared_expert_params_per_layer(),
                    "router": self.router_params_per_layer()}
        else:
            out["dense_ffn"] = self.dense_ffn_params_per_layer()
        return out

    def mtp_params(self) -> int:
        """DeepSeek-V3 MTP module (README_WEIGHTS.md): one decoder layer like the last main layer, enorm, hnorm,
        eh_proj (2h -> h, no bias) and the shared head's norm; it shares the embedding and the output head."""
        if not self.num_mtp_layers:
            return 0
        h = self.hidden_size
        layer = sum(self._layer_params(self.is_moe_layer(self.num_layers - 1)).values())
        return self.num_mtp_layers * (layer + 2 * h + 2 * h * h + h)

    def param_counts(self) -> dict[str, int]:
        """Resident parameters by tensor class (keys: PARAM_CLASSES; 0 where the model has none)."""
        counts = dict.fromkeys(PARAM_CLASSES, 0)
        counts["embedding"] = self.vocab_size * self.hidden_size
        counts["lm_head"] = 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size
        for i in range(self.num_layers):
            for cls, n in self._layer_params(self.is_moe_layer(i)).items():
                counts[cls] += n
        counts["norms"] += self.hidden_size  # final norm
        counts["mtp"] = self.mtp_params()
        counts["vision"] = self.vision.param_count() if self.vision else 0
        return counts

    @property
    def total_params(self) -> int:
        """All resident parameters except the MTP module (DeepSeek quotes 671B + 11.5B MTP); vision included."""
        counts = self.param_counts()
        return sum(counts.values()) - counts["mtp"]

    def active_param_counts(self) -> dict[str, int]:
        """Parameters one text token's forward pass uses, by tensor class: ``experts_per_token`` routed experts per
        MoE layer, everything else of the trunk. ``embedding`` lists the whole table (so that the sum is the "total
        minus idle experts" convention); ``mtp`` and ``vision`` are 0 (the MTP head only runs for speculative
        decoding, the vision tower once per image)."""
        counts = self.param_counts()
        counts["routed_experts"] = self.num_moe_layers * self.experts_per_token * self.expert_params
        counts["mtp"] = 0
        counts["vision"] = 0
        return counts

    def active_params(self, include_input_embedding: bool = False) -> int:
        """Active parameters per token; by default without the input embedding (see the module docstring)."""
        counts = self.active_param_counts()
        return sum(counts.values()) - (0 if include_input_embedding else counts["embedding"])

    @property
    def active_params_per_token(self) -> int:
        """The compute-relevant count: decode matmul FLOPs per token = 2 x this (lm_head in, input embedding out)."""
        return self.active_params(include_input_embedding=False)

    # ------------------------------------------------------------------ KV cache and attention FLOPs
    @property
    def kv_cache_elements_per_token_per_layer(self) -> int:
        """GQA: K and V, ``2 x kv_heads x head_dim``. MLA: the cached latent plus the shared RoPE key,
        ``kv_lora_rank + qk_rope_head_dim`` (512 + 64 = 576 for DeepSeek-V3; DeepSeek-V2 paper, sec. 2.1.2)."""
        if self.family == "gqa":
            return 2 * self.num_kv_heads * self.head_dim
        return self.kv_lora_rank + self.qk_rope_head_dim

    def _visible(self, attention: str, context_len: int) -> int:
        """Keys one layer holds for a sequence of ``context_len`` tokens."""
        if attention == "sliding":
            return min(context_len, self.sliding_window)
        if attention == "chunked":
            return min(context_len, self.attention_chunk_size)
        return context_len

    @staticmethod
    def _check_context(context_len) -> int:
        if isinstance(context_len, bool) or not isinstance(context_len, int) or context_len < 0:
            raise ConfigError("context_len", f"expected a whole number of tokens >= 0, got {context_len!r}")
        return context_len

    def kv_cache_elements(self, context_len: int) -> int:
        """KV elements kept for one sequence of ``context_len`` tokens, summed over the layers (windows capped)."""
        context_len = self._check_context(context_len)
        per_layer = self.kv_cache_elements_per_token_per_layer
        return sum(per_layer * self._visible(k.attention, context_len) for k in self.layer_kinds())

    def kv_cache_bytes_per_token(self, bytes_per_element: float) -> float:
        """Marginal KV bytes per extra token of context: full-attention layers only (sliding and chunked layers
        stop growing at their window; their bounded part is in :meth:`kv_cache_elements`)."""
        if isinstance(bytes_per_element, bool) or not isinstance(bytes_per_element, (int, float)) \
                or not bytes_per_element > 0:
            raise ConfigError("bytes_per_element", f"must be > 0, got {bytes_per_element!r}")
        full = self.num_layers_by_attention()["full"]
        return full * self.kv_cache_elements_per_token_per_layer * bytes_per_element

    def attention_flops_per_key_per_layer(self) -> int:
        """Score + value FLOPs one decoded token spends per visible key in one layer (2 FLOPs per MAC).

        GQA: q.k over head_dim and p.v over head_dim for each query head: ``2 x 2 x heads x head_dim``
        (sinks add one logit per head, negligible). MLA decodes "absorbed" (DeepSeek-V2 sec. 2.1.3; FlashMLA): W_UK
        is folded into the query and W_UV applied after attention, so every head attends over the cached latent,
        scores over ``kv_lora_rank + qk_rope_head_dim`` (576) and values over ``kv_lora_rank`` (512):
        ``2 x heads x (576 + 512)``. The absorption matmuls themselves are per token, with exactly the kv_b_proj
        parameter count, so they are already in ``2 x active_params_per_token``."""
        if self.family == "gqa":
            return 2 * 2 * self.num_attention_heads * self.head_dim
        score = self.kv_lora_rank + self.qk_rope_head_dim
        return 2 * self.num_attention_heads * (score + self.kv_lora_rank)

    def decode_attention_flops_per_token(self, context_len: int) -> int:
        """Attention score + value FLOPs of one decoded token attending to ``context_len`` keys (itself included),
        summed over layers with windows capped; decode FLOPs/token = 2 x active params + this."""
        context_len = self._check_context(context_len)
        per_key = self.attention_flops_per_key_per_layer()
        return sum(per_key * self._visible(k.attention, context_len) for k in self.layer_kinds())
