#!/bin/bash
# The GPU checks of issues 18 and 34 in one go, for a lent GPU machine: the `gpu` tests (with the
# deepspeed extra installed: a language model under ZeRO-3), then the default
# pipeline with use_gpu + bf16 beside the same run on the CPUs (benchmarks/gpu_pipeline.py), then
# B11 at its gpu size (a ~124M GPT-2 in bf16: tokens/s and MFU of DDP, FSDP and, with the
# deepspeed extra installed, DeepSpeed ZeRO-3 beside a bare loop; B11_S=0 skips it).
#
#   OUT=results-dir PY=python3 bash benchmarks/gpu_check.sh
#
# Run from the repository root with trainflow's dependencies importable by $PY (an installed
# venv, or PYTHONPATH=<unpacked wheels>:. on a machine that reaches no registry). Each step has a
# time limit, so that a hung step still leaves the others' results in $OUT.
set -u
export PYTHONUNBUFFERED=1
PY=${PY:-python3}
OUT=${OUT:?set OUT to a results directory}
mkdir -p "$OUT"
T0=$(date +%s)
stamp() { echo "[gpu-check +$(($(date +%s) - T0))s] $*"; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >"$OUT/nvidia-smi.txt" 2>&1
"$PY" -c "import torch, ray, prefect, mlflow, pyarrow; print('torch', torch.__version__, \
'cuda', torch.cuda.is_available(), 'ray', ray.__version__, 'prefect', prefect.__version__, \
'mlflow', mlflow.__version__, 'pyarrow', pyarrow.__version__)" | tee "$OUT/versions.txt"
stamp "gpu tests"
TRAINFLOW_GPU_RESULT="$OUT/gpu-tests.json" timeout "${TESTS_S:-480}" \
  "$PY" -m pytest -p no:cacheprovider -m gpu tests/gpu -s -v --timeout 300 >"$OUT/pytest-gpu.log" 2>&1
echo "pytest rc=$?"
tail -5 "$OUT/pytest-gpu.log"
stamp "default pipeline: gpu (bf16) and cpu arms"
timeout "${BENCH_S:-300}" "$PY" -m benchmarks.gpu_pipeline --reps "${REPS:-1}" \
  --out "$OUT/gpu.json" >"$OUT/gpu-pipeline.log" 2>&1
echo "bench rc=$?"
tail -30 "$OUT/gpu-pipeline.log"
if [ "${B11_S:-600}" != 0 ]; then
  stamp "B11: causal-LM throughput and MFU, gpu size"
  timeout "${B11_S:-600}" "$PY" -m benchmarks --only B11 --size gpu --reps "${REPS:-1}" \
    --out "$OUT/b11" --no-docs >"$OUT/b11.log" 2>&1
  echo "b11 rc=$?"
  tail -5 "$OUT/b11.log"
fi
stamp "done"
