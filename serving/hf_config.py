"""Model architectures from Hugging Face ``config.json`` files: the keys of each supported ``architectures`` entry
mapped onto :class:`serving.architecture.ModelArchitecture`'s fields, every field remembering the key it came from so
that an error names the file and the config key (``ModelArchitecture.from_hf_config`` and ``hf_config=`` of the
commands land here).

Every key is read through a typed getter (:meth:`_HF.integer`, :meth:`_HF.count`, :meth:`_HF.number`, :meth:`_HF.flag`,
:meth:`_HF.items`, :meth:`_HF.sub`), so a value of the wrong type (``"hidden_size": "4096"``, ``"rope_scaling":
"llama3"``) is one line naming the key and the value, never a Python error from the arithmetic below."""

from __future__ import annotations

import dataclasses
import json
import pathlib
import re
from typing import Any

from arch_space.errors import ConfigError
from serving.architecture import ModelArchitecture
from serving.architecture_parts import ROPE_SCALING_TYPES, RopeScaling

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

    def path(self, key: str) -> str:
        """The config path of ``key`` (``""``: this mapping itself)."""
        return f"{self.prefix}{key}" if key else self.prefix.rstrip(".")

    def get(self, key: str, default=dataclasses.MISSING):
        """``key``'s value as it is (JSON null counts as absent: ``default``, or an error if there is none)."""
        value = self.data.get(key)
        if value is None:
            if default is dataclasses.MISSING:
                raise self.error(key, "missing")
            return default
        return value

    # Typed getters: an absent (or null) key gives ``default`` unchecked; a present one must have the type.
    def integer(self, key: str, default=dataclasses.MISSING, *, minimum: int = 1):
        """A whole number >= ``minimum`` (an integral float such as ``4096.0`` is taken as the int)."""
        value = self.get(key, default)
        if key not in self.data or self.data[key] is None:
            return value
        return self.whole(key, value, minimum)

    def whole(self, key: str, value, minimum: int = 1) -> int:
        """``value`` (found at ``key``) as a whole number >= ``minimum``, else an error naming ``key``."""
        whole = (isinstance(value, int) and not isinstance(value, bool)) or (
            isinstance(value, float) and value.is_integer())
        if not whole or value < minimum:
            bound = "> 0" if minimum == 1 else f">= {minimum}"
            raise self.error(key, f"expected an integer {bound}, got {value!r}")
        return int(value)

    def count(self, key: str, default=dataclasses.MISSING):
        """A whole number >= 0 (numbers of experts or layers that may be none)."""
        return self.integer(key, default, minimum=0)

    def number(self, key: str, default=dataclasses.MISSING):
        """An int or float (not a bool, not a string); its range is checked by ModelArchitecture."""
        value = self.get(key, default)
        if key in self.data and self.data[key] is not None and (
                isinstance(value, bool) or not isinstance(value, (int, float))):
            raise self.error(key, f"expected a number, got {value!r}")
        return value

    def flag(self, key: str, default=dataclasses.MISSING):
        """JSON true or false (``"no"``, ``0`` are refused rather than read by truthiness)."""
        value = self.get(key, default)
        if key in self.data and self.data[key] is not None and not isinstance(value, bool):
            raise self.error(key, f"expected true or false, got {value!r}")
        return value

    def items(self, key: str, default=dataclasses.MISSING):
        """A JSON array (a string is refused rather than read as a list of its characters)."""
        value = self.get(key, default)
        if key in self.data and self.data[key] is not None and not isinstance(value, list):
            raise self.error(key, f"expected a list, got {value!r}")
        return value

    def put(self, field: str, key: str, read, default=dataclasses.MISSING):
        """Field ``field`` from key ``key``, read with getter ``read`` (one of the typed getters above)."""
        self.set(field, read(key, default), key)
        return self.fields[field]

    def set(self, field: str, value, key: str):
        self.fields[field] = value
        self.origin[field] = self.path(key)

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
        if not isinstance(t, str) or t not in kinds:
            raise r.unsupported(f"layer_types[{i}]", t, f"supported: {', '.join(kinds)}")
    r.set("attention_pattern", list(_period([kinds[t] for t in types])), "layer_types")


def _rope(r: _HF):
    if r.data.get("rope_theta") is None and r.data.get("rope_parameters") is not None:
        params = r.sub("rope_parameters")
        params.put("rope_theta", "rope_theta", params.number)
    elif r.data.get("rope_theta") is not None or r.data.get("model_type") != "llama":
        r.put("rope_theta", "rope_theta", r.number)
    else:
        r.set("rope_theta", 10000.0, "rope_theta")  # LlamaConfig default (Llama 2 configs omit it)
    if r.data.get("rope_scaling") is None:
        return
    scaling = r.sub("rope_scaling")
    if not scaling.data:
        return
    kind_key = "rope_type" if "rope_type" in scaling.data else "type"
    kind = scaling.data.get(kind_key)
    if kind in (None, "default"):
        return
    if not isinstance(kind, str) or kind not in ROPE_SCALING_TYPES:
        raise scaling.unsupported(kind_key, kind, f"supported: {', '.join(ROPE_SCALING_TYPES)}")
    values = {"type": kind}
    for f in dataclasses.fields(RopeScaling):
        if f.name == "type":
            continue
        r.origin[f"rope_scaling.{f.name}"] = scaling.path(f.name)  # RopeScaling's errors name the sub-key
        if f.metadata.get("physical"):
            read = scaling.integer if f.metadata["integer"] else scaling.number
        else:
            read = scaling.flag  # truncate
        value = read(f.name, None)
        if value is not None:
            values[f.name] = value
    r.set("rope_scaling", values, "rope_scaling")


def _trunk(r: _HF):
    r.put("num_layers", "num_hidden_layers", r.integer)
    r.put("hidden_size", "hidden_size", r.integer)
    r.put("vocab_size", "vocab_size", r.integer)
    r.put("num_attention_heads", "num_attention_heads", r.integer)
    r.put("norm_eps", "rms_norm_eps", r.number)
    r.put("max_position_embeddings", "max_position_embeddings", r.integer)
    _rope(r)


def _gqa_attention(r: _HF):
    heads = r.fields["num_attention_heads"]
    r.put("num_kv_heads", "num_key_value_heads", r.integer, heads)
    r.put("head_dim", "head_dim", r.integer, r.fields["hidden_size"] // heads)
    bias = r.flag("attention_bias", False)
    r.set("attention_bias", bias, "attention_bias")
    r.set("o_bias", bias, "attention_bias")  # transformers uses attention_bias for o_proj too


def _llama(r: _HF):
    _trunk(r)
    _gqa_attention(r)
    r.put("intermediate_size", "intermediate_size", r.integer)
    if r.flag("mlp_bias", False):
        raise r.unsupported("mlp_bias", True, "FFN biases are not modelled")


def _gpt_oss(r: _HF):
    _trunk(r)
    _gqa_attention(r)
    r.set("attention_sinks", True, "architectures")  # GptOssAttention.sinks, one per head
    n = r.fields["num_layers"]
    default_types = ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(n)]
    types = r.items("layer_types", default_types)
    _attention_pattern(r, types, {"sliding_attention": "sliding", "full_attention": "full"})
    if "sliding" in r.fields["attention_pattern"]:
        r.put("sliding_window", "sliding_window", r.integer)
    r.put("num_experts", "num_local_experts", r.count)
    r.put("experts_per_token", "num_experts_per_tok", r.count)
    r.put("expert_intermediate_size", "intermediate_size", r.integer)
    r.put("swiglu_limit", "swiglu_limit", r.number)
    # GptOssExperts: gate_up_proj/down_proj with biases; GptOssTopKRouter: linear with bias, softmax over the top-k
    r.set("expert_bias", True, "architectures")
    r.set("router", "topk_softmax", "architectures")
    r.set("router_bias", True, "architectures")


def _qwen3_moe(r: _HF):
    _trunk(r)
    _gqa_attention(r)
    r.set("qk_norm", "rmsnorm", "architectures")  # Qwen3MoeAttention q_norm / k_norm
    if r.flag("use_sliding_window", False):
        raise r.unsupported("use_sliding_window", True, "Qwen3 sliding-window layers are not modelled")
    if r.items("mlp_only_layers", []):
        raise r.unsupported("mlp_only_layers", r.get("mlp_only_layers"), "only an empty list is supported")
    r.put("intermediate_size", "intermediate_size", r.integer)
    r.put("num_experts", "num_experts", r.count)
    r.put("experts_per_token", "num_experts_per_tok", r.count)
    r.put("expert_intermediate_size", "moe_intermediate_size", r.integer)
    r.put("moe_layer_step", "decoder_sparse_step", r.integer, 1)
    r.set("router", "softmax_topk", "architectures")
    r.put("router_normalize_topk", "norm_topk_prob", r.flag, False)


def _llama4(r: _HF):
    _trunk(r)
    _gqa_attention(r)
    r.set("qk_norm", "l2" if r.flag("use_qk_norm", False) else "none", "use_qk_norm")
    n = r.fields["num_layers"]
    # Llama4TextConfig: no_rope_layers[i] == 1 means layer i *uses* RoPE (and chunked attention); default: every
    # no_rope_layer_interval-th layer is a global NoPE layer.
    interval = r.integer("no_rope_layer_interval", 4)
    rope = r.items("no_rope_layers", None) or [int((i + 1) % interval != 0) for i in range(n)]
    for i, x in enumerate(rope):
        if x not in (0, 1):
            raise r.error(f"no_rope_layers[{i}]", f"expected 0 or 1, got {x!r}")
    types = r.items("layer_types", None) or ["chunked_attention" if x else "full_attention" for x in rope]
    _attention_pattern(r, types, {"chunked_attention": "chunked", "full_attention": "full"})
    r.set("rope_pattern", list(_period([bool(x) for x in rope])), "no_rope_layers")
    if "chunked" in r.fields["attention_pattern"]:
        r.put("attention_chunk_size", "attention_chunk_size", r.integer)
    r.put("intermediate_size", "intermediate_size_mlp", r.integer)
    r.put("num_experts", "num_local_experts", r.count)
    r.put("experts_per_token", "num_experts_per_tok", r.count)
    r.put("expert_intermediate_size", "intermediate_size", r.integer)
    r.set("num_shared_experts", 1, "architectures")  # Llama4TextMoe.shared_expert
    r.put("shared_expert_intermediate_size", "intermediate_size", r.integer)
    step = r.put("moe_layer_step", "interleave_moe_layer_step", r.integer, 1)
    listed = r.items("moe_layers", None)
    if listed is not None and listed != list(range(step - 1, n, step)):
        raise r.unsupported("moe_layers", listed, f"only every interleave_moe_layer_step-th layer ({step})")
    r.set("router", "topk_sigmoid", "architectures")


def _deepseek_v3(r: _HF):
    _trunk(r)
    r.set("family", "mla", "architectures")
    if r.flag("attention_bias", False):
        raise r.unsupported("attention_bias", True, "MLA projections without bias only")
    r.put("q_lora_rank", "q_lora_rank", r.integer, None)  # null: a plain q_proj (DeepSeek-V2-Lite)
    for f in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
        r.put(f, f, r.integer)
    r.put("intermediate_size", "intermediate_size", r.integer)
    r.put("num_experts", "n_routed_experts", r.count)
    r.put("experts_per_token", "num_experts_per_tok", r.count)
    r.put("expert_intermediate_size", "moe_intermediate_size", r.integer)
    shared = r.put("num_shared_experts", "n_shared_experts", r.count, 0)
    if shared:  # DeepseekV3MLP(moe_inter * n_shared)
        r.put("shared_expert_intermediate_size", "moe_intermediate_size", r.integer)
    r.put("first_k_dense_layers", "first_k_dense_replace", r.count, 0)
    if r.integer("moe_layer_freq", 1) != 1:
        raise r.unsupported("moe_layer_freq", r.get("moe_layer_freq"), "only 1")
    scoring, method = r.get("scoring_func", "sigmoid"), r.get("topk_method", "noaux_tc")
    if (scoring, method) != ("sigmoid", "noaux_tc"):
        raise r.unsupported("scoring_func" if scoring != "sigmoid" else "topk_method", f"{scoring}/{method}",
                            "only sigmoid scoring with noaux_tc")
    r.set("router", "sigmoid_grouped", "scoring_func")
    r.set("router_score_correction_bias", True, "topk_method")  # gate.e_score_correction_bias
    r.put("router_normalize_topk", "norm_topk_prob", r.flag, False)
    r.put("n_group", "n_group", r.integer)
    r.put("topk_group", "topk_group", r.integer)
    r.put("routed_scaling_factor", "routed_scaling_factor", r.number, 1.0)
    r.put("num_mtp_layers", "num_nextn_predict_layers", r.count, 0)


def _kimi_vision(r: _HF, text_hidden):
    vision = {}

    def put(field, *keys, default=dataclasses.MISSING):
        """The first of ``keys`` present (K2.5 spells the ViT sizes ``vt_*``, Kimi-VL without the prefix), as a
        whole number > 0; ``vision.<field>`` errors from VisionTower then name that key."""
        key = next((k for k in keys if r.data.get(k) is not None), keys[0])
        vision[field] = r.integer(key, default)
        r.origin[f"vision.{field}"] = r.path(key)

    put("num_layers", "vt_num_hidden_layers", "num_hidden_layers")
    put("hidden_size", "vt_hidden_size", "hidden_size")
    put("intermediate_size", "vt_intermediate_size", "intermediate_size")
    put("num_heads", "vt_num_attention_heads", "num_attention_heads")
    put("patch_size", "patch_size")
    merge = r.items("merge_kernel_size")
    if len(merge) != 2 or merge[0] != merge[1]:
        raise r.unsupported("merge_kernel_size", merge, "only a square [k, k] merge")
    vision["merge_size"] = r.whole("merge_kernel_size[0]", merge[0])
    r.origin["vision.merge_size"] = r.path("merge_kernel_size")
    if r.data.get("init_pos_emb_height") is not None:
        vision["pos_emb_grid"] = [r.integer("init_pos_emb_height"), r.integer("init_pos_emb_width")]
        r.origin["vision.pos_emb_grid"] = r.path("init_pos_emb_height")
    vision["projector_hidden_size"] = vision["hidden_size"] * vision["merge_size"] ** 2  # KimiVL projector
    put("projector_output_size", "text_hidden_size", default=text_hidden)
    r.set("vision", vision, "")


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
    tie = r if r.data.get("tie_word_embeddings") is not None else top  # Llama 4 / Kimi: may sit beside text_config
    tie.put("tie_word_embeddings", "tie_word_embeddings", tie.flag, False)
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
        raise ConfigError(f"{file}: {_hf_path(r.origin, err.path)}", err.detail) from None


def _hf_path(origin: dict[str, str], path: str) -> str:
    """The config key behind ModelArchitecture path ``path``: the longest of ``path``, ``path`` less its last
    ``.key`` or ``[i]``, ... that the reader recorded (``path`` itself if none)."""
    p = path
    while p not in origin:
        shorter = re.sub(r"(\.[^.\[]*|\[\d+\])$", "", p)
        if shorter == p:
            return path
        p = shorter
    return origin[p]
