#!/bin/bash
# One device call: the torch.compile peer, the hashed dropout against the old draw, float32.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 KERAS_BACKEND=jax
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu.txt
python3 -c "import jax, torch, transformers; print(jax.__version__, torch.__version__, transformers.__version__)" | tee -a $OUT/gpu.txt
END=555
left() { echo $((END - SECONDS)); }
B="python3 bench/bench_accelerator.py --finetune= --check_cases= --steps 10 --repeats 3"
O="python3 .oldtree/bench/bench_accelerator.py --finetune= --check_cases= --steps 10 --repeats 3"
echo "== 1 torch_compile base128 bf16 (t=$SECONDS)"
$B --cases base:128:256 --peers torch_compile --precisions bfloat16 --jsonl $OUT/rows.jsonl 2>&1 | grep -v "^W0000\|^I0000" | tee $OUT/log1.txt
echo "== 2 ours, hashed dropout, base128 bf16 (t=$SECONDS)"
$B --cases base:128:256 --peers jax --precisions bfloat16 --jsonl $OUT/rows.jsonl --deadline_s $(left) 2>&1 | grep -v "^W0000\|^I0000" | tee $OUT/log2.txt
echo "== 3 ours, old dropout, base128 bf16 (t=$SECONDS)"
[ $(left) -gt 120 ] && $O --cases base:128:256 --peers jax --precisions bfloat16 --jsonl $OUT/rows_old.jsonl 2>&1 | grep -v "^W0000\|^I0000" | tee $OUT/log3.txt
echo "== 4 torch_compile small128 bf16 (t=$SECONDS)"
[ $(left) -gt 80 ] && $B --cases small:128:128 --peers torch_compile --precisions bfloat16 --jsonl $OUT/rows.jsonl 2>&1 | grep -v "^W0000\|^I0000" | tee $OUT/log4.txt
echo "== 5 float32 base128: torch eager, ours (t=$SECONDS)"
[ $(left) -gt 40 ] && $B --cases base:128:256 --peers torch,jax --precisions float32 --jsonl $OUT/rows.jsonl --deadline_s $(($(left) - 100)) 2>&1 | grep -v "^W0000\|^I0000" | tee $OUT/log5.txt
echo "== done (t=$SECONDS)"
