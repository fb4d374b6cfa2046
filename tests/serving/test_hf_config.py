"""serving/hf_config.py on wrong-typed config.json values: one ConfigError naming the file, the HF key and the
rejected value, never a Python error from the reader's own arithmetic (``//``, ``%``, ``range``, ``.get``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from arch_space.errors import ConfigError
from serving.architecture import ModelArchitecture

FIXTURES = Path(__file__).parent / "fixtures" / "hf"


def _fixture(name: str) -> dict:
    return json.loads((FIXTURES / f"{name}.json").read_text())


def _hf_file(tmp_path, data: dict) -> Path:
    p = tmp_path / "config.json"
    p.write_text(json.dumps(data))
    return p


def _set(data: dict, key: str, value) -> None:
    """``key`` is dotted for nested mappings (``text_config.no_rope_layer_interval``)."""
    *parents, last = key.split(".")
    for k in parents:
        data = data[k]
    data[last] = value


def _rejects(tmp_path, data: dict, key: str) -> ConfigError:
    cfg = _hf_file(tmp_path, data)
    with pytest.raises(ConfigError) as err:
        ModelArchitecture.from_hf_config(cfg)
    assert err.value.path == f"{cfg}: {key}"
    assert "\n" not in str(err.value)
    return err.value


# The defects found with `python -m codesign.describe hf_config=FILE`: each was a TypeError, AttributeError or
# ZeroDivisionError, or a message that did not say what was wrong.
@pytest.mark.parametrize("fixture,key,value,expect", [
    ("llama3_8b", "hidden_size", "4096", "expected an integer > 0, got '4096'"),
    ("llama3_8b", "rope_scaling", "llama3", "expected a mapping, got 'llama3'"),
    ("gpt_oss_120b", "num_hidden_layers", "36", "expected an integer > 0, got '36'"),
    ("llama4_maverick", "text_config.no_rope_layer_interval", 0, "expected an integer > 0, got 0"),
    ("llama4_maverick", "text_config.no_rope_layer_interval", "4", "expected an integer > 0, got '4'"),
    ("gpt_oss_120b", "layer_types", "sliding_attention", "expected a list, got 'sliding_attention'"),
    ("llama4_maverick", "text_config.layer_types", "chunked_attention", "expected a list, got 'chunked_attention'"),
    ("llama3_8b", "mlp_bias", "no", "expected true or false, got 'no'"),
])
def test_reported_defects(tmp_path, fixture, key, value, expect):
    data = _fixture(fixture)
    _set(data, key, value)
    err = _rejects(tmp_path, data, key)
    assert err.detail == expect
    assert repr(value) in str(err)


# Any other key the reader takes, with a value of the wrong type, is refused the same way.
@pytest.mark.parametrize("fixture,key,value,expect", [
    ("llama3_8b", "num_attention_heads", 0, "expected an integer > 0, got 0"),
    ("llama3_8b", "num_key_value_heads", 8.5, "expected an integer > 0, got 8.5"),
    ("llama3_8b", "vocab_size", True, "expected an integer > 0, got True"),
    ("llama3_8b", "rms_norm_eps", "1e-5", "expected a number, got '1e-5'"),
    ("llama3_8b", "rope_theta", True, "expected a number, got True"),
    ("llama3_8b", "attention_bias", "false", "expected true or false, got 'false'"),
    ("llama3_8b", "tie_word_embeddings", 0, "expected true or false, got 0"),
    ("llama3_8b", "rope_scaling.factor", "8", "expected a number, got '8'"),
    ("llama3_8b", "rope_scaling.original_max_position_embeddings", "8192", "expected an integer > 0, got '8192'"),
    ("llama3_8b", "rope_scaling.rope_type", ["llama3"], "unsupported ['llama3']"),
    ("gpt_oss_120b", "rope_scaling.truncate", "no", "expected true or false, got 'no'"),
    ("gpt_oss_120b", "sliding_window", "128", "expected an integer > 0, got '128'"),
    ("gpt_oss_120b", "swiglu_limit", "7.0", "expected a number, got '7.0'"),
    ("qwen3_30b_a3b", "use_sliding_window", "false", "expected true or false, got 'false'"),
    ("qwen3_30b_a3b", "mlp_only_layers", "none", "expected a list, got 'none'"),
    ("qwen3_30b_a3b", "num_experts", -1, "expected an integer >= 0, got -1"),
    ("qwen3_30b_a3b", "norm_topk_prob", "true", "expected true or false, got 'true'"),
    ("llama4_maverick", "text_config.use_qk_norm", "yes", "expected true or false, got 'yes'"),
    ("llama4_maverick", "text_config.interleave_moe_layer_step", "2", "expected an integer > 0, got '2'"),
    ("llama4_maverick", "text_config.moe_layers", "1,3,5", "expected a list, got '1,3,5'"),
    ("llama4_maverick", "text_config.tie_word_embeddings", "no", "expected true or false, got 'no'"),
    ("deepseek_v3", "q_lora_rank", "1536", "expected an integer > 0, got '1536'"),
    ("deepseek_v3", "n_shared_experts", "1", "expected an integer >= 0, got '1'"),
    ("deepseek_v3", "moe_layer_freq", "1", "expected an integer > 0, got '1'"),
    ("deepseek_v3", "routed_scaling_factor", "2.5", "expected a number, got '2.5'"),
    ("deepseek_v3", "scoring_func", "softmax", "unsupported 'softmax/noaux_tc'"),
    ("kimi_k2_5", "vision_config.vt_num_attention_heads", "16", "expected an integer > 0, got '16'"),
    ("kimi_k2_5", "vision_config.merge_kernel_size", "2x2", "expected a list, got '2x2'"),
    ("kimi_k2_5", "vision_config.init_pos_emb_width", -64, "expected an integer > 0, got -64"),
])
def test_wrong_type_names_the_key_and_value(tmp_path, fixture, key, value, expect):
    data = _fixture(fixture)
    _set(data, key, value)
    assert expect in str(_rejects(tmp_path, data, key))


def test_merge_kernel_size_entries_are_sizes(tmp_path):
    data = _fixture("kimi_k2_5")
    data["vision_config"]["merge_kernel_size"] = ["2", "2"]
    err = _rejects(tmp_path, data, "vision_config.merge_kernel_size[0]")
    assert err.detail == "expected an integer > 0, got '2'"


# Entries of lists, keys read only in some configs, and ModelArchitecture's own checks: the error names the HF key,
# down to the entry or sub-key where there is one.
@pytest.mark.parametrize("fixture,edit,key,expect", [
    ("llama3_8b", lambda d: (d.pop("rope_theta"), d.update(rope_parameters="theta")), "rope_parameters",
     "expected a mapping, got 'theta'"),
    ("llama3_8b", lambda d: (d.pop("rope_theta"), d.update(rope_parameters={"rope_theta": "5e5"})),
     "rope_parameters.rope_theta", "expected a number, got '5e5'"),
    ("gpt_oss_120b", lambda d: d.update(layer_types=[["sliding_attention"]]), "layer_types[0]",
     "unsupported ['sliding_attention']"),
    ("llama4_maverick", lambda d: d["text_config"].update(no_rope_layers=[1, 1, "1", 0]),
     "text_config.no_rope_layers[2]", "expected 0 or 1, got '1'"),
    ("llama3_8b", lambda d: d["rope_scaling"].pop("low_freq_factor"), "rope_scaling.low_freq_factor",
     "is required for rope scaling type 'llama3'"),
    ("llama3_8b", lambda d: d["rope_scaling"].update(factor=-8.0), "rope_scaling.factor", "must be > 0, got -8.0"),
    ("kimi_k2_5", lambda d: d["vision_config"].update(vt_num_attention_heads=7),
     "vision_config.vt_num_attention_heads", "must divide hidden_size (1152), got 7"),
    ("kimi_k2_5", lambda d: d["vision_config"].update(text_hidden_size=4096), "vision_config.text_hidden_size",
     "must equal hidden_size (7168), got 4096"),
    ("gpt_oss_120b", lambda d: d.update(layer_types=["sliding_attention", "local_attention"]), "layer_types[1]",
     "unsupported 'local_attention'"),
])
def test_entries_and_model_checks_name_the_hf_key(tmp_path, fixture, edit, key, expect):
    data = _fixture(fixture)
    edit(data)
    assert expect in str(_rejects(tmp_path, data, key))


def test_valid_variants_still_read(tmp_path):
    """Integral floats, nulls and empty mappings read as before (the typed getters only refuse wrong types)."""
    base = ModelArchitecture.from_hf_config(FIXTURES / "llama3_8b.json", name="x")
    data = _fixture("llama3_8b") | {"hidden_size": 4096.0, "num_hidden_layers": 32.0, "mlp_bias": None}
    assert ModelArchitecture.from_hf_config(_hf_file(tmp_path, data), name="x") == base
    plain = _fixture("llama3_8b") | {"rope_scaling": {}}
    assert ModelArchitecture.from_hf_config(_hf_file(tmp_path, plain), name="x").rope_scaling is None
    data = _fixture("llama4_maverick")
    data["text_config"] |= {"no_rope_layer_interval": 4, "tie_word_embeddings": None}
    assert ModelArchitecture.from_hf_config(_hf_file(tmp_path, data), name="m") == \
        ModelArchitecture.from_hf_config(FIXTURES / "llama4_maverick.json", name="m")


def test_describe_prints_one_line_for_a_wrong_type(tmp_path):
    cfg = _hf_file(tmp_path, _fixture("llama3_8b") | {"hidden_size": "4096"})
    proc = subprocess.run([sys.executable, "-m", "codesign.describe", f"hf_config={cfg}"], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "Traceback" not in proc.stderr
    assert f"{cfg}: hidden_size: expected an integer > 0, got '4096'" in proc.stderr
