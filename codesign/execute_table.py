"""The table ``python -m codesign.execute`` prints from its result (the JSON it writes with ``format=json``)."""

from __future__ import annotations

import numpy as np

from codesign.device_attention import describe as describe_attention
from codesign.device_bench import MODE_TEXT, PARAM_MODES

# (JSON key, table label) of the kernel classes, in the order of serving.kernel_table's KIND_* codes
CLASSES = (("gemm", "GEMMs"), ("attention", "attention"), ("moe_experts", "MoE experts"), ("other", "other"))


def _ms(v) -> str:
    return "-" if v is None else f"{v * 1e3:.3f}" if v < 0.01 else f"{v * 1e3:.2f}"


def _label(s: dict) -> str:
    return f"decode B={s['batch']} C={s['context']}" if s["phase"] == "decode" else f"prefill T={s['tokens']}"


def format_table(r: dict, prog: str = "codesign.execute") -> str:
    """The table ``execute`` prints: the device, its micro-benchmarks and fits, then measured against predicted time
    per step and per kernel class, and the other parameter modes' ratios."""
    info, mb = r["device"], r["microbenchmarks"]
    count = f"{info['cores']} cores" if info["platform"] == "cpu" else f"{info['devices']} devices"
    lines = [f"{prog} | {r['workload']}: {r['layers']} of {r['model_layers']} layers "
             f"({', '.join(dict.fromkeys(r['layer_kinds']))}), vocab {r['vocab']}"
             + (f", {r['experts']} experts, moe_impl {r['moe_impl']}" if r["experts"] else "")
             + f" | {info['platform']} ({count}, {info['processor']}) | {r['exec_dtype']} (precision "
               f"{r['precision']})",
             f"device: matmul {mb['matmul_flops_per_s'] / 1e9:.1f} GFLOP/s ({mb['matmul_shape']}) | weight stream "
             f"{mb['stream_bytes_per_s'] / 1e9:.2f} GB/s (GEMV {mb['stream_shape']}; sum-reduce "
             f"{mb['reduce_bytes_per_s'] / 1e9:.2f} GB/s) | cache {r['chip']['sram_capacity_bytes'] / 2 ** 20:.0f} MiB "
             f"at {r['chip']['sram_bandwidth_bytes_per_s'] / 1e9:.1f} GB/s | dispatch {mb['dispatch_s'] * 1e6:.1f} us, "
             f"per kernel {mb['kernel_overhead_s'] * 1e6:.2f} us"]
    if "expert_slice_bytes_per_s" in mb:
        lines.append(f"expert-slice GEMV (the grouped MoE kernel's access): {mb['expert_slice_bytes_per_s'] / 1e9:.2f}"
                     f" GB/s ({mb['expert_slice_shape']}) vs weight stream {mb['stream_bytes_per_s'] / 1e9:.2f} GB/s")
    sw = mb["gemm_sweep"]
    lines.append(f"GEMM row sweep x[M, {sw['k']}] @ [{sw['k']}, {sw['n']}]: M = "
                 + ", ".join(f"{m} {t * 1e3:.1f} ms" for m, t in zip(sw["rows"], sw["seconds"])))
    for name, fit in r["gemm_fits"].items():
        ratios = fit["predicted_over_measured"]
        worst = int(np.argmax(np.abs(np.log(ratios))))
        lines.append(f"  curve fitted to M = {fit['rows'][0]}..{fit['rows'][-1]} ({name}): e_max "
                     f"{fit['gemm_efficiency_max']:.2f}, rows_half {fit['gemm_rows_half']:.1f}; fit pred/meas "
                     f"{min(ratios):.2f}..{max(ratios):.2f} (worst at M = {fit['rows'][worst]})"
                     + (f"; rows and weight stream ({fit['stream_bytes_per_s'] / 1e9:.2f} GB/s) timed with the step"
                        if "stream_bytes_per_s" in fit else ""))
    ds, df = mb["depth_sweep"], r["depth_fit"]
    lines.append(f"GEMM depth sweep x[{ds['m']}, K] @ [K, {ds['n']}]: K = "
                 + ", ".join(f"{k} {2 * ds['m'] * k * ds['n'] / t / 1e9:.0f}" for k, t in zip(ds["k"], ds["seconds"]))
                 + f" GFLOP/s; rate x K / (K + k_half) fits k_half {df['gemm_k_half']:.0f} (pred/meas "
                   f"{min(df['predicted_over_measured']):.2f}..{max(df['predicted_over_measured']):.2f}; the serving "
                   f"config's gemm_k_half {df['config_gemm_k_half']:.0f}"
                   + ("; the prediction's" if r["serving_params_mode"] in ("phase", "run") else "") + ")")
    lines.append(describe_attention(r["attention_sweep"], r["attention_fit"]))
    lines.append(f"serving params: {r['serving_params_mode']} ({MODE_TEXT[r['serving_params_mode']]}); measured: "
                 f"{r['stat']} of {r['repeats']} runs after {r['warmup']} warm-up")
    head = ("step", "class", "measured ms", "predicted ms", "pred/meas")
    body = []
    for s in r["steps"]:
        body.append((_label(s), "step", _ms(s["measured_s"]), _ms(s["predicted_s"]), f"{s['ratio']:.2f}"))
        cm = s.get("classes_measured_s")
        for key, name in CLASSES:
            p = s["classes_predicted_s"][key]
            m = cm[key] if cm else None
            if p < 1e-5 and not m:
                continue
            body.append(("", name, _ms(m), _ms(p), f"{p / m:.2f}" if m else "-"))
        if cm:
            alone = s["predicted_s"] - s["step_overhead_s"]
            body.append(("", "kernels alone", _ms(s["kernels_alone_s"]), _ms(alone),
                         f"{alone / s['kernels_alone_s']:.2f}"))
    widths = [max(len(h), *(len(row[i]) for row in body)) for i, h in enumerate(head)]
    fmt = lambda row: "  ".join(v.ljust(w) if i < 2 else v.rjust(w)  # noqa: E731
                                for i, (v, w) in enumerate(zip(row, widths)))
    lines += [fmt(head)] + [fmt(row) for row in body]
    for mode in PARAM_MODES:
        if mode != r["serving_params_mode"]:
            ratios = ", ".join(f"{_label(s)} {s['predicted_s_by_params'][mode] / s['measured_s']:.2f}"
                               for s in r["steps"])
            lines.append(f"pred/meas with params={mode}: {ratios}")
    lines += [f"note: {n}" for n in r["notes"]]
    return "\n".join(lines)


__all__ = ["CLASSES", "format_table"]
