"""Kimi K2.5's MoonViT vision tower and its patch-merger projector, from a
:class:`~serving.architecture.VisionTower`.

Follows Kimi-VL ``modeling_kimi_vl.py`` (``MoonVisionPatchEmbed``, ``Learnable2DInterpPosEmb``,
``Rope2DPosEmb``, ``MoonVitEncoderLayer``, ``MoonVitEncoder``, ``patch_merger``, ``KimiVLMultiModalProjector``),
which ``VisionTower``'s docstring and parameter count describe::

    patches  = Conv2d(C -> d, kernel = stride = patch)(pixels) + pos_emb            # patch_embed (+ bias)
    pos_emb  = learned [gh0, gw0, d] grid, resized (cubic) to the image's patch grid when it differs
    block    x += wo(attn(RoPE2D(wqkv(LN0(x)))));  x += fc1(gelu_tanh(fc0(LN1(x))))  # biases everywhere
    encoder  LN(x)                                                                   # final_layernorm
    merge    each merge x merge window of patches -> one row of merge^2 * d (row-major inside the window)
    project  LN(d) per patch -> concat -> linear_1 (merge^2 d -> P) -> GELU -> linear_2 (P -> text hidden)

Choices where the config says nothing (documented, not published in ``VisionTower``):

- Attention is bidirectional over one image's patches, softmax scale ``head_dim^-0.5``; MoonViT's 2D RoPE
  (``Rope2DPosEmb``, theta 10000, no parameters): of each head's ``head_dim / 2`` complex pairs, pair ``2j``
  rotates by ``col * theta^(-4j / head_dim)`` and pair ``2j + 1`` by ``row * theta^(-4j / head_dim)``.
- LayerNorm eps 1e-5 (torch default; the projector's ``pre_norm`` also 1e-5); the ViT MLP uses tanh-GELU
  (``PytorchGELUTanh``), the projector exact GELU (``nn.GELU``).
- Position-embedding resize: ``jax.image.resize(method="cubic")`` (Keys a = -0.5), where torch's bicubic
  ``F.interpolate`` uses a = -0.75: equal when the image's grid is the learned grid, slightly different otherwise.
- The patch-embedding kernel is stored as a matrix ``[patch * patch * C, d]`` over patches flattened in
  ``(row, col, channel)`` order (a Conv2d weight ``[d, C, p, p]`` transposed): same parameters and FLOPs.
- Kimi K2.5's video path (temporal patches / pooling) is not modelled: images only.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from serving.models.common import apply_rope
from serving.models.params import ParamSpec, const, materialize, normal

LN_EPS = 1e-5
ROPE_THETA = 10000.0


def layer_norm(x, p, eps=LN_EPS):
    """LayerNorm with weight ``p["scale"]`` and bias ``p["bias"]``, in float32, cast back."""
    xf = x.astype(jnp.float32)
    mean = jnp.mean(xf, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(xf - mean), axis=-1, keepdims=True)
    y = (xf - mean) * jax.lax.rsqrt(var + eps)
    return (y * p["scale"].astype(jnp.float32) + p["bias"].astype(jnp.float32)).astype(x.dtype)


def dense(x, p):
    """``x @ kernel + bias`` with float32 accumulation."""
    y = jnp.dot(x, p["kernel"], preferred_element_type=jnp.float32) + p["bias"].astype(jnp.float32)
    return y.astype(x.dtype)


def rope_2d(grid_h: int, grid_w: int, head_dim: int):
    """``cos, sin [grid_h * grid_w, head_dim / 2]`` of MoonViT's ``Rope2DPosEmb`` for a row-major patch grid."""
    freqs = 1.0 / ROPE_THETA ** (np.arange(0, head_dim, 4)[: head_dim // 4] / head_dim)  # [head_dim / 4]
    pos = np.arange(grid_h * grid_w)
    col, row = pos % grid_w, pos // grid_w
    angles = np.stack([np.outer(col, freqs), np.outer(row, freqs)], axis=-1).reshape(len(pos), head_dim // 2)
    return jnp.asarray(np.cos(angles), jnp.float32), jnp.asarray(np.sin(angles), jnp.float32)


class VisionEncoder:
    """MoonViT + projector of one :class:`~serving.architecture.VisionTower` (parameters: ``params["vision"]``)."""

    def __init__(self, vt):
        self.vt = vt
        self.head_dim = vt.hidden_size // vt.num_heads
        if self.head_dim % 4:
            raise ValueError(f"2D RoPE needs head_dim divisible by 4, got {self.head_dim}")

    def param_specs(self) -> dict:
        """The ``params["vision"]`` tree as :class:`~serving.models.params.ParamSpec` leaves."""
        vt = self.vt
        d, m, C, p = vt.hidden_size, vt.intermediate_size, vt.in_channels, vt.patch_size

        def lin(n_in, n_out):
            return {"kernel": normal((n_in, n_out), n_in), "bias": const((n_out,), 0)}

        def ln(n):
            return {"scale": const((n,), 1), "bias": const((n,), 0)}

        specs = {"patch_embed": lin(p * p * C, d)}
        if vt.pos_emb_grid:
            specs["pos_emb"] = ParamSpec((*vt.pos_emb_grid, d), std=0.02)
        specs["blocks"] = [{"norm0": ln(d), "qkv": lin(d, 3 * d), "o_proj": lin(d, d), "norm1": ln(d),
                            "fc0": lin(d, m), "fc1": lin(m, d)} for _ in range(vt.num_layers)]
        specs["final_norm"] = ln(d)
        specs["projector"] = {"pre_norm": ln(d), "linear_1": lin(d * vt.merge_size ** 2, vt.projector_hidden_size),
                              "linear_2": lin(vt.projector_hidden_size, vt.projector_output_size)}
        return specs

    def init(self, key, dtype=jnp.float32) -> dict:
        return materialize(self.param_specs(), key, dtype)

    def num_tokens(self, height: int, width: int) -> int:
        """Image tokens of one ``height x width`` image after the merge."""
        vt = self.vt
        return (height // vt.patch_size // vt.merge_size) * (width // vt.patch_size // vt.merge_size)

    def _block(self, i, p, x, rope):
        n, s, d = x.shape
        heads, hd = self.vt.num_heads, self.head_dim
        with jax.named_scope(f"vision/block_{i}/norm0"):
            h = layer_norm(x, p["norm0"])
        with jax.named_scope(f"vision/block_{i}/qkv"):
            # MoonVitEncoderLayer.attention_qkvpacked: wqkv(x).view(..., 3, heads, head_dim)
            qkv = dense(h, p["qkv"]).reshape(n, s, 3, heads, hd)
            cos, sin = rope
            q = apply_rope(qkv[:, :, 0], cos, sin, interleaved=True)
            k = apply_rope(qkv[:, :, 1], cos, sin, interleaved=True)
            v = qkv[:, :, 2]
        with jax.named_scope(f"vision/block_{i}/attention"):
            logits = jnp.einsum("nqhd,nkhd->nhqk", q, k, preferred_element_type=jnp.float32) * hd ** -0.5
            probs = jax.nn.softmax(logits, axis=-1).astype(v.dtype)
            o = jnp.einsum("nhqk,nkhd->nqhd", probs, v, preferred_element_type=jnp.float32).astype(x.dtype)
        with jax.named_scope(f"vision/block_{i}/o_proj"):
            x = x + dense(o.reshape(n, s, d), p["o_proj"])
        with jax.named_scope(f"vision/block_{i}/norm1"):
            h = layer_norm(x, p["norm1"])
        with jax.named_scope(f"vision/block_{i}/mlp"):
            h = jax.nn.gelu(dense(h, p["fc0"]).astype(jnp.float32), approximate=True).astype(x.dtype)
            return x + dense(h, p["fc1"])

    def encode(self, params, pixels):
        """``pixels [N, H, W, C]`` (H, W multiples of ``patch * merge``) -> ``[N, tokens, projector_output]``."""
        vt = self.vt
        n, height, width, c = pixels.shape
        p, k = vt.patch_size, vt.merge_size
        gh, gw = height // p, width // p
        if gh * p != height or gw * p != width or gh % k or gw % k:
            raise ValueError(f"image {height}x{width} is not a whole number of {p * k}-pixel merge windows")
        x = pixels.astype(params["patch_embed"]["kernel"].dtype)
        with jax.named_scope("vision/patch_embed"):
            patches = x.reshape(n, gh, p, gw, p, c).transpose(0, 1, 3, 2, 4, 5).reshape(n, gh * gw, p * p * c)
            x = dense(patches, params["patch_embed"])
        if "pos_emb" in params:
            with jax.named_scope("vision/pos_emb"):
                pos = params["pos_emb"]
                if pos.shape[:2] != (gh, gw):  # Learnable2DInterpPosEmb: interpolate the learned grid
                    pos = jax.image.resize(pos.astype(jnp.float32), (gh, gw, pos.shape[-1]), "cubic")
                x = x + pos.reshape(1, gh * gw, -1).astype(x.dtype)
        rope = rope_2d(gh, gw, self.head_dim)
        for i, bp in enumerate(params["blocks"]):
            x = self._block(i, bp, x, rope)
        with jax.named_scope("vision/final_norm"):
            x = layer_norm(x, params["final_norm"])
        with jax.named_scope("vision/merge"):
            # patch_merger: view(new_h, k, new_w, k, d).permute(0, 2, 1, 3, 4) -> [new_h * new_w, k * k, d]
            x = x.reshape(n, gh // k, k, gw // k, k, -1).transpose(0, 1, 3, 2, 4, 5)
            x = x.reshape(n, (gh // k) * (gw // k), k * k, -1)
        pp = params["projector"]
        with jax.named_scope("vision/projector"):
            # KimiVLMultiModalProjector: pre_norm(features).view(-1, d * k^2) -> linear_1 -> GELU -> linear_2
            x = layer_norm(x, pp["pre_norm"]).reshape(n, x.shape[1], -1)
            x = jax.nn.gelu(dense(x, pp["linear_1"]).astype(jnp.float32), approximate=False).astype(x.dtype)
            return dense(x, pp["linear_2"])
