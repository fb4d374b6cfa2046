#!/usr/bin/env bash
# The one prepared device check (run on a lent GPU machine from the repository root, after .device/prepare.sh here):
# `python -m codesign.execute` on the GPU for a dense, a GQA-MoE and an MLA-MoE workload at reduced depth and real
# widths, each step's measured time against the serving model's prediction for the device described from its own
# micro-benchmarks. One JSON per workload lands in $OUT, with the GPU's identity; stdout gets one line per step.
# CHECK_SMALL=1 shrinks every run to seconds (how this script is tested without a GPU).
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/.device/vendor:$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT=${OUT:-/tmp/device_check}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
{ nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,power.limit --format=csv 2>&1 || true
  "$PY" -c "import jax, numpy; print('jax', jax.__version__, 'numpy', numpy.__version__, jax.devices())" 2>&1
} > "$OUT/device.txt"
cat "$OUT/device.txt"
if [ "${CHECK_SMALL:-0}" = 1 ]; then
  SIZE=(vocab=1024 context=64 prefill_tokens=64 repeats=2 warmup=1 bench.matmul_size=256 bench.repeats=2
        bench.stream_bytes=16777216 kernels=false)
  DENSE=(batch=[1,4] layers=1); MOE=(batch=[1,4] layers=1 experts=16); MLA=(batch=[1,4] layers=4 experts=16); LIMIT=300
else
  # real widths at reduced depth; DeepSeek-R1's first MoE layer is its 4th (execute caps its routed experts to fit)
  # (per-kernel timing compiles every kernel of every step on its own: the dense run only, at 4 layers)
  SIZE=(context=2048 prefill_tokens=2048 repeats=10 warmup=3)
  DENSE=(batch=[1,8,64] layers=4); MOE=(batch=[1,16,128] layers=2 kernels=false)
  MLA=(batch=[1,16,128] layers=4 kernels=false); LIMIT=170
fi
status=0
one() {  # name, then execute's overrides
  local name=$1; shift
  if timeout "$LIMIT" "$PY" -m codesign.execute "$@" "${SIZE[@]}" format=json > "$OUT/$name.json" 2> "$OUT/$name.err"; then
    "$PY" - "$OUT/$name.json" <<'PYEOF'
import json, sys
import yaml
r = json.load(open(sys.argv[1]))
nvidia_k_half = yaml.safe_load(open("conf/serving/calibrated.yaml"))["families"]["nvidia"].get("gemm_k_half", 0.0)
mb = r["microbenchmarks"]
print(f"{r['workload']} ({r['layers']} of {r['model_layers']} layers, {r['exec_dtype']}) on {r['device']['device_kind']}: "
      f"matmul {mb['matmul_flops_per_s'] / 1e12:.1f} TFLOP/s, stream {mb['stream_bytes_per_s'] / 1e12:.2f} TB/s, "
      f"GEMM depth k_half {r['depth_fit']['gemm_k_half']:.0f} (the calibration's NVIDIA set: {nvidia_k_half:.0f})")
a, af = r["attention_sweep"], r["attention_fit"]
print(f"  attention sweep (the model code through XLA, B={a['batch']}, {a['context']} keys): share of the matmul rate "
      + ", ".join(f"g={g} {x * 100:.1f}%" for g, x in zip(a["rows"], af["share_of_matmul_rate"]))
      + f"; fit e_max {af['attention_efficiency_max']:.2f}, rows_half {af['attention_rows_half']:.1f} "
        f"(config {af['config_attention_rows_half']:.0f})")
for s in r["steps"]:
    label = f"decode B={s['batch']}" if s["phase"] == "decode" else f"prefill T={s['tokens']}"
    print(f"  {label}: measured {s['measured_s'] * 1e3:.3f} ms, predicted {s['predicted_s'] * 1e3:.3f} ms, "
          f"pred/meas {s['ratio']:.2f}")
PYEOF
  else
    local rc=$?
    status=1; echo "$name failed (rc $rc): $(tail -c 400 "$OUT/$name.err")"
  fi
}
one llama3_8b workload=llama3_8b "${DENSE[@]}"
one gpt_oss_20b workload=gpt_oss_20b "${MOE[@]}"
one deepseek_r1 workload=deepseek_r1 "${MLA[@]}"
exit $status
