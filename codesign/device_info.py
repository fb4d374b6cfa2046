"""What the local JAX device is: platform, kind, cores, memory and last-level cache (``python -m codesign.execute``
prints it and builds the device's chip from it, codesign/device_bench.py). CPUs read Linux's /proc and sysfs;
accelerators their allocator's limit, and an assumed cache."""

from __future__ import annotations

import os
import platform as _platform
from pathlib import Path

def device_info() -> dict:
    """Platform, kind, cores, memory and last-level cache of the default JAX device."""
    import jax

    dev = jax.devices()[0]
    info = {"platform": dev.platform, "device_kind": dev.device_kind, "devices": jax.device_count(),
            "jax": jax.__version__}
    if dev.platform == "cpu":
        info["cores"] = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        info["processor"] = _cpu_model() or _platform.processor() or "unknown CPU"
        mem = _meminfo()
        info["memory_bytes"] = mem.get("MemTotal", 0.0)
        info["free_memory_bytes"] = mem.get("MemAvailable", mem.get("MemTotal", 0.0))
        info["memory_source"] = "/proc/meminfo: MemTotal, MemAvailable"
        info["cache_bytes"], info["cache_source"] = _llc_bytes()
    else:
        stats = {}
        try:
            stats = dev.memory_stats() or {}
        except Exception:  # noqa: BLE001 - a backend without memory statistics
            pass
        limit = float(stats.get("bytes_limit", 0.0))
        info["memory_bytes"] = limit
        info["free_memory_bytes"] = limit - float(stats.get("bytes_in_use", 0.0))
        # bytes_limit is what XLA's allocator may use (on GPUs by default 75% of the HBM: XLA_PYTHON_CLIENT_MEM_
        # FRACTION), the budget the reduced model must fit, not the HBM size
        info["memory_source"] = ("memory_stats: the allocator's bytes_limit less bytes_in_use" if limit > 0 else
                                 "unknown: the backend reports no memory statistics")
        info["cache_bytes"], info["cache_source"] = 50.0 * 2 ** 20, "assumed: 50 MiB (an H100/H200-class L2)"
        info["processor"] = dev.device_kind
    return info


def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        return None
    return None


def _meminfo() -> dict:
    out = {}
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            key, rest = line.split(":", 1)
            out[key] = float(rest.split()[0]) * 1024.0
    except (OSError, ValueError, IndexError):
        pass
    return out


def _llc_bytes() -> tuple[float, str]:
    best = (0, 0.0)
    base = Path("/sys/devices/system/cpu/cpu0/cache")
    try:
        for idx in base.glob("index*"):
            level = int((idx / "level").read_text())
            kind = (idx / "type").read_text().strip()
            size = (idx / "size").read_text().strip()
            mult = {"K": 2 ** 10, "M": 2 ** 20, "G": 2 ** 30}.get(size[-1], 1)
            value = float(size.rstrip("KMG")) * mult
            if kind in ("Unified", "Data") and (level, value) > best:
                best = (level, value)
    except (OSError, ValueError):
        pass
    if best[1] > 0:
        return best[1], f"sysfs: L{best[0]} cache of cpu0, {best[1] / 2 ** 20:.0f} MiB"
    return 32.0 * 2 ** 20, "assumed: 32 MiB last-level cache (sysfs reported none)"


__all__ = ["device_info"]
