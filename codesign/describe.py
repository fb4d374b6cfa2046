"""``python -m codesign.describe workload=NAME precision=P``: one JSON object describing a workload at full size.

The numbers come from two independent places and are reported side by side: the architecture's closed-form
counts (``serving/architecture.py``) and the real model code traced at full size into its operator graph
(``serving/graph.py``, abstract shapes: nothing is allocated). ``decode_flops_per_token`` is the traced matmul
FLOPs of one decode token at ``context_tokens``; ``kernels`` lists every kernel of that step.
"""

from __future__ import annotations

import json
import time

import hydra
from omegaconf import DictConfig, OmegaConf

from arch_space.errors import ConfigError
from arch_space.validation import check_quantity
from codesign.cli import CONF_DIR, entry, fail
from codesign.schema import load_workload
from serving.precision import Precision

PROG = "codesign.describe"
KEYS = ("workload", "precision", "hf_config", "context_tokens", "kernels")


def _validate(cfg: dict, overridden=()):
    for k in cfg:
        if k not in KEYS:
            raise ConfigError(k, f"unknown key (known: {', '.join(KEYS)})")
    arch = load_workload(cfg)
    precision = Precision.from_dict(cfg["precision"], "precision").for_workload(arch.name)
    ctx = check_quantity(cfg["context_tokens"], "context_tokens", integer=True)
    if ctx > arch.max_position_embeddings:
        raise ConfigError("context_tokens", f"{arch.name} attends over at most {arch.max_position_embeddings} "
                                            f"positions, got {ctx}")
    if not isinstance(cfg["kernels"], bool):
        raise ConfigError("kernels", f"expected true or false, got {cfg['kernels']!r}")
    return arch, precision, ctx


def describe(arch, precision: Precision, context_tokens: int, with_kernels: bool = True) -> dict:
    from serving.graph import trace_step
    from serving.models import build_model
    from serving.precision import RECIPE_CLASS

    counts = arch.param_counts()
    weight_bytes = {c: n * precision.of(RECIPE_CLASS[c]).bytes_per_weight for c, n in counts.items() if c != "mtp"}
    t0 = time.perf_counter()
    graph = trace_step(build_model(arch), arch, "decode", 1, 1, context_tokens, precision)
    trace_s = time.perf_counter() - t0
    totals = graph.totals()
    out = {
        "workload": arch.name, "family": arch.family, "precision": precision.name,
        "total_params": arch.total_params,
        "active_params_per_token": arch.active_params_per_token,
        "params_by_class": counts,
        "weight_bytes": sum(weight_bytes.values()),
        "weight_bytes_by_class": weight_bytes,
        "kv_cache_bytes_per_token": arch.kv_cache_bytes_per_token(precision.kv_bytes_per_element),
        "kv_cache_bytes_at_context": arch.kv_cache_elements(context_tokens) * precision.kv_bytes_per_element,
        "context_tokens": context_tokens,
        "decode_flops_per_token": totals["matmul_flops"],
        "decode_flops_per_token_closed_form": 2 * arch.active_params_per_token
        + arch.decode_attention_flops_per_token(context_tokens),
        "decode_flops_by_dtype": totals["matmul_flops_by_dtype"],
        "decode_weight_bytes_read": totals["touched_weight_bytes"],
        "trace_seconds": round(trace_s, 3),
    }
    if arch.published is not None:
        out["published"] = {"total_params": arch.published.total_params,
                            "active_params": arch.published.active_params, "source": arch.published.source}
    if with_kernels:
        out["kernels"] = [{"name": k.name, "kind": k.kind, "flops_by_dtype": k.flops_by_math_dtype,
                           "weight_bytes": k.weight_bytes, "kv_read_bytes": k.kv_read_bytes,
                           "kv_write_bytes": k.kv_write_bytes,
                           "activation_bytes": k.activation_in_bytes + k.activation_out_bytes,
                           **({"num_experts": k.num_experts, "experts_per_token": k.experts_per_token,
                               "expected_experts_touched": k.expected_experts_touched,
                               "load_imbalance": k.load_imbalance} if k.num_experts else {})}
                          for k in graph.kernels]
    return out


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="describe")
def _main(cfg: DictConfig) -> None:
    try:
        arch, precision, ctx = _validate(OmegaConf.to_container(cfg, resolve=True))
        print(json.dumps(describe(arch, precision, ctx, bool(cfg.kernels)), indent=1, default=float))
    except ConfigError as err:
        fail(PROG, err)


def cli() -> None:
    entry(PROG, "describe", _validate, _main)


if __name__ == "__main__":
    cli()
