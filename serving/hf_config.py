"""Model architectures from Hugging Face ``config.json`` files: the keys of each supported ``architectures`` entry
mapped onto :class:`serving.architecture.ModelArchitecture`'s fields, every field remembering the key it came from so
that an error names the file and the config key (``ModelArchitecture.from_hf_config`` and ``hf_config=`` of the
commands land here)."""

from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Any

from arch_space.errors import ConfigError
from serving.architecture import ROPE_SCALING_TYPES, ModelArchitecture, RopeScaling

_GQA_ARCHS = ("LlamaForCausalLM", "GptOssForCausalLM", "Qwen3MoeForCausalLM", "Llama4ForConditionalGeneration",
              "Llama4ForCausalLM")
_MLA_ARCHS = ("DeepseekV3ForCausalLM", "KimiK25ForConditionalGeneration")
SUPPORTED_HF_ARCHITECTURES = _GQA_ARCHS + _MLA_ARCHS


class _HF:
    """Reads keys of one (possibly nested) config mapping; records which HF key each field came from."""

    def __init__(self, file: str, data: dict, prefix: str = ""):
        self.file, self.data, self.prefix = file, data, prefix
        self.origin: dict[str, str] = {}
        self.fields: dict[str, Any] = {}

    def error(self, key: str, message: str) -> ConfigError:
        return ConfigError(f"{self.file}: {self.prefix}{key}", message)

    def get(self, key: str, default=dataclasses.MISSING):
        value = self.data.get(key)
        if value is None:
            if default is dataclasses.MISSING:
                raise self.error(key, "missing")
            return default
        return value

    def put(self, field: str, key: str, default=dataclasses.MISSING):
        self.fields[field] = self.get(key, default)
        self.origin[field] = self.prefix + key
        return self.fields[field]

    def set(self, field: str, value, key: str):
        self.fields[field] = value
        self.origin[field] = self.prefix + key

    def sub(self, key: str) -> "_HF":
        value = self.get(key)
        if not isinstance(value, dict):
            raise self.error(key, f"expected a mapping, got {value!r}")
        child = _HF(self.file, value, f"{self.prefix}{key}.")
        child.origin, child.fields = self.origin, self.fields  # one flat result for the whole file
        return child

    def unsupported(self, key: str, value, why: str) -> ConfigError:
        return self.error(key, f"unsupported {value!r} ({why})")


def _period(values: list) -> tuple:
    """Shortest repeating prefix of ``values`` (the whole list if it does not repeat)."""
    for p in range(1, len(values) + 1):
        if all(values[i] == values[i % p] for i in range(len(values))):
            return tuple(values[:p])
    return tuple(values)


def _attention_pattern(r: _HF, types: list, kinds: dict) -> None:
    """``attention_pattern`` from HF ``layer_types`` (one entry per layer), mapped through ``kinds``; an entry
    outside ``kinds`` is an error naming its index."""
    for i, t in enumerate(types):
        if t not in kinds:
            raise r.unsupported(f"layer_types[{i}]", t, f"supported: {', '.join(kinds)}")
    r.set("attention_pattern", list(_period([kinds[t] for t in types])), "layer_types")


def _rope(r: _HF):
    if r.data.get("rope_theta") is None and isinstance(r.data.get("rope_parameters"), dict):
        r.set("rope_theta", r.data["rope_parameters"].get("rope_theta"), "rope_parameters.rope_theta")
    elif r.data.get("rope_theta") is not None or r.data.get("model_type") != "llama":
        r.put("rope_theta", "rope_theta")
    else:
        r.set("rope_theta", 10000.0, "rope_theta")  # LlamaConfig default (Llama 2 configs omit it)
    scaling = r.data.get("rope_scaling")
    if not scaling:
        return
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind in (None, "default"):
        return
    if kind not in ROPE_SCALING_TYPES:
        raise r.unsupported("rope_scaling.rope_type", kind, f"supported: {', '.join(ROPE_SCALING_TYPES)}")
    keys = [f.name for f in dataclasses.fields(RopeScaling) if f.name != "type"]
    r.set("rope_scaling", {"type": kind} | {k: scaling[k] for k in keys if scaling.get(k) is not None}, "rope_scaling")


def _trunk(r: _HF):
    r.put("num_layers", "num_hidden_layers")
    r.put("hidden_size", "hidden_size")
    r.put("vocab_size", "vocab_size")
    r.put("num_attention_heads", "num_attention_heads")
    r.put("norm_eps", "rms_norm_eps")
    r.put("max_position_embeddings", "max_position_embeddings")
    _rope(r)


def _gqa_attention(r: _HF):
    heads = r.fields["num_attention_heads"]
    r.put("num_kv_heads", "num_key_value_heads", heads)
    r.put("head_dim", "head_dim", r.fields["hidden_size"] // heads if isinstance(heads, int) and heads else None)
    bias = r.get("attention_bias", False)
    r.set("attention_bias", bias, "attention_bias")
    r.set("o_bias", bias, "attention_bias")  # transformers uses attention_bias for o_proj too


def _llama(r: _HF):
    _trunk(r)
    _gqa_attention(r)
    r.put("intermediate_size", "intermediate_size")
    if r.get("mlp_bias", False):
        raise r.unsupported("mlp_bias", True, "FFN biases are not modelled")


def _gpt_oss(r: _HF):
    _trunk(r)
    _gqa_attention(r)
    r.set("attention_sinks", True, "architectures")  # GptOssAttention.sinks, one per head
    n = r.fields["num_layers"]
    default_types = ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(n)]
    types = r.get("layer_types", default_types)
    _attention_pattern(r, types, {"sliding_attention": "sliding", "full_attention": "full"})
    if "sliding" in r.fields["attention_pattern"]:
        r.put("sliding_window", "sliding_window")
    r.put("num_experts", "num_local_experts")
    r.put("experts_per_token", "num_experts_per_tok")
    r.put("expert_intermediate_size", "intermediate_size")
    r.put("swiglu_limit", "swiglu_limit")
    # GptOssExperts: gate_up_proj/down_proj with biases; GptOssTopKRouter: linear with bias, softmax over the top-k
    r.set("expert_bias", True, "architectures")
    r.set("router", "topk_softmax", "architectures")
    r.set("router_bias", True, "architectures")


def _qwen3_moe(r: _HF):
    _trunk(r)
    _gqa_attention(r)
    r.set("qk_norm", "rmsnorm", "architectures")  # Qwen3MoeAttention q_norm / k_norm
    if r.get("use_sliding_window", False):
        raise r.unsupported("use_sliding_window", True, "Qwen3 sliding-window layers are not modelled")
    if r.get("mlp_only_layers", []):
        raise r.unsupported("mlp_only_layers", r.get("mlp_only_layers"), "only an empty list is supported")
    r.put("intermediate_size", "intermediate_size")
    r.put("num_experts", "num_experts")
    r.put("experts_per_token", "num_experts_per_tok")
    r.put("expert_intermediate_size", "moe_intermediate_size")
    r.put("moe_layer_step", "decoder_sparse_step", 1)
    r.set("router", "softmax_topk", "architectures")
    r.put("router_normalize_topk", "norm_topk_prob", False)


def _llama4(r: _HF):
    _trunk(r)
    _gqa_attention(r)
    r.set("qk_norm", "l2" if r.get("use_qk_norm", False) else "none", "use_qk_norm")
    n = r.fields["num_layers"]
    # Llama4TextConfig: no_rope_layers[i] == 1 means layer i *uses* RoPE (and chunked attention); default: every
    # no_rope_layer_interval-th layer is a global NoPE layer.
    interval = r.get("no_rope_layer_interval", 4)
    rope = r.get("no_rope_layers", None) or [int((i + 1) % interval != 0) for i in range(n)]
    types = r.get("layer_types", None) or ["chunked_attention" if x else "full_attention" for x in rope]
    _attention_pattern(r, types, {"chunked_attention": "chunked", "full_attention": "full"})
    r.set("rope_pattern", list(_period([bool(x) for x in rope])), "no_rope_layers")
    if "chunked" in r.fields["attention_pattern"]:
        r.put("attention_chunk_size", "attention_chunk_size")
    r.put("intermediate_size", "intermediate_size_mlp")
    r.put("num_experts", "num_local_experts")
    r.put("experts_per_token", "num_experts_per_tok")
    r.put("expert_intermediate_size", "intermediate_size")
    r.set("num_shared_experts", 1, "architectures")  # Llama4TextMoe.shared_expert
    r.put("shared_expert_intermediate_size", "intermediate_size")
    step = r.put("moe_layer_step", "interleave_moe_layer_step", 1)
    listed = r.get("moe_layers", None)
    if listed is not None and isinstance(step, int) and step > 0 and list(listed) != list(range(step - 1, n, step)):
        raise r.unsupported("moe_layers", listed, f"only every interleave_moe_layer_step-th layer ({step})")
    r.set("router", "topk_sigmoid", "architectures")


def _deepseek_v3(r: _HF):
    _trunk(r)
    r.set("family", "mla", "architectures")
    if r.get("attention_bias", False):
        raise r.unsupported("attention_bias", True, "MLA projections without bias only")
    r.put("q_lora_rank", "q_lora_rank", None)  # null: a plain q_proj (DeepSeek-V2-Lite)
    for f in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
        r.put(f, f)
    r.put("intermediate_size", "intermediate_size")
    r.put("num_experts", "n_routed_experts")
    r.put("experts_per_token", "num_experts_per_tok")
    r.put("expert_intermediate_size", "moe_intermediate_size")
    shared = r.put("num_shared_experts", "n_shared_experts", 0)
    if shared:
        r.put("shared_expert_intermediate_size", "moe_intermediate_size")  # DeepseekV3MLP(moe_inter * n_shared)
    r.put("first_k_dense_layers", "first_k_dense_replace", 0)
    if r.get("moe_layer_freq", 1) != 1:
        raise r.unsupported("moe_layer_freq", r.get("moe_layer_freq"), "only 1")
    scoring, method = r.get("scoring_func", "sigmoid"), r.get("topk_method", "noaux_tc")
    if (scoring, method) != ("sigmoid", "noaux_tc"):
        raise r.unsupported("topk_method", f"{scoring}/{method}", "only sigmoid scoring with noaux_tc")
    r.set("router", "sigmoid_grouped", "scoring_func")
    r.set("router_score_correction_bias", True, "topk_method")  # gate.e_score_correction_bias
    r.put("router_normalize_topk", "norm_topk_prob", False)
    r.put("n_group", "n_group")
    r.put("topk_group", "topk_group")
    r.put("routed_scaling_factor", "routed_scaling_factor", 1.0)
    r.put("num_mtp_layers", "num_nextn_predict_layers", 0)


def _kimi_vision(r: _HF, text_hidden):
    def pick(*keys, default=dataclasses.MISSING):
        """The first of ``keys`` present (K2.5 spells the ViT sizes ``vt_*``, Kimi-VL without the prefix)."""
        for k in keys:
            if r.data.get(k) is not None:
                return r.data[k], k
        if default is not dataclasses.MISSING:
            return default, keys[0]
        raise r.error(keys[0], "missing")

    vision = {}
    for field, keys in (("num_layers", ("vt_num_hidden_layers", "num_hidden_layers")),
                        ("hidden_size", ("vt_hidden_size", "hidden_size")),
                        ("intermediate_size", ("vt_intermediate_size", "intermediate_size")),
                        ("num_heads", ("vt_num_attention_heads", "num_attention_heads")),
                        ("patch_size", ("patch_size",))):
        vision[field], _ = pick(*keys)
    merge, _ = pick("merge_kernel_size")
    if not isinstance(merge, list) or len(merge) != 2 or merge[0] != merge[1]:
        raise r.unsupported("merge_kernel_size", merge, "only a square [k, k] merge")
    vision["merge_size"] = merge[0]
    if r.data.get("init_pos_emb_height") is not None:
        vision["pos_emb_grid"] = [r.get("init_pos_emb_height"), r.get("init_pos_emb_width")]
    if isinstance(vision["hidden_size"], int):
        vision["projector_hidden_size"] = vision["hidden_size"] * merge[0] * merge[1]  # KimiVL projector
    vision["projector_output_size"], _ = pick("text_hidden_size", default=text_hidden)
    r.set("vision", vision, "vision_config")


def from_hf_config(path, name: str | None = None) -> ModelArchitecture:
    """Build a :class:`ModelArchitecture` from a Hugging Face ``config.json``.

    Supported ``architectures``: SUPPORTED_HF_ARCHITECTURES (Llama 4 and Kimi K2.5 nest the text model in
    ``text_config``; Kimi K2.5's ``vision_config`` becomes :class:`VisionTower`; Llama 4's vision encoder is not
    modelled). ``name`` defaults to the file's stem (its folder's name for ``config.json``). The result has no
    ``published`` block. Errors are one line naming the file and the config key.
    """
    p = pathlib.Path(path)
    file = str(path)
    try:
        data = json.loads(p.read_text())
    except OSError as err:
        raise ConfigError(file, f"cannot read: {err.strerror or err}") from None
    except json.JSONDecodeError as err:
        raise ConfigError(file, f"not valid JSON: {err.msg} (line {err.lineno})") from None
    if not isinstance(data, dict):
        raise ConfigError(file, "expected a JSON object")
    top = _HF(file, data)
    archs = top.get("architectures")
    arch = archs[0] if isinstance(archs, list) and archs else archs
    if arch not in SUPPORTED_HF_ARCHITECTURES:
        raise top.error("architectures", f"unsupported {arch!r} (supported: {', '.join(SUPPORTED_HF_ARCHITECTURES)})")
    nested = arch in ("Llama4ForConditionalGeneration", "KimiK25ForConditionalGeneration") or (
        arch == "Llama4ForCausalLM" and "text_config" in data)
    r = top.sub("text_config") if nested else top
    r.set("name", name or (p.parent.name if p.name == "config.json" else p.stem), "name")
    r.set("family", "gqa", "architectures")
    r.put("tie_word_embeddings", "tie_word_embeddings", data.get("tie_word_embeddings", False))
    {"LlamaForCausalLM": _llama, "GptOssForCausalLM": _gpt_oss, "Qwen3MoeForCausalLM": _qwen3_moe,
     "Llama4ForConditionalGeneration": _llama4, "Llama4ForCausalLM": _llama4,
     "DeepseekV3ForCausalLM": _deepseek_v3, "KimiK25ForConditionalGeneration": _deepseek_v3}[arch](r)
    if arch == "KimiK25ForConditionalGeneration":
        v = top.sub("vision_config")
        _kimi_vision(v, r.fields.get("hidden_size"))
    quant = r.data.get("quantization_config") or data.get("quantization_config")
    dtype = r.data.get("torch_dtype") or data.get("torch_dtype") or data.get("dtype") or "unknown dtype"
    if isinstance(quant, dict):
        method = quant.get("quant_method", "quantized")
        detail = " ".join(str(quant[k]) for k in ("fmt", "format") if quant.get(k))
        r.set("native_format", f"{method}{' ' + detail if detail else ''} (quantization_config); {dtype} elsewhere",
              "quantization_config")
    else:
        r.set("native_format", str(dtype), "torch_dtype")
    try:
        return ModelArchitecture.from_dict(r.fields, path="")
    except ConfigError as err:
        field = err.path.split(".")[0].split("[")[0]
        raise ConfigError(f"{file}: {r.origin.get(field, err.path)}", err.detail) from None
