#!/bin/bash
# Issue 65's device calls (one H100 or H200; each under 9 minutes): the fused attention
# kernel against the reference at ELECTRA-Base's shapes on the card, then the table of
# ours (the reference attention, `jax`, and the kernel, `jax_fused`) beside PyTorch at its
# strongest (eager with the fused AdamW; the whole step compiled, default and max-autotune),
# best of 3 x 10 steps with the spread of the repetitions.
#
#   part 1: the kernel check at 256 x 12 heads x 128 x 64 and 64 x 12 x 512 x 64, then
#           Base at 256 x 128, bf16: jax, jax_fused, torch, torch_compile, torch_compile_max
#   part 2: Base at 256 x 512 and Small at 128 x 128, bf16: jax, jax_fused, torch_compile
#
# The GPU machines have JAX and PyTorch, no TensorFlow and no Keras: the wheels travel in
# WHEELS (default .gpu_budget/wheels, written by `experiments/gpu_budget.py prepare`; or
# pip download keras==3.15.1 namex optree google-crc32c for Python 3.12 as the device
# README says). The device call (carry: that folder; timeout 600 s):
#   bash bench/gpu_attention_call.sh 1      # then, with the time left, 2
# Writes $OUT/rows.jsonl (every row and the kernel check), $OUT/log<part>.txt, $OUT/gpu.txt.
set -u
part=${1:-1}
wheels=${WHEELS:-.gpu_budget/wheels}
ls "$wheels"/keras-*.whl >/dev/null 2>&1 || { echo "no Keras wheel in $wheels" >&2; exit 1; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site "$wheels"/*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 KERAS_BACKEND=jax
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import jax, torch, transformers, keras; print('jax', jax.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__, 'keras', keras.__version__)"
} | tee -a "$OUT/gpu.txt"
bench="python3 bench/bench_accelerator.py --steps 10 --repeats 3 --precisions bfloat16 \
--compile_precisions bfloat16 --finetune= --jsonl $OUT/rows.jsonl"
quiet() { grep -v "^W0000\|^I0000"; }
if [ "$part" = 1 ]; then
  $bench --kernel_check 256:12:128:64 --cases base:128:256 --check_cases=base:128 \
      --peers jax,jax_fused,torch,torch_compile,torch_compile_max --deadline_s 420 2>&1 \
      | quiet | tee "$OUT/log1.txt"
  $bench --kernel_check 64:12:512:64 --cases= --peers= 2>&1 | quiet | tee -a "$OUT/log1.txt"
else
  $bench --cases base:512:256,small:128:128 --check_cases= \
      --peers jax,jax_fused,torch_compile --deadline_s 420 2>&1 | quiet | tee "$OUT/log2.txt"
fi
