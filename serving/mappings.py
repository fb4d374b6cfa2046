"""The parallel mappings a serving instance can use, as InferenceX and trtllm-bench users search them.

For N chips per instance (powers of two up to ``max_chips``): ``tpN`` (tensor parallel), and for MoE models also
``tpNepN`` (attention TP, experts EP), ``depN`` (attention data parallel + expert parallel, as SGLang / DeepSeek
serve), ``tp2depN/2``; and pipeline-parallel variants ``tpN/2pp2`` for N >= 2. A TP degree must divide the
attention heads (every engine shards whole heads: TensorRT-LLM, vLLM and SGLang reject ``num_heads % tp != 0``), so
72 or 96 chips give no ``tp36pp2`` / ``tp48pp2`` for 64- or 128-head models; an EP degree never exceeds the experts
(a non-dividing EP, e.g. DeepSeek's 256 experts on 72 ranks, is served with redundant experts as EPLB does).
Whether a mapping fits the chip (scale-up domain, memory) is decided by the serving model per design, which reports
infeasible points with their reason.
"""

from __future__ import annotations

from serving.perf import Mapping


def mapping_name(m: Mapping) -> str:
    tp, dp, ep, pp = (int(round(float(x))) for x in (m.tp, m.dp, m.ep, m.pp))
    if dp > 1 and ep > 1:
        name = (f"tp{tp}" if tp > 1 else "") + f"dep{dp}"
    else:
        name = f"tp{tp}" + (f"ep{ep}" if ep > 1 else "")
    return name + (f"pp{pp}" if pp > 1 else "")


def enumerate_mappings(arch, max_chips: int) -> list[Mapping]:
    """Mappings for 1, 2, 4 ... max_chips chips (and max_chips itself when not a power of two, e.g. 72 or 96)."""
    out = []
    n = 1
    moe = arch.num_experts > 0
    heads = arch.num_attention_heads
    while n <= max_chips:
        cands = [Mapping(tp=n)]
        if moe and n > 1:
            cands += [Mapping(tp=n, ep=n), Mapping(dp=n, ep=n)]
            if n >= 4:
                cands.append(Mapping(tp=2, dp=n // 2, ep=n))
        if n >= 2:
            cands.append(Mapping(tp=n // 2, pp=2))
        for m in cands:
            if heads % int(m.tp) == 0 and m.ep <= max(arch.num_experts, 1) and m not in out:
                out.append(m)
        n = n * 2 if n * 2 <= max_chips or n == max_chips else max_chips
        if n == max_chips and any(x.chips == max_chips for x in out):
            break
    return out
