"""Building blocks shared by the model families: RMSNorm, RoPE (plain, Llama 3, YaRN) and masked GQA attention.

Everything here is traceable with abstract inputs (``jax.make_jaxpr`` / ``jax.eval_shape``): no Python branch looks
at a traced value. Configuration values (RoPE theta, scaling, window sizes) are Python numbers and are folded in
at trace time; the RoPE inverse frequencies are computed once in float64 NumPy, as transformers does in float32
torch at model construction.

References (transformers): ``modeling_rope_utils.py`` (``_compute_default_rope_parameters``,
``_compute_llama3_parameters``, ``_compute_yarn_parameters``), ``modeling_llama.py`` (``LlamaRMSNorm``,
``rotate_half``, ``apply_rotary_pos_emb``), ``modeling_gpt_oss.py`` (``eager_attention_forward`` with sinks),
``modeling_llama4.py`` (``Llama4TextL2Norm``, complex ``apply_rotary_emb``), ``modeling_deepseek_v3.py``
(``apply_rotary_pos_emb_interleave``, ``yarn_get_mscale``).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

# A finite "minus infinity" for masked logits: a fully masked row then softmaxes to uniform instead of NaN (such
# rows only occur for padding queries, whose outputs are never used).
MASK_VALUE = -1e30


# ====================================================================== norms
def rms_norm(x, weight, eps):
    """``weight * x / sqrt(mean(x^2) + eps)`` over the last axis, computed in float32 and cast back to ``x.dtype``
    (LlamaRMSNorm: the normalised activations are cast to the input dtype before the weight multiplies)."""
    xf = x.astype(jnp.float32)
    var = jnp.mean(xf * xf, axis=-1, keepdims=True)
    y = (xf * jax.lax.rsqrt(var + eps)).astype(x.dtype)
    return weight.astype(x.dtype) * y if weight is not None else y


def l2_norm(x, eps):
    """Weightless norm of Llama 4's qk norm (``Llama4TextL2Norm``): ``x * rsqrt(mean(x^2) + eps)``. Despite the
    name transformers normalises by the *mean* of squares (an RMSNorm without weight), and so does this."""
    return rms_norm(x, None, eps)


# ====================================================================== RoPE
def _get(scaling, name, default=None):
    """A RopeScaling field (dataclass) or dict key, ``default`` when absent or None."""
    value = scaling.get(name) if isinstance(scaling, dict) else getattr(scaling, name, None)
    return default if value is None else value


def yarn_get_mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN attention temperature (transformers ``get_mscale`` / DeepSeek ``yarn_get_mscale``)."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def rope_inv_freq(theta: float, scaling, dim: int) -> tuple[np.ndarray, float]:
    """Inverse frequencies ``[dim // 2]`` (float64 NumPy) and the attention factor that multiplies cos and sin.

    ``scaling`` is a :class:`~serving.architecture.RopeScaling` (or a dict with its keys), or None for plain RoPE
    ``inv_freq[i] = theta^(-2i / dim)``. The attention factor is 1 except for YaRN.
    """
    inv_freq = 1.0 / theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    if scaling is None:
        return inv_freq, 1.0
    kind, factor = _get(scaling, "type"), float(_get(scaling, "factor"))
    old_ctx = float(_get(scaling, "original_max_position_embeddings"))
    if kind == "llama3":
        # _compute_llama3_parameters: long wavelengths divided by factor, short kept, smooth ramp in between.
        low, high = float(_get(scaling, "low_freq_factor")), float(_get(scaling, "high_freq_factor"))
        low_freq_wavelen, high_freq_wavelen = old_ctx / low, old_ctx / high
        wavelen = 2 * math.pi / inv_freq
        scaled = np.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
        smooth = (old_ctx / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)
        return np.where(medium, smoothed, scaled), 1.0
    if kind == "yarn":
        # _compute_yarn_parameters (= DeepSeek-V3 inference/model.py precompute_freqs_cis with truncate=True).
        mscale, mscale_all_dim = _get(scaling, "mscale"), _get(scaling, "mscale_all_dim")
        if mscale and mscale_all_dim:
            attention_factor = yarn_get_mscale(factor, mscale) / yarn_get_mscale(factor, mscale_all_dim)
        else:
            attention_factor = yarn_get_mscale(factor)  # gpt-oss: 0.1 ln(32) + 1 = 1.3466
        beta_fast, beta_slow = float(_get(scaling, "beta_fast", 32.0)), float(_get(scaling, "beta_slow", 1.0))
        truncate = _get(scaling, "truncate", True)

        def correction_dim(rotations):
            return dim * math.log(old_ctx / (rotations * 2 * math.pi)) / (2 * math.log(theta))

        lo, hi = correction_dim(beta_fast), correction_dim(beta_slow)
        if truncate:
            lo, hi = math.floor(lo), math.ceil(hi)
        lo, hi = max(lo, 0), min(hi, dim - 1)
        if lo == hi:
            hi += 0.001
        ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - lo) / (hi - lo), 0, 1)
        extrapolation = 1 - ramp  # 1 on the high-frequency dims (kept), 0 on the low ones (interpolated)
        inv = (inv_freq / factor) * (1 - extrapolation) + inv_freq * extrapolation
        return inv, float(attention_factor)
    raise ValueError(f"unknown rope scaling type {kind!r}")


def rope_frequencies(arch_or_theta, head_dim_rot: int, positions, scaling=None):
    """``(cos, sin, attention_factor)`` for the rotary dims of the tokens at ``positions``.

    ``arch_or_theta``: a ModelArchitecture (its ``rope_theta`` and ``rope_scaling`` are used) or the theta itself
    (then ``scaling`` gives the RopeScaling or None). ``positions``: integer array of any shape ``P``; cos and sin
    are float32 ``P + (head_dim_rot // 2,)``, already multiplied by ``attention_factor`` as transformers'
    rotary embeddings do (``cos = emb.cos() * attention_scaling``). The factor is returned for information; it is
    1 except for YaRN (gpt-oss: 1.3466; DeepSeek-V3: mscale / mscale_all_dim = 1, its softmax scale instead gets
    ``deepseek_softmax_mscale(...) ** 2``).
    """
    if hasattr(arch_or_theta, "rope_theta"):
        theta, scaling = arch_or_theta.rope_theta, arch_or_theta.rope_scaling
    else:
        theta = arch_or_theta
    inv_freq, attention_factor = rope_inv_freq(float(theta), scaling, head_dim_rot)
    angles = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq, jnp.float32)
    return jnp.cos(angles) * attention_factor, jnp.sin(angles) * attention_factor, attention_factor


def deepseek_softmax_mscale(scaling) -> float:
    """DeepSeek-V3's extra softmax-scale factor: ``yarn_get_mscale(factor, mscale_all_dim)`` when the YaRN config
    sets ``mscale_all_dim`` (DeepseekV3Attention: ``scaling *= mscale * mscale``), else 1."""
    if scaling is None or _get(scaling, "type") != "yarn" or not _get(scaling, "mscale_all_dim"):
        return 1.0
    return yarn_get_mscale(float(_get(scaling, "factor")), float(_get(scaling, "mscale_all_dim")))


def apply_rope(x, cos, sin, interleaved: bool = False):
    """Rotate ``x [..., T, heads, d]`` by ``cos, sin [..., T, d // 2]`` (broadcast over the heads axis).

    ``interleaved=False``: half-split pairs ``(x[i], x[i + d/2])`` (transformers ``rotate_half``: Llama 2/3,
    Qwen3, gpt-oss ``_apply_rotary_emb``). ``interleaved=True``: adjacent pairs ``(x[2i], x[2i+1])`` as complex
    numbers, output kept interleaved (Meta's Llama 4 ``apply_rotary_emb`` and DeepSeek-V3 ``inference/model.py``
    via ``view_as_complex``). transformers' DeepSeek-V3 ``apply_rotary_pos_emb_interleave`` instead de-interleaves
    first and returns the half-split layout: the same rotated values permuted identically for q and k, hence the
    same q.k. Computed in float32, cast back to ``x.dtype``.
    """
    cos, sin = cos[..., None, :], sin[..., None, :]
    xf = x.astype(jnp.float32)
    if interleaved:
        pairs = xf.reshape(*xf.shape[:-1], -1, 2)
        x0, x1 = pairs[..., 0], pairs[..., 1]
        out = jnp.stack([x0 * cos - x1 * sin, x1 * cos + x0 * sin], axis=-1).reshape(xf.shape)
    else:
        x0, x1 = jnp.split(xf, 2, axis=-1)
        out = jnp.concatenate([x0 * cos - x1 * sin, x1 * cos + x0 * sin], axis=-1)
    return out.astype(x.dtype)


# ====================================================================== attention
def attention_mask(q_positions, k_positions, k_valid=None, *, kind="full", window=None, chunk=None):
    """Boolean ``[B|1, Tq, Tk]``: key visible to query. Causal always (``k_pos <= q_pos``); ``sliding``:
    ``k_pos > q_pos - window`` (the ``window`` latest tokens, itself included; transformers
    ``sliding_window_overlay``); ``chunked``: same chunk ``q_pos // chunk == k_pos // chunk`` (Llama 4
    ``chunked_overlay``); ``k_valid`` masks unused cache slots."""
    qp = jnp.atleast_2d(q_positions)[:, :, None]
    kp = jnp.atleast_2d(k_positions)[:, None, :]
    mask = kp <= qp
    if kind == "sliding":
        mask &= kp > qp - window
    elif kind == "chunked":
        mask &= (qp // chunk) == (kp // chunk)
    elif kind != "full":
        raise ValueError(f"unknown attention kind {kind!r}")
    if k_valid is not None:
        mask &= jnp.atleast_2d(k_valid)[:, None, :]
    return mask


def attention(q, k, v, *, q_positions, k_positions, k_valid=None, kind="full", window=None, chunk=None,
              sinks=None, scale):
    """Grouped-query attention of ``q [B, Tq, Hq, d]`` over ``k [B, Tk, Hkv, d]``, ``v [B, Tk, Hkv, dv]``.

    Query head ``j`` reads kv head ``j // (Hq // Hkv)`` (transformers ``repeat_kv``). Positions ``[B, T]`` or
    ``[T]`` build the mask (:func:`attention_mask`), so prefill (``Tq = Tk``) and decode (``Tq = 1`` against a
    contiguous cache with ``k_valid`` marking the filled slots) are the same code. ``sinks [Hq]``: gpt-oss's
    learned per-head logit, concatenated as an extra softmax column and dropped after normalisation
    (``eager_attention_forward`` in modeling_gpt_oss.py). Logits and softmax in float32; returns
    ``[B, Tq, Hq, dv]`` in ``v.dtype``.
    """
    b, tq, hq, d = q.shape
    hkv = k.shape[2]
    g = hq // hkv
    qg = q.reshape(b, tq, hkv, g, d)
    logits = jnp.einsum("bqhgd,bkhd->bhgqk", qg, k, preferred_element_type=jnp.float32) * scale
    mask = attention_mask(q_positions, k_positions, k_valid, kind=kind, window=window, chunk=chunk)
    logits = jnp.where(mask[:, None, None, :, :], logits, MASK_VALUE)
    if sinks is not None:
        sink = jnp.broadcast_to(sinks.astype(jnp.float32).reshape(1, hkv, g, 1, 1), (*logits.shape[:-1], 1))
        probs = jax.nn.softmax(jnp.concatenate([logits, sink], axis=-1), axis=-1)[..., :-1]
    else:
        probs = jax.nn.softmax(logits, axis=-1)
    out = jnp.einsum("bhgqk,bkhd->bqhgd", probs.astype(v.dtype), v, preferred_element_type=jnp.float32)
    return out.reshape(b, tq, hq, v.shape[-1]).astype(v.dtype)
