"""The jaxpr walker behind :mod:`serving.graph`: every equation of a traced step attributed to a kernel (by a
``kernel_of(name_stack)`` rule the caller gives) and counted. Call primitives (jit/pjit, custom_jvp/custom_vjp,
remat, ...) are recursed into, ``cond`` and loops handled as below.

Per kernel it accumulates:

- matmul FLOPs: ``dot_general`` 2 x prod(batch, contracting and free dims) = 2 x |lhs| x prod(rhs free dims);
  ``ragged_dot(_general)`` 2 x rows x contracting x output dim (each row multiplies one group's matrix);
  ``conv_general_dilated`` 2 x |out| x (kernel elements per output feature). Each is filed under the tensor class of
  the weight it multiplies (``weightless`` for activation x activation, e.g. attention scores);
- contraction depth: for every product with a weight, FLOPs / K (K = the contracted elements per output element),
  kept apart for row-parallel weights (a leaf the caller marks: Megatron-LM's row-parallel layers, whose input
  dimension, and so K, tensor parallelism splits) and the rest, so that the serving model can charge the depth
  penalty of a tiled GEMM per chip (``serving/perf.py``);
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
"""

from __future__ import annotations

import dataclasses
import math

import jax.extend.core as jcore
import jax.numpy as jnp

WEIGHTLESS = "weightless"  # matmul class of activation x activation products (attention scores, values)
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
    row: bool = False  # a view of a row-parallel weight (kept through gathers, as ``cls``)


@dataclasses.dataclass
class _Stats:
    layer: int | None
    matmul: dict = dataclasses.field(default_factory=dict)
    vector: float = 0.0
    reads: dict = dataclasses.field(default_factory=dict)  # leaf -> elements
    writes: dict = dataclasses.field(default_factory=dict)
    ragged_rows: float = 0.0
    ragged_groups: int = 0
    over_k: dict = dataclasses.field(default_factory=dict)  # "unsplit" / "row_parallel" -> sum of FLOPs / K
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
                return [_Value(new["nbytes"], kernel, mult, cls=src.cls, row=src.row)]
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
            return [_Value(_nbytes(out_avals[0]), kernel, mult, cls=vals[0].cls, row=vals[0].row)]
        for v in vals:
            if v is not None:
                self._consume(st, kernel, v, mult)
        self._flops(st, prim, p, ins, out_avals, vals, mult)
        return [_Value(_nbytes(a), kernel, mult) for a in out_avals]

    def _flops(self, st, prim, p, ins, outs, vals, mult):
        def add(f, depth):
            w = next((v for v in (vals[1], vals[0]) if v is not None and v.cls), None)
            cls = w.cls if w is not None else WEIGHTLESS
            st.matmul[cls] = st.matmul.get(cls, 0.0) + f * mult
            if w is not None and depth > 0:
                part = "row_parallel" if w.row else "unsplit"
                st.over_k[part] = st.over_k.get(part, 0.0) + f * mult / depth

        if prim == "dot_general":
            (lc, rc), (_, rb) = p["dimension_numbers"]
            free = [d for i, d in enumerate(ins[1].shape) if i not in rc and i not in rb]
            add(2.0 * _size(ins[0]) * math.prod(free), math.prod(ins[0].shape[i] for i in lc))
        elif prim in ("ragged_dot_general", "ragged_dot"):
            if prim == "ragged_dot":
                lc, rc, rb, group, ragged = (1,), (1,), (), (0,), 0
            else:
                dn = p["ragged_dot_dimension_numbers"]
                (lc, rc), (_, rb) = dn.dot_dimension_numbers
                group, ragged = dn.rhs_group_dimensions, dn.lhs_ragged_dimensions[0]
            free = [d for i, d in enumerate(ins[1].shape) if i not in rc and i not in rb and i not in group]
            add(2.0 * _size(ins[0]) * math.prod(free), math.prod(ins[0].shape[i] for i in lc))
            st.ragged_rows = max(st.ragged_rows, float(ins[0].shape[ragged]) * mult)
            st.ragged_groups = max(st.ragged_groups, int(math.prod(ins[1].shape[g] for g in group)))
        elif prim == "conv_general_dilated":
            out_feature = p["dimension_numbers"].rhs_spec[0]
            per_output = _size(ins[1]) / ins[1].shape[out_feature]
            add(2.0 * _size(outs[0]) * per_output, per_output)
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


def walk_jaxpr(closed, leaves, kernel_of, row_parallel=frozenset()):
    """Walk a ClosedJaxpr whose invars are ``leaves`` ((kind, class, aval) with kind param / cache / input);
    ``row_parallel``: indices of the param leaves whose contraction dimension tensor parallelism splits. Returns
    ({kernel: stats}, kernel names in order of first appearance)."""
    w = _Walker(leaves, kernel_of)
    ins = []
    for i, (kind, cls, aval) in enumerate(leaves):
        if kind == "input":
            ins.append(_Value(_nbytes(aval), None))
        else:
            ins.append(_Value(_nbytes(aval), None, leaf=i, cls=cls if kind == "param" else None,
                              elems=float(_size(aval)), row=i in row_parallel))
    outs = w.walk(closed.jaxpr, [_Value(0.0, None) for _ in closed.jaxpr.constvars], ins, "", 1.0)
    w.finish(outs)
    return w.stats, list(w.stats)
