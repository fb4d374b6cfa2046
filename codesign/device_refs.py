"""The reference calls every step of ``codesign.execute`` is timed with: the weight-streaming GEMV that defines
the device's HBM bandwidth and the GEMM row sweep that its efficiency curve is fitted to.

The micro-benchmarks (``codesign.device_bench``) time them once to describe the device; each step is then timed in
rounds with the stream and the sweep rows of its own window (``codesign.device_steps``), and predicted from those
rounds' figures. Their operands stay allocated for the whole run, so the model that is executed must fit beside them
(:func:`references_bytes`).
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class References:
    """The weight-streaming GEMV ``x[1, 8192] @ W[8192, N]`` (the chip's HBM bandwidth) and the GEMM row sweep
    ``x[M, 4096] @ W[4096, N']`` (its efficiency curve), kept as calls with their operands alive so that every step
    is timed in rounds with them (``codesign.execute``): the prediction of a step then rests on the bandwidth and
    the GEMM rates the machine had while the step ran (device_timing.interleaved_samples on why)."""
    dtype: str
    stream: tuple  # (fn, args)
    stream_bytes: float
    stream_shape: str
    k: int
    n: int
    rows: tuple
    sweep: tuple  # (fn, args) per row count

    def calls(self, lo: float = 0, hi: float = float("inf")):
        """The stream GEMV and the sweep's calls with ``lo <= rows <= hi``, and those row counts."""
        keep = [i for i, m in enumerate(self.rows) if lo <= m <= hi]
        return [self.stream] + [self.sweep[i] for i in keep], [self.rows[i] for i in keep]

    def bench(self, times, rows) -> dict:
        """The micro-benchmark entries measured by the calls of :meth:`calls` (their times, in that order)."""
        return {"stream_bytes_per_s": self.stream_bytes / times[0],
                "gemm_sweep": {"k": self.k, "n": self.n, "dtype": self.dtype, "rows": [int(m) for m in rows],
                               "seconds": [float(t) for t in times[1:]]}}


def _stream_bytes(info: dict, bench: dict) -> int:
    return bench["stream_bytes"] or (2 ** 30 if info["platform"] == "cpu" else 2 ** 32)


def references_bytes(info: dict, bench: dict) -> float:
    """Device memory the :class:`References` hold: the streamed weight and the sweep's (half of it)."""
    return 1.5 * _stream_bytes(info, bench) + 2 ** 20


def references(dtype_name: str, info: dict, bench: dict, rows=(1,)) -> References:
    import jax
    import jax.numpy as jnp

    dtype = jnp.dtype(dtype_name)
    item = dtype.itemsize
    gemv = jax.jit(lambda x, w: jnp.dot(x, w, preferred_element_type=jnp.float32))
    k = 8192
    stream = _stream_bytes(info, bench)
    cols = max(stream // (k * item), 8)
    w_stream = jnp.full((k, cols), 0.5, dtype)
    x = jnp.full((1, k), 0.5, dtype)
    # the sweep's weight is half the streamed bytes (beyond the caches, as the model's are)
    kk = 4096
    nn = max(stream // 2 // (kk * item), 8)
    w = jnp.full((kk, nn), 0.5, dtype)
    return References(dtype=dtype_name, stream=(gemv, (x, w_stream)), stream_bytes=float(w_stream.nbytes),
                      stream_shape=f"1x{k} @ {k}x{cols} {dtype_name}", k=kk, n=nn, rows=tuple(int(m) for m in rows),
                      sweep=tuple((gemv, (jnp.full((int(m), kk), 0.5, dtype), w)) for m in rows))
