#!/usr/bin/env bash
# gnnpar's CUDA checks, for a machine with a GPU (CI has none): the kernels built, the studies'
# models trained on the GPU in fp32 and bf16, a saved model predicted, more ranks than GPUs
# (every rank on the CPU, with a message), the quick tour, and the quick test lane.
#
#   OUT=runs/gpu-check PY=python3 bash scripts/gpu_check.sh
#
# Uses the torch already installed (a CUDA build); gnnpar from src/ (no install). Each step is
# bounded by `timeout`; a failed step is reported and the next one runs. What it writes to $OUT:
# env.txt (GPU, driver, versions), steps.tsv (step, exit status, seconds, device, score,
# epoch ms), train.log, tour.md, quick.log.
set -u
OUT=${OUT:-runs/gpu-check}
PY=${PY:-python3}
mkdir -p "$OUT"
work=$(mktemp -d)
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}
export XDG_CACHE_HOME=$work/cache  # datasets and caches: not the user's

{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  lscpu | grep -m1 "Model name"
  $PY -c 'import torch, torch_geometric as g, sys
print("python", sys.version.split()[0], "torch", torch.__version__, "pyg", g.__version__,
      "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version(), torch.cuda.get_device_name(0))'
  $PY -W ignore setup.py -q build_ext --inplace 2>&1 | tail -3
  $PY -c 'from gnnpar.data.sampling import kernel; from gnnpar.models import gat_kernel
print("sampler kernel:", kernel.load() is not None, "gat kernel:", gat_kernel.load() is not None)' 2>&1
} >"$OUT/env.txt" 2>&1

printf 'step\trc\tseconds\tdevice\tprecision\ttest_score\tepoch_ms\n' >"$OUT/steps.tsv"
# step NAME LIMIT_S gnnpar-args...: one `gnnpar train`, its line in steps.tsv
step() {
  local name=$1 limit=$2
  shift 2
  local t0=$SECONDS rc
  echo "=== $name: gnnpar $*" >>"$OUT/train.log"
  timeout "$limit" $PY -m gnnpar train --out "$work/$name" "$@" >>"$OUT/train.log" 2>&1
  rc=$?
  $PY - "$work/$name/result.json" "$name" "$rc" "$((SECONDS - t0))" >>"$OUT/steps.tsv" <<'EOF'
import json, sys
path, name, rc, secs = sys.argv[1:]
try:
    r = json.load(open(path))
    epoch_ms = 1000 * r["max_rank_train_time_s"] / max(r["epochs"], 1)
    row = [r["machine"].get("device"), r["config"]["run"]["precision"],
           f"{r['test_score']:.4f}", f"{epoch_ms:.2f}"]
except (OSError, ValueError, KeyError, TypeError):
    row = ["-", "-", "-", "-"]
print("\t".join([name, rc, secs, *map(str, row)]))
EOF
}

step gat-cora-fp32 120 --dataset cora --model gat --epochs 300 --seed 0
step gat-cora-bf16 120 --dataset cora --model gat --epochs 300 --seed 0 --precision bf16
step gat-citeseer-fp32 120 --dataset citeseer --model gat --epochs 300 --seed 0
step gcn-cluster-fp32 120 --dataset cora --model gcn --partitions 8 --epochs 50 --seed 0
step sage-sampled-fp32 240 --dataset synthetic-reddit --scale 0.1 --model sage --strategy sampled \
  --epochs 2 --batch-size 1024 --fanouts 25,10,10 --seed 0
step sage-sampled-bf16 240 --dataset synthetic-reddit --scale 0.1 --model sage --strategy sampled \
  --epochs 2 --batch-size 1024 --fanouts 25,10,10 --seed 0 --precision bf16
step vig-bf16 180 --dataset synthetic-cifar10 --model vig --batch-size 100 --max-steps 20 --seed 0 \
  --precision bf16
step allreduce-x2-one-gpu 180 --dataset cora --model gcn --strategy allreduce --workers 2 \
  --partitions 8 --epochs 20 --seed 0
echo "=== predict gat-cora-fp32" >>"$OUT/train.log"
t0=$SECONDS
timeout 60 $PY -m gnnpar predict "$work/gat-cora-fp32" >>"$OUT/train.log" 2>&1
printf 'predict\t%s\t%s\t-\t-\t-\t-\n' $? $((SECONDS - t0)) >>"$OUT/steps.tsv"

t0=$SECONDS
timeout 300 $PY -m gnnpar bench --out "$work/tour" >"$OUT/tour.log" 2>&1
printf 'tour\t%s\t%s\t-\t-\t-\t-\n' $? $((SECONDS - t0)) >>"$OUT/steps.tsv"
cp "$work"/tour/*.md "$OUT/tour.md" 2>/dev/null

# QUICK_LIMIT_S=0 leaves the quick lane out (e.g. when it runs beside this script)
if [ "${QUICK_LIMIT_S:-300}" != 0 ]; then
  t0=$SECONDS
  timeout "${QUICK_LIMIT_S:-300}" $PY -m pytest -q -m "not slow" -p no:cacheprovider tests \
    >"$OUT/quick.log" 2>&1
  printf 'quick-lane\t%s\t%s\t-\t-\t-\t-\n' $? $((SECONDS - t0)) >>"$OUT/steps.tsv"
fi
cat "$OUT/steps.tsv"
