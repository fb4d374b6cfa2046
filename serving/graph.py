"""Trace one model step at full size into an operator graph: per kernel FLOPs, weights read, KV traffic, collectives.

``jax.make_jaxpr`` on ``jax.ShapeDtypeStruct`` inputs gives the step's jaxpr without allocating anything; the walker
(:mod:`serving.jaxpr_walk`) visits every equation (recursing into jit/pjit, custom_jvp/custom_vjp, remat and every
other call primitive, ``cond`` and loops) and attributes it to a kernel by its named scope (conventions in
``serving/models/__init__.py``): the innermost ``layer_{i}/<kernel>`` of the composed name stack (an ``mtp/`` or
``vision/`` prefix is kept in the name), else the top-level scope (``embed``, ``final_norm``, ``lm_head``, or
``mtp/<x>``, ``vision/<x>``), else ``other``. What it counts per kernel (FLOPs, weights, KV, activations; loops and
conditionals) is in :mod:`serving.jaxpr_walk`.

:func:`price` turns element counts into bytes and FLOPs into math dtypes for a ``Precision`` recipe;
:func:`trace_step` traces ``model.prefill`` / ``model.decode`` once per shape (cached) and prices, adds MoE routing
statistics and collectives (``serving/graph_parallel.py``) per call.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re

import jax
import jax.numpy as jnp

from serving.graph_parallel import (Collective, ParallelMapping, annotate_comm, expected_distinct_experts,
                                    load_imbalance)
from serving.jaxpr_walk import KERNEL_KINDS, WEIGHTLESS, walk_jaxpr
from serving.precision import BITS_PER_ELEMENT, Precision
from serving.precision import RECIPE_CLASS as _RECIPE_CLASS

__all__ = ["Kernel", "OperatorGraph", "ParallelMapping", "Collective", "default_param_class", "default_row_parallel",
           "trace_kernels",
           "price", "trace_step", "expected_distinct_experts", "load_imbalance", "annotate_comm", "KERNEL_KINDS"]

_LAYER_KEYS = {"attn": "attention", "mlp": "dense_ffn", "experts": "routed_experts", "shared": "shared_experts",
               "router": "router"}
_TOP_KEYS = {"embed": "embedding", "lm_head": "lm_head", "final_norm": "norms", "mtp": "mtp", "vision": "vision"}


def _key(k):
    for attr in ("key", "idx", "name"):
        if hasattr(k, attr):
            return getattr(k, attr)
    return k


def default_param_class(path) -> str:
    """Tensor class (``serving.architecture.PARAM_CLASSES``) of a parameter from its key path, following the
    layout of ``serving/models/__init__.py``; ``other`` for a key outside the conventions."""
    keys = [_key(k) for k in path]
    if not keys:
        return "other"
    top = keys[0]
    if top == "layers" and len(keys) >= 3:
        inner = keys[2]
        if isinstance(inner, str) and inner.endswith("norm"):
            return "norms"
        return _LAYER_KEYS.get(inner, "other")
    if top in _TOP_KEYS:
        return _TOP_KEYS[top]
    if isinstance(top, str) and top.endswith("norm"):
        return "norms"
    return "other"


# weights of Megatron-LM's row-parallel layers (Shoeybi et al. 2019): the attention output and FFN / expert down
# projections, whose input dimension -- the contraction of their GEMM -- tensor parallelism splits (the names of
# serving/models: wo / w_down in gqa, o_proj / down in mla, o_proj in vision)
ROW_PARALLEL_KEYS = frozenset({"wo", "o_proj", "w_down", "down"})


def default_row_parallel(path) -> bool:
    """Whether the parameter at ``path`` is a row-parallel weight (``ROW_PARALLEL_KEYS`` anywhere in its path)."""
    return any(_key(k) in ROW_PARALLEL_KEYS for k in path)


@dataclasses.dataclass
class Kernel:
    name: str
    layer: int | None
    kind: str
    matmul_flops: float = 0.0
    vector_flops: float = 0.0
    matmul_flops_by_class: dict = dataclasses.field(default_factory=dict)  # tensor class (or weightless) -> FLOPs
    flops_by_math_dtype: dict = dataclasses.field(default_factory=dict)  # filled by price()
    weight_elements_by_class: dict = dataclasses.field(default_factory=dict)
    weight_bytes_by_class: dict = dataclasses.field(default_factory=dict)  # price(); traced dtypes before that
    weight_bytes: float = 0.0
    kv_read_elements: float = 0.0
    kv_write_elements: float = 0.0
    kv_read_bytes: float = 0.0
    kv_write_bytes: float = 0.0
    activation_in_bytes: float = 0.0
    activation_out_bytes: float = 0.0
    # sum over its products with weights of FLOPs / contraction depth K, "unsplit" and "row_parallel" (whose K tensor
    # parallelism divides): FLOPs / this is the kernel's FLOP-weighted harmonic-mean K (serving/jaxpr_walk.py)
    matmul_flops_over_k: dict = dataclasses.field(default_factory=dict)
    ragged_rows: float = 0.0  # rows (token-expert pairs) entering the ragged_dot, per matmul
    ragged_groups: int = 0  # groups (experts) of the ragged_dot
    num_experts: int = 0
    experts_per_token: int = 0
    expected_experts_touched: float = 0.0
    load_imbalance: float = 1.0
    comm: list = dataclasses.field(default_factory=list)
    notes: list = dataclasses.field(default_factory=list)

    @property
    def touched_weight_bytes(self) -> float:
        """Weight bytes one step actually streams: routed experts scaled by expected_experts_touched / E."""
        routed = self.weight_bytes_by_class.get("routed_experts", 0.0)
        if self.num_experts:
            routed *= self.expected_experts_touched / self.num_experts
        return self.weight_bytes - self.weight_bytes_by_class.get("routed_experts", 0.0) + routed

    @property
    def comm_bytes(self) -> float:
        return sum(c.bytes for c in self.comm)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["touched_weight_bytes"] = self.touched_weight_bytes
        return d


def kernel_kind(name: str) -> str:
    """A kernel's kind from its name: ``norm`` for ``*norm`` scopes, else KERNEL_KINDS' entry, else ``other``."""
    op = name.rsplit("/", 1)[-1]
    if op.endswith("norm"):
        return "norm"
    return KERNEL_KINDS.get(op, "other")


def trace_kernels(fn, params_abstract, *args_abstract, param_class_of=default_param_class,
                  row_parallel_of=default_row_parallel, cache_argnums=()):
    """Trace ``fn(params, *args)`` on abstract inputs and return its kernels in order of first appearance, with raw
    counts (element counts; bytes in the traced dtypes). ``cache_argnums`` index ``args_abstract``: their float
    leaves are KV cache."""
    closed = jax.make_jaxpr(fn)(params_abstract, *args_abstract)
    p_leaves = jax.tree_util.tree_flatten_with_path(params_abstract)[0]
    leaves = [("param", param_class_of(tuple(path)), leaf) for path, leaf in p_leaves]
    for i, arg in enumerate(args_abstract):
        for leaf in jax.tree_util.tree_leaves(arg):
            kv = i in cache_argnums and jnp.issubdtype(leaf.dtype, jnp.floating)
            leaves.append(("cache" if kv else "input", None, leaf))
    if len(leaves) != len(closed.jaxpr.invars):
        raise ValueError(f"jaxpr has {len(closed.jaxpr.invars)} inputs, the arguments {len(leaves)} leaves")
    rows = frozenset(i for i, (path, _) in enumerate(p_leaves) if row_parallel_of(tuple(path)))
    stats, order = walk_jaxpr(closed, leaves, _kernel_of, rows)
    kernels = []
    for name in order:
        s = stats[name]
        k = Kernel(name=name, layer=s.layer, kind=kernel_kind(name), matmul_flops=sum(s.matmul.values()),
                   vector_flops=s.vector, matmul_flops_by_class=dict(s.matmul),
                   weight_elements_by_class=dict(s.weight_elements), weight_bytes_by_class=dict(s.weight_bytes),
                   weight_bytes=sum(s.weight_bytes.values()), kv_read_elements=s.kv_read[0],
                   kv_read_bytes=s.kv_read[1], kv_write_elements=s.kv_write[0], kv_write_bytes=s.kv_write[1],
                   activation_in_bytes=s.act_in, activation_out_bytes=s.act_out,
                   matmul_flops_over_k=dict(s.over_k), ragged_rows=s.ragged_rows,
                   ragged_groups=s.ragged_groups, notes=sorted(s.notes))
        kernels.append(k)
    return kernels


_LAYER = re.compile(r"layer_(\d+)")


def _kernel_of(name_stack: str) -> tuple[str, int | None]:
    """(kernel name, layer index) of a composed name stack (rules in the module docstring)."""
    comps = [c for c in name_stack.split("/") if c and "(" not in c]  # drop transform wrappers such as jvp(...)
    for i in range(len(comps) - 1, -1, -1):
        m = _LAYER.fullmatch(comps[i])
        if m:
            return "/".join(comps[:i + 2]), int(m.group(1))
    if not comps:
        return "other", None
    if comps[0] in ("mtp", "vision") and len(comps) > 1:
        return "/".join(comps[:2]), None
    return comps[0], None


def _recipe_class(cls: str) -> str:
    return _RECIPE_CLASS.get(cls, "attention")  # "other" weights priced as attention


def price(kernels, precision: Precision):
    """Copies of ``kernels`` with weight bytes, KV bytes and FLOPs by math dtype for ``precision``."""
    out = []
    for k in kernels:
        wb = {c: n * BITS_PER_ELEMENT[precision.of(_recipe_class(c)).weights] / 8.0
              for c, n in k.weight_elements_by_class.items()}
        flops = {}
        for c, f in k.matmul_flops_by_class.items():
            dt = precision.attention_core_math if c == WEIGHTLESS else precision.of(_recipe_class(c)).math
            flops[dt] = flops.get(dt, 0.0) + f
        kv = precision.kv_bytes_per_element
        out.append(dataclasses.replace(k, weight_bytes_by_class=wb, weight_bytes=sum(wb.values()),
                                       flops_by_math_dtype=flops, kv_read_bytes=k.kv_read_elements * kv,
                                       kv_write_bytes=k.kv_write_elements * kv, comm=list(k.comm),
                                       matmul_flops_by_class=dict(k.matmul_flops_by_class),
                                       matmul_flops_over_k=dict(k.matmul_flops_over_k),
                                       weight_elements_by_class=dict(k.weight_elements_by_class),
                                       notes=list(k.notes)))  # fresh containers: the traced kernels are cached
    return out


@dataclasses.dataclass
class OperatorGraph:
    kernels: list
    meta: dict = dataclasses.field(default_factory=dict)

    def _sum(self, attr) -> float:
        return float(sum(getattr(k, attr) for k in self.kernels))

    @property
    def matmul_flops_by_dtype(self) -> dict:
        out = {}
        for k in self.kernels:
            for dt, f in k.flops_by_math_dtype.items():
                out[dt] = out.get(dt, 0.0) + f
        return out

    def totals(self) -> dict:
        return {"matmul_flops": self._sum("matmul_flops"), "matmul_flops_by_dtype": self.matmul_flops_by_dtype,
                "vector_flops": self._sum("vector_flops"), "weight_bytes": self._sum("weight_bytes"),
                "touched_weight_bytes": self._sum("touched_weight_bytes"),
                "kv_read_bytes": self._sum("kv_read_bytes"), "kv_write_bytes": self._sum("kv_write_bytes"),
                "activation_bytes": self._sum("activation_in_bytes") + self._sum("activation_out_bytes"),
                "comm_bytes": self._sum("comm_bytes")}

    def kernel(self, name: str) -> Kernel:
        for k in self.kernels:
            if k.name == name:
                return k
        raise KeyError(name)

    def to_json(self, **kwargs) -> str:
        return json.dumps({"meta": self.meta, "totals": self.totals(), "kernels": [k.to_dict() for k in self.kernels]},
                          default=str, **kwargs)


_TRACE_CACHE: dict = {}
_PARAM_SHAPES: dict = {}


def _abstract_params(model, arch, dtype):
    """The parameter tree's shapes (abstract evaluation of ``init``: nothing allocated), once per (arch, dtype):
    tracing the random initialiser of a 61-layer model costs about as much as tracing a step."""
    key = (arch, jnp.dtype(dtype).name)
    if key not in _PARAM_SHAPES:
        _PARAM_SHAPES[key] = jax.eval_shape(functools.partial(model.init, dtype=dtype), jax.random.key(0))
    return _PARAM_SHAPES[key]


def _traced(model, arch, phase, batch, seq_len, context_len, dtype):
    key = (arch, phase, batch, seq_len, context_len, jnp.dtype(dtype).name)
    if key not in _TRACE_CACHE:
        params = _abstract_params(model, arch, dtype)
        cache = jax.eval_shape(functools.partial(model.init_cache, batch, context_len, dtype))
        t = seq_len if phase == "prefill" else 1
        tokens = jax.ShapeDtypeStruct((batch, t), jnp.int32)
        fn = model.prefill if phase == "prefill" else model.decode
        _TRACE_CACHE[key] = tuple(trace_kernels(fn, params, tokens, cache, cache_argnums=(1,)))
    return _TRACE_CACHE[key]


def trace_step(model, arch, phase: str, batch: int, seq_len: int, context_len: int, precision: Precision,
               mapping: ParallelMapping = ParallelMapping(), skew: float = 0.0, dtype=jnp.bfloat16) -> OperatorGraph:
    """The priced operator graph of one ``phase`` step: prefill of ``seq_len`` tokens into a cache of
    ``context_len`` positions, or one decode token attending over a ``context_len`` cache, for ``batch``
    sequences. The trace is cached per (arch, phase, batch, seq_len, context_len, dtype); precision, mapping and
    skew only re-price it."""
    if phase not in ("prefill", "decode"):
        raise ValueError(f"phase must be 'prefill' or 'decode', got {phase!r}")
    if phase == "prefill" and seq_len > context_len:
        raise ValueError(f"prefill of {seq_len} tokens does not fit a cache of {context_len}")
    raw = _traced(model, arch, phase, batch, seq_len if phase == "prefill" else 1, context_len, dtype)
    tokens = batch * (seq_len if phase == "prefill" else 1)
    kernels = price(raw, precision)
    e, k = arch.num_experts, arch.experts_per_token
    kernels = [dataclasses.replace(kern, num_experts=e, experts_per_token=k,
                                   expected_experts_touched=expected_distinct_experts(e, k, tokens, skew),
                                   load_imbalance=load_imbalance(e, k, tokens, skew, mapping.ep))
               if kern.kind == "moe_experts" and e else kern for kern in kernels]
    kernels = annotate_comm(kernels, mapping, arch, tokens, precision.activation_bytes,
                            precision.dispatch_bytes)
    meta = {"arch": arch.name, "phase": phase, "batch": batch, "seq_len": seq_len, "context_len": context_len,
            "tokens": tokens, "precision": precision.name, "mapping": dataclasses.asdict(mapping), "skew": skew}
    return OperatorGraph(kernels, meta)
