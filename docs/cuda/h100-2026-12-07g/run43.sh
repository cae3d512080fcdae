#!/bin/bash
# run43.sh (device): issue 23. The decode attention at one query head a block (the new default) and a thread's two
# pieces before the wait where the grid is one wave (the new default) checked by the CUDA tests, then timed against
# the old settings (KILN_ATTN_GB=8, KILN_MV_TWO=0) at tg128, tg1024 and tg2040; longer splits (KILN_ATTN_KEYS_MIN).
set -u
LIM=${LIM:-500}
. docs/cuda/h100-2026-12-07e/runlib.sh
for t in matvec attention attention_post engine context; do
  step t_$t 120 $W/test_cuda_$t
  grep -E "^FAIL|passed" $L/t_$t.log | tail -4 | sed "s/^/t_$t /" | tee -a $SUM; done
step t_attention_km16 60 env KILN_ATTN_KEYS_MIN=16 KILN_ATTN_GB=8 $W/test_cuda_attention
grep -E "^ok|^FAIL|passed" $L/t_attention_km16.log | tail -4 | sed "s/^/km16 /" | tee -a $SUM
M=/tmp/m; mkdir -p $M
step synth 120 bash -c "$W/kiln synth --shape llama2-7b --type q4_k_m --fast -o $M/7b.gguf && $W/kiln synth --shape tinyllama-1.1b --type q4_k_m --fast -o $M/1b.gguf && $W/kiln synth --shape llama-124m --type q4_k_m --fast -o $M/124m.gguf && $W/kiln synth --shape llama3-8b --type q4_k_m --fast -o $M/8b.gguf"
tg() { local name=$1 n=$2; shift 2; step $name 60 env "$@" $W/kiln bench --gpu -m $M/$MOD.gguf -n $n -r 2 -p 0
  grep -E "tg$n " $L/$name.log | grep -v '^{' | tail -1 | sed "s/^/$name /" | tee -a $SUM; }
for MOD in 1b 124m 7b; do
  tg ${MOD}_new 128 X=1; tg ${MOD}_old 128 KILN_ATTN_GB=8 KILN_MV_TWO=0; tg ${MOD}_two0 128 KILN_MV_TWO=0
  tg ${MOD}_gb8 128 KILN_ATTN_GB=8; tg ${MOD}_km128 128 KILN_ATTN_KEYS_MIN=128; tg ${MOD}_km256 128 KILN_ATTN_KEYS_MIN=256
  tg ${MOD}_newb 128 X=1; tg ${MOD}_oldb 128 KILN_ATTN_GB=8 KILN_MV_TWO=0
done
for MOD in 1b 124m 7b; do
  tg ${MOD}_L_new 1024 X=1; tg ${MOD}_L_old 1024 KILN_ATTN_GB=8 KILN_MV_TWO=0; tg ${MOD}_L_km128 1024 KILN_ATTN_KEYS_MIN=128
done
for MOD in 8b; do tg ${MOD}_new 128 X=1; tg ${MOD}_old 128 KILN_ATTN_GB=8 KILN_MV_TWO=0; tg ${MOD}_newb 128 X=1; tg ${MOD}_L_new 1024 X=1; tg ${MOD}_L_old 1024 KILN_ATTN_GB=8 KILN_MV_TWO=0; done
for MOD in 1b 124m; do tg ${MOD}_omit_attn 128 KILN_BENCH_OMIT=attn; tg ${MOD}_omit_attn_gb8 128 KILN_BENCH_OMIT=attn KILN_ATTN_GB=8; done
for MOD in 1b 7b; do tg ${MOD}_X_new 2040 X=1; tg ${MOD}_X_gb8 2040 KILN_ATTN_GB=8; done
step memcheck_post 90 /usr/local/cuda/bin/compute-sanitizer --tool memcheck $W/test_cuda_attention_post
grep -E "ERROR SUMMARY|passed" $L/memcheck_post.log | tail -3 | tee -a $SUM
tar -cJf $OUT/logs.tar.xz -C $OUT logs && rm -rf $L
echo "total $(( $(date +%s)-T0 ))s"
