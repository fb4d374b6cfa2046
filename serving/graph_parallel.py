"""MoE routing statistics and the collectives a parallel mapping adds to an operator graph (``serving/graph.py``).

Expected distinct experts. B tokens each pick k of E experts. Uniform routing: expert i is missed by one token with
probability 1 - k/E, so E[touched] = E (1 - (1 - k/E)^B) (the coverage of independent draws, as in
``serving.routing.expected_experts``). Skewed routing: expert popularity is Zipf-like, p_i ∝ 1 / i^s over
i = 1..E (s = ``skew``; s = 0 is uniform), and the probability that one token's k choices include expert i is
approximated by p_i' = min(1, k p_i) (exact for k = 1 or s = 0; for k > 1 it ignores that the k picks are without
replacement, which slightly overstates the hot experts), so E[touched] = sum_i 1 - (1 - p_i')^B. Since
sum_i p_i' <= k and 1 - (1 - p)^B is concave in p, skew never touches more experts than uniform routing (Jensen).

Load imbalance across EP ranks. Experts are placed round-robin (expert i on rank i mod ep, so a sorted popularity
spreads over the ranks); rank r receives each of the n = B k token-expert assignments with probability
q_r = sum_{i on r} p_i, so its load is ~Binomial(n, q_r). The expected maximum over ranks is approximated by the
Gaussian max bound E[max_r X_r] <= max_r mu_r + sigma_max sqrt(2 ln ep) (the maximum of ep sub-Gaussian variables,
e.g. Boucheron, Lugosi & Massart, "Concentration Inequalities", 2013, sec. 2.5), capped by the most a rank can
receive (B min(k, E/ep)); ``load_imbalance`` is that over the mean n / ep (1 for ep = 1 or many tokens).

Collectives (:func:`annotate_comm`). World = ``dp_attention`` replicas of attention, each tensor-parallel over ``tp``
chips; routed experts sharded over ``ep`` ranks; layers split into ``pp`` contiguous stages. With ``tokens`` the
step's tokens, one attention replica holds ``tokens / dp_attention``; every collective's ``bytes`` is the message one
rank handles (the consumer applies the algorithm factor, e.g. 2 (g-1)/g for a ring all-reduce, Patarasuk & Yuan 2009):

- TP all-reduce (Megatron-LM, Shoeybi et al. 2019) after ``o_proj`` and after the FFN down projection (``mlp``; for an
  MoE layer on ``experts`` unless they all-to-all, the shared expert being summed into the same buffer; on
  ``shared_expert`` when they do): local tokens x hidden x activation bytes, group tp, ring.
- EP all-to-all dispatch before and combine after ``experts`` (DeepSpeed-MoE, Rajbhandari et al. 2022; DeepEP),
  under attention-DP (dp_attention > 1: each replica holds different tokens): local tokens x k x hidden x
  bytes per element x (ep - 1) / ep (the share of the k copies that leaves the rank), group ep. The dispatch moves
  ``dispatch_bytes`` per element (FP8 with scales where the experts take quantised activations: DeepSeek-V3 report
  sec. 3.3.2, DeepEP; ``Precision.dispatch_bytes``), the combine the activation bytes. Without attention-DP
  (``tpNepN``) every rank of the TP group holds all the step's tokens after the attention all-reduce, so the experts
  compute on that copy and their partial outputs are all-reduced as with ep = 1 (vLLM's ``--enable-expert-parallel``
  without DP; TensorRT-LLM's ``moe_expert_parallel_size`` under attention TP): no all-to-all.
- Attention-DP combined with EP (dp_attention > 1 and ep > 1, SGLang's DP attention): the dense FFN and shared
  expert run data-parallel, each attention replica with its own copy tensor-parallel over its tp chips (SGLang's
  ``--moe-dense-tp-size 1`` in the lmsys large-scale-EP deployments; the shared expert and DeepSeek's three dense
  layers are small next to the routed experts), so they add only the replica's TP all-reduce, no DP gather. This
  is the weight placement the serving model charges (``serving.perf``: non-expert weights per chip = bytes / tp).
- PP send/recv of the hidden states at each stage boundary: local tokens x hidden x activation bytes, group 2,
  p2p; attached to the last kernel of the stage's last layer.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from arch_space.errors import ConfigError


def _popularity(num_experts: int, skew: float) -> np.ndarray:
    p = 1.0 / np.arange(1, num_experts + 1, dtype=np.float64) ** float(skew)
    return p / p.sum()


def expected_distinct_experts(num_experts: int, experts_per_token: int, tokens: float, skew: float = 0.0) -> float:
    """Expected number of distinct experts that ``tokens`` tokens touch (formula in the module docstring)."""
    if num_experts <= 0 or experts_per_token <= 0 or tokens <= 0:
        return 0.0
    if skew < 0:
        raise ConfigError("skew", f"must be >= 0, got {skew}")
    e, k = num_experts, experts_per_token
    if skew == 0:
        return float(e * (1.0 - (1.0 - k / e) ** tokens))
    p_tok = np.minimum(1.0, k * _popularity(e, skew))
    return float(np.sum(1.0 - (1.0 - p_tok) ** tokens))


def load_imbalance(num_experts: int, experts_per_token: int, tokens: float, skew: float = 0.0, ep: int = 1) -> float:
    """Expected max-over-ranks / mean token-expert assignments per EP rank (Gaussian max bound, module docstring)."""
    if ep <= 1 or num_experts <= 0 or experts_per_token <= 0 or tokens <= 0:
        return 1.0
    p = _popularity(num_experts, skew)
    q = np.bincount(np.arange(num_experts) % ep, weights=p, minlength=ep)  # round-robin placement
    n = tokens * experts_per_token
    mu, sigma = n * q, np.sqrt(n * q * (1.0 - q))
    expected_max = mu.max() + sigma.max() * math.sqrt(2.0 * math.log(ep))
    cap = tokens * min(experts_per_token, math.ceil(num_experts / ep))
    return float(max(1.0, min(expected_max, cap) / (n / ep)))


@dataclasses.dataclass(frozen=True)
class ParallelMapping:
    """How one serving instance is split over chips (DEP = attention DP + expert parallelism)."""
    tp: int = 1
    ep: int = 1
    dp_attention: int = 1
    pp: int = 1

    def __post_init__(self):
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f.name, f"must be a whole number >= 1, got {v!r}")
        if self.ep > self.tp * self.dp_attention:  # the EP ranks are the chips of a stage
            raise ConfigError("ep", f"must be at most tp x dp_attention = {self.tp * self.dp_attention} (the chips "
                                    f"of a pipeline stage), got {self.ep}")


@dataclasses.dataclass(frozen=True)
class Collective:
    op: str  # all_reduce / all_gather / reduce_scatter / all_to_all / send_recv
    bytes: float  # the message one rank handles (see the module docstring)
    group: int  # ranks taking part
    algorithm: str  # ring / tree / all_to_all / p2p
    where: str = "after"  # before / after the kernel's compute
    purpose: str = ""


def _stage_boundaries(num_layers: int, pp: int) -> set[int]:
    """Indices of the last layer of every pipeline stage but the last (contiguous stages of ceil(L / pp) layers)."""
    per = math.ceil(num_layers / pp)
    return {i for i in range(per - 1, num_layers - 1, per)}


def experts_alltoall(ep, dp_attention):
    """Whether tokens reach the routed experts by all-to-all: only with expert parallelism under attention-DP, where
    each replica holds different tokens (module docstring; tpNepN and ep = 1 all-reduce instead). Elementwise on
    ints or arrays, so the operator graph and the vectorised serving model (``serving.perf``) share the rule."""
    return (ep > 1) & (dp_attention > 1)


def annotate_comm(kernels, mapping: ParallelMapping, arch, tokens: float, activation_bytes: float,
                  dispatch_bytes: float | None = None):
    """Copies of ``kernels`` (objects with ``name``, ``layer``, ``kind``, ``comm``) with the collectives
    ``mapping`` implies attached to ``comm``. ``tokens``: the tokens of the step (batch x new tokens);
    ``dispatch_bytes``: bytes per element of the EP dispatch (default: ``activation_bytes``)."""
    tp, ep, dp = mapping.tp, mapping.ep, mapping.dp_attention
    h, k = arch.hidden_size, max(arch.experts_per_token, 1)
    local = tokens / dp
    tp_msg = local * h * activation_bytes
    leaving = local * k * h * (ep - 1) / ep  # elements of the k copies that leave the rank
    combine = leaving * activation_bytes
    dispatch = leaving * (activation_bytes if dispatch_bytes is None else dispatch_bytes)
    ep_a2a = experts_alltoall(ep, dp)
    boundaries = _stage_boundaries(arch.num_layers, mapping.pp) if mapping.pp > 1 else set()
    last_of_layer = {}
    for idx, kern in enumerate(kernels):
        if kern.layer is not None and kern.name.startswith("layer_"):
            last_of_layer[kern.layer] = idx
    out = []
    for idx, kern in enumerate(kernels):
        comm = list(kern.comm)
        trunk = kern.layer is not None and kern.name.startswith("layer_")
        op = kern.name.rsplit("/", 1)[-1]
        if trunk:
            if op == "o_proj" and tp > 1:
                comm.append(Collective("all_reduce", tp_msg, tp, "ring", "after", "TP attention output"))
            if tp > 1 and (op == "mlp" or (op == "experts" and not ep_a2a) or (op == "shared_expert" and ep_a2a)):
                comm.append(Collective("all_reduce", tp_msg, tp, "ring", "after", "TP FFN output"))
            if op == "experts" and ep_a2a:
                comm.append(Collective("all_to_all", dispatch, ep, "all_to_all", "before", "EP dispatch"))
                comm.append(Collective("all_to_all", combine, ep, "all_to_all", "after", "EP combine"))
            if kern.layer in boundaries and last_of_layer.get(kern.layer) == idx:
                comm.append(Collective("send_recv", tp_msg, 2, "p2p", "after", "PP stage boundary"))
        out.append(dataclasses.replace(kern, comm=comm))
    return out
