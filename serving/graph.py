"""Trace one model step at full size into an operator graph: per kernel FLOPs, weights read, KV traffic, collectives.

``jax.make_jaxpr`` on ``jax.ShapeDtypeStruct`` inputs gives the step's jaxpr without allocating anything; the walker
in this module visits every equation (recursing into jit/pjit, custom_jvp/custom_vjp, remat and every other call
primitive, ``cond`` and loops) and attributes it to a kernel by its named scope (conventions in
``serving/models/__init__.py``): the innermost ``layer_{i}/<kernel>`` of the composed name stack (an ``mtp/`` or
``vision/`` prefix is kept in the name), else the top-level scope (``embed``, ``final_norm``, ``lm_head``, or
``mtp/<x>``, ``vision/<x>``), else ``other``. Per kernel it accumulates:

- matmul FLOPs: ``dot_general`` 2 x prod(batch, contracting and free dims) = 2 x |lhs| x prod(rhs free dims);
  ``ragged_dot(_general)`` 2 x rows x contracting x output dim (each row multiplies one group's matrix);
  ``conv_general_dilated`` 2 x |out| x (kernel elements per output feature). Each is filed under the tensor class of
  the weight it multiplies (``weightless`` for activation x activation, e.g. attention scores);
- vector FLOPs: 1 per output element of an arithmetic elementwise primitive (transcendentals such as exp, log, tanh,
  rsqrt count 1, as do compares and selects) and 1 per input element of a reduction, cumulative op, sort or top_k;
- weights read: a parameter leaf is read by the kernel of the first non-layout equation consuming it (convert,
  reshape, transpose, broadcast do not read; slices read their size, a gather reads its rows, as the embedding
  lookup does). Each leaf counts at most once per kernel per step (loops re-reading a weight are capped), and a routed
  expert leaf always counts whole: which experts a step touches is ``expected_experts_touched``, not the trace;
- KV cache: cache leaves (the float leaves of the ``cache_argnums`` arguments) read like weights, and written by
  ``dynamic_update_slice`` / ``scatter`` into them (the bytes of the update);
- activations: bytes of values produced in one kernel and consumed in another (in: per consuming kernel, out: once
  per value), plus the step's non-weight inputs and outputs; closed-over constants are not counted.

Loops: ``scan`` bodies count ``length`` times; a ``while`` body counts once (its trip count is not static in the
jaxpr; ``fori_loop`` with static bounds lowers to ``scan``). ``cond``: the branch with the most FLOPs counts.

:func:`price` turns element counts into bytes and FLOPs into math dtypes for a ``Precision`` recipe;
:func:`trace_step` traces ``model.prefill`` / ``model.decode`` once per shape (cached) and prices, adds MoE routing
statistics and collectives (``serving/graph_parallel.py``) per call.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import re

import jax
import jax.extend.core as jcore
import jax.numpy as jnp

from serving.graph_parallel import (Collective, ParallelMapping, annotate_comm, expected_distinct_experts,
                                    load_imbalance)
from serving.precision import BITS_PER_ELEMENT, Precision
from serving.precision import RECIPE_CLASS as _RECIPE_CLASS

__all__ = ["Kernel", "OperatorGraph", "ParallelMapping", "Collective", "default_param_class", "trace_kernels",
           "price", "trace_step", "expected_distinct_experts", "load_imbalance", "annotate_comm", "KERNEL_KINDS"]

WEIGHTLESS = "weightless"  # matmul class of activation x activation products (attention scores, values)
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


def _kernel_kind(name: str) -> str:
    op = name.rsplit("/", 1)[-1]
    if op.endswith("norm"):
        return "norm"
    return KERNEL_KINDS.get(op, "other")


def trace_kernels(fn, params_abstract, *args_abstract, param_class_of=default_param_class, cache_argnums=()):
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
    stats, order = walk_jaxpr(closed, leaves, _kernel_of)
    kernels = []
    for name in order:
        s = stats[name]
        k = Kernel(name=name, layer=s.layer, kind=_kernel_kind(name), matmul_flops=sum(s.matmul.values()),
                   vector_flops=s.vector, matmul_flops_by_class=dict(s.matmul),
                   weight_elements_by_class=dict(s.weight_elements), weight_bytes_by_class=dict(s.weight_bytes),
                   weight_bytes=sum(s.weight_bytes.values()), kv_read_elements=s.kv_read[0],
                   kv_read_bytes=s.kv_read[1], kv_write_elements=s.kv_write[0], kv_write_bytes=s.kv_write[1],
                   activation_in_bytes=s.act_in, activation_out_bytes=s.act_out, ragged_rows=s.ragged_rows,
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
            dt = precision.attention.math if c == WEIGHTLESS else precision.of(_recipe_class(c)).math
            flops[dt] = flops.get(dt, 0.0) + f
        kv = precision.kv_bytes_per_element
        out.append(dataclasses.replace(k, weight_bytes_by_class=wb, weight_bytes=sum(wb.values()),
                                       flops_by_math_dtype=flops, kv_read_bytes=k.kv_read_elements * kv,
                                       kv_write_bytes=k.kv_write_elements * kv, comm=list(k.comm),
                                       matmul_flops_by_class=dict(k.matmul_flops_by_class),
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
    kernels = annotate_comm(kernels, mapping, arch, tokens, precision.activation_bytes)
    meta = {"arch": arch.name, "phase": phase, "batch": batch, "seq_len": seq_len, "context_len": context_len,
            "tokens": tokens, "precision": precision.name, "mapping": dataclasses.asdict(mapping), "skew": skew}
    return OperatorGraph(kernels, meta)


# ====================================================================== jaxpr walker
KERNEL_KINDS = {"qkv_proj": "matmul", "q_proj": "matmul", "q_a_proj": "matmul", "q_b_proj": "matmul",
                "kv_a_proj": "matmul", "kv_b_proj": "matmul", "o_proj": "matmul", "mlp": "matmul",
                "shared_expert": "matmul", "attention": "attention", "experts": "moe_experts", "router": "router",
                "embed": "embed", "lm_head": "lm_head"}
_ALIAS = {"reshape", "squeeze", "expand_dims"}  # same buffer, new shape: no new value
_LAYOUT = _ALIAS | {"convert_element_type", "transpose", "broadcast_in_dim", "copy", "copy_p", "reduce_precision",
                    "bitcast_convert_type", "rev"}  # weight / cache views: reading happens at the consumer
_INDEX = {"slice", "dynamic_slice", "gather"}  # read their output's size of the viewed leaf
_ELEMENTWISE = set("""add sub mul div rem pow integer_pow max min neg abs sign floor ceil round exp exp2 log log1p
    expm1 tanh logistic sin cos tan asin acos atan atan2 sinh cosh asinh acosh atanh sqrt rsqrt cbrt erf erfc erf_inv
    lgamma digamma square clamp select_n eq ne lt le gt ge and or not xor nextafter is_finite""".split())
_REDUCTION = set("""reduce_sum reduce_max reduce_min reduce_prod reduce_and reduce_or argmax argmin cumsum cummax
    cummin cumprod cumlogsumexp sort top_k reduce_precision_sum""".split())


@dataclasses.dataclass(eq=False)
class _Value:
    nbytes: float
    producer: str | None  # kernel that produced it; None for step inputs and constants
    mult: float = 1.0  # times it is produced per step (inside loops)
    leaf: int | None = None  # index of the weight / cache leaf it is a view of
    counted: bool = False  # the leaf read was already recorded (at a slice)
    cls: str | None = None  # tensor class of the weight it came from (kept through gathers)
    elems: float = 0.0  # leaf elements it covers


@dataclasses.dataclass
class _Stats:
    layer: int | None
    matmul: dict = dataclasses.field(default_factory=dict)
    vector: float = 0.0
    reads: dict = dataclasses.field(default_factory=dict)  # leaf -> elements
    writes: dict = dataclasses.field(default_factory=dict)
    ragged_rows: float = 0.0
    ragged_groups: int = 0
    notes: set = dataclasses.field(default_factory=set)
    # filled by _Walker.finish: class -> elements / traced bytes, [elements, bytes], activation bytes
    weight_elements: dict = dataclasses.field(default_factory=dict)
    weight_bytes: dict = dataclasses.field(default_factory=dict)
    kv_read: list = dataclasses.field(default_factory=lambda: [0.0, 0.0])
    kv_write: list = dataclasses.field(default_factory=lambda: [0.0, 0.0])
    act_in: float = 0.0
    act_out: float = 0.0


def _size(aval) -> int:
    return math.prod(getattr(aval, "shape", ()))


def _nbytes(aval) -> float:
    try:
        return float(_size(aval) * jnp.dtype(aval.dtype).itemsize)
    except TypeError:  # extended dtypes (PRNG keys)
        return 0.0


class _Walker:
    def __init__(self, leaves, kernel_of):
        self.leaves, self.kernel_of = leaves, kernel_of
        self.stats: dict[str, _Stats] = {}
        self.uses: dict = {}  # (kernel, id(value)) -> value, activations consumed
        self.read_keys: set = set()

    def _stat(self, name, layer):
        if name not in self.stats:
            self.stats[name] = _Stats(layer)
        return self.stats[name]

    def _read(self, st, kernel, v, elems, key=None):
        key = (kernel, id(v) if key is None else key)  # once per (kernel, view): two slices of a leaf both read
        if key not in self.read_keys:
            self.read_keys.add(key)
            st.reads[v.leaf] = st.reads.get(v.leaf, 0.0) + elems

    def _consume(self, st, kernel, v, mult):
        if v.leaf is not None:
            if not v.counted:
                self._read(st, kernel, v, v.elems * mult)
        else:
            self.uses.setdefault((kernel, id(v)), v)

    def cost(self):
        return sum(sum(s.matmul.values()) + s.vector for s in self.stats.values())

    def walk(self, jaxpr, consts, ins, prefix, mult):
        env = dict(zip(jaxpr.constvars, consts))
        env.update(zip(jaxpr.invars, ins))
        for eqn in jaxpr.eqns:
            vals = [None if isinstance(v, jcore.Literal) else env[v] for v in eqn.invars]
            stack = "/".join(s for s in (prefix, str(eqn.source_info.name_stack)) if s)
            outs = self.eqn(eqn, vals, stack, mult)
            for var, val in zip(eqn.outvars, outs):
                if not isinstance(var, jcore.DropVar):
                    env[var] = val
        return [_Value(0.0, None) if isinstance(v, jcore.Literal) else env[v] for v in jaxpr.outvars]

    def _sub(self, closed, vals, stack, mult):
        j = closed.jaxpr if isinstance(closed, jcore.ClosedJaxpr) else closed
        consts = [_Value(0.0, None) for _ in j.constvars]
        return self.walk(j, consts, vals, stack, mult)

    def eqn(self, eqn, vals, stack, mult):
        prim, p = eqn.primitive.name, eqn.params
        if prim == "scan":
            return self._scan(eqn, vals, stack, mult)
        if prim == "while":
            nc, nb = p["cond_nconsts"], p["body_nconsts"]
            kernel, layer = self.kernel_of(stack)
            self._stat(kernel, layer).notes.add("while loop body counted once")
            return self._sub(p["body_jaxpr"], vals[nc:nc + nb] + vals[nc + nb:], stack, mult)
        if prim == "cond":
            costs = []
            for b in p["branches"]:
                dry = _Walker(self.leaves, self.kernel_of)
                dry._sub(b, vals[1:], stack, mult)
                costs.append(dry.cost())
            best = p["branches"][costs.index(max(costs))]
            return self._sub(best, vals[1:], stack, mult)
        for sub in p.values():
            j = sub.jaxpr if isinstance(sub, jcore.ClosedJaxpr) else sub
            if isinstance(j, jcore.Jaxpr) and len(j.invars) == len(vals) and len(j.outvars) == len(eqn.outvars):
                return self._sub(sub, vals, stack, mult)
        return self._leaf_op(eqn, vals, stack, mult)

    def _scan(self, eqn, vals, stack, mult):
        p = eqn.params
        n, nc, ncarry = p["length"], p["num_consts"], p["num_carry"]
        xs = [dataclasses.replace(v, nbytes=v.nbytes / n, mult=v.mult * n, elems=v.elems / n) if v else None
              for v in vals[nc + ncarry:]]
        outs = self._sub(p["jaxpr"], vals[:nc + ncarry] + xs, stack, mult * n)
        ys = [dataclasses.replace(v, nbytes=_nbytes(var.aval), mult=mult, elems=v.elems * n)
              for v, var in zip(outs[ncarry:], eqn.outvars[ncarry:])]
        return outs[:ncarry] + ys

    def _leaf_op(self, eqn, vals, stack, mult):
        prim, p = eqn.primitive.name, eqn.params
        kernel, layer = self.kernel_of(stack)
        st = self._stat(kernel, layer)
        ins = [v.aval for v in eqn.invars]
        out_avals = [v.aval for v in eqn.outvars]
        src = vals[0] if vals and vals[0] is not None and vals[0].leaf is not None else None
        if prim in _ALIAS and vals[0] is not None and src is None:
            return [vals[0]]
        if src is not None and (prim in _LAYOUT or prim in _INDEX):
            for v in vals[1:]:
                if v is not None:
                    self._consume(st, kernel, v, mult)
            new = dict(nbytes=_nbytes(out_avals[0]), producer=kernel, mult=src.mult)
            if prim not in _INDEX:
                return [dataclasses.replace(src, **new)]
            elems = min(src.elems, float(_size(out_avals[0])))
            if not src.counted:
                self._read(st, kernel, src, elems * mult, key=id(eqn))
            if prim == "gather" and self.leaves[src.leaf][0] == "param":  # a lookup: its rows are activations
                return [_Value(new["nbytes"], kernel, mult, cls=src.cls)]
            return [dataclasses.replace(src, counted=True, elems=elems, **new)]
        if src is not None and self.leaves[src.leaf][0] == "cache" and prim in (
                "dynamic_update_slice", "scatter", "scatter-add", "scatter_add"):
            upd = 1 if prim == "dynamic_update_slice" else 2
            st.writes[src.leaf] = st.writes.get(src.leaf, 0.0) + _size(ins[upd]) * mult
            for v in vals[1:]:
                if v is not None:
                    self._consume(st, kernel, v, mult)
            return [dataclasses.replace(src, nbytes=_nbytes(out_avals[0]), producer=kernel, counted=False)]
        if prim in _LAYOUT and vals[0] is not None and vals[0].cls is not None:  # keep a gathered weight's class
            self._consume(st, kernel, vals[0], mult)
            return [_Value(_nbytes(out_avals[0]), kernel, mult, cls=vals[0].cls)]
        for v in vals:
            if v is not None:
                self._consume(st, kernel, v, mult)
        self._flops(st, prim, p, ins, out_avals, vals, mult)
        return [_Value(_nbytes(a), kernel, mult) for a in out_avals]

    def _flops(self, st, prim, p, ins, outs, vals, mult):
        def add(f):
            cls = next((v.cls for v in (vals[1], vals[0]) if v is not None and v.cls), WEIGHTLESS)
            st.matmul[cls] = st.matmul.get(cls, 0.0) + f * mult

        if prim == "dot_general":
            (_, rc), (_, rb) = p["dimension_numbers"]
            free = [d for i, d in enumerate(ins[1].shape) if i not in rc and i not in rb]
            add(2.0 * _size(ins[0]) * math.prod(free))
        elif prim in ("ragged_dot_general", "ragged_dot"):
            if prim == "ragged_dot":
                rc, rb, group, ragged = (1,), (), (0,), 0
            else:
                dn = p["ragged_dot_dimension_numbers"]
                (_, rc), (_, rb) = dn.dot_dimension_numbers
                group, ragged = dn.rhs_group_dimensions, dn.lhs_ragged_dimensions[0]
            free = [d for i, d in enumerate(ins[1].shape) if i not in rc and i not in rb and i not in group]
            add(2.0 * _size(ins[0]) * math.prod(free))
            st.ragged_rows = max(st.ragged_rows, float(ins[0].shape[ragged]) * mult)
            st.ragged_groups = max(st.ragged_groups, int(math.prod(ins[1].shape[g] for g in group)))
        elif prim == "conv_general_dilated":
            out_feature = p["dimension_numbers"].rhs_spec[0]
            add(2.0 * _size(outs[0]) * _size(ins[1]) / ins[1].shape[out_feature])
        elif prim in _ELEMENTWISE:
            st.vector += float(sum(_size(a) for a in outs)) * mult
        elif prim in _REDUCTION:
            st.vector += float(_size(ins[0])) * mult

    def finish(self, outvals):
        """Per-kernel weight / KV totals and activation crossings; ``outvals`` are the step's outputs."""
        for v in outvals:
            if v.leaf is None:
                self.uses.setdefault(("<output>", id(v)), v)
        act_in, act_out, seen = {}, {}, set()
        for (kernel, _), v in self.uses.items():
            if v.producer == kernel:
                continue
            b = v.nbytes * v.mult
            if kernel != "<output>":
                act_in[kernel] = act_in.get(kernel, 0.0) + b
            if v.producer is not None and id(v) not in seen:
                seen.add(id(v))
                act_out[v.producer] = act_out.get(v.producer, 0.0) + b
        for name, s in self.stats.items():
            for leaf, elems in s.reads.items():
                kind, cls, aval = self.leaves[leaf]
                full = _size(aval)
                elems = full if cls == "routed_experts" else min(elems, full)
                item = jnp.dtype(aval.dtype).itemsize
                if kind == "param":
                    s.weight_elements[cls] = s.weight_elements.get(cls, 0.0) + elems
                    s.weight_bytes[cls] = s.weight_bytes.get(cls, 0.0) + elems * item
                else:
                    s.kv_read[0] += elems
                    s.kv_read[1] += elems * item
            for leaf, elems in s.writes.items():
                item = jnp.dtype(self.leaves[leaf][2].dtype).itemsize
                s.kv_write[0] += elems
                s.kv_write[1] += elems * item
            s.act_in, s.act_out = act_in.get(name, 0.0), act_out.get(name, 0.0)


def walk_jaxpr(closed, leaves, kernel_of):
    """Walk a ClosedJaxpr whose invars are ``leaves`` ((kind, class, aval) with kind param / cache / input);
    returns ({kernel: stats}, kernel names in order of first appearance)."""
    w = _Walker(leaves, kernel_of)
    ins = []
    for i, (kind, cls, aval) in enumerate(leaves):
        if kind == "input":
            ins.append(_Value(_nbytes(aval), None))
        else:
            ins.append(_Value(_nbytes(aval), None, leaf=i, cls=cls if kind == "param" else None,
                              elems=float(_size(aval))))
    outs = w.walk(closed.jaxpr, [_Value(0.0, None) for _ in closed.jaxpr.constvars], ins, "", 1.0)
    w.finish(outs)
    return w.stats, list(w.stats)
