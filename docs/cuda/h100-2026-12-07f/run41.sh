#!/bin/bash
# run41.sh (device): issue 23. Late decoding of the Q4_K/Q6_K pieces (KILN_MV_LATE) checked and timed; the decode
# step's in-graph breakdown by leaving steps out (KILN_BENCH_OMIT); the matvec kernel's SASS around its PDL wait.
set -u
LIM=${LIM:-570}
. docs/cuda/h100-2026-12-07e/runlib.sh


step sass 90 bash -c "cuobjdump -sass -fun '_Z13matvec_kernelI10piece_q6_KLi1ELi4ELb0ELb0EEv7mv_args' $W/kiln > $L/sass_q6.txt; cuobjdump -sass -fun '_Z13matvec_kernelI15piece_q6_K_lateLi1ELi4ELb0ELb0EEv7mv_args' $W/kiln > $L/sass_q6_late.txt; cuobjdump -sass -fun '_Z13matvec_kernelI10piece_q4_KLi1ELi4ELb0ELb0EEv7mv_args' $W/kiln > $L/sass_q4.txt; wc -l $L/sass_*.txt"
cat $L/sass.log | tee -a $SUM
for v in 0 1; do step gk_late$v 90 env KILN_MV_LATE=$v $W/kiln bench gpu-kernels --quick --matvec
  grep -E "^(7b|1.1b) " $L/gk_late$v.log | grep -E "q4_K|q6_K" | sed "s/^/late$v /" | tee -a $SUM; done
M=/tmp/m; mkdir -p $M
step synth 120 bash -c "$W/kiln synth --shape llama2-7b --type q4_k_m --fast -o $M/7b.gguf && $W/kiln synth --shape tinyllama-1.1b --type q4_k_m --fast -o $M/1b.gguf && $W/kiln synth --shape llama-124m --type q4_k_m --fast -o $M/124m.gguf"
tg() { local name=$1; shift; step $name 60 env "$@" $W/kiln bench --gpu -m $M/$MOD.gguf -n 128 -r 2
  grep -E "tg128" $L/$name.log | grep -v '^{' | tail -1 | sed "s/^/$name /" | tee -a $SUM; }
for MOD in 7b 1b 124m; do
  for r in a b; do tg ${MOD}_late0$r KILN_MV_LATE=0; tg ${MOD}_late1$r KILN_MV_LATE=1; done
  for o in norm attn prep norm,attn,prep qkv,wo,ffn,down,head qkv wo ffn down; do tg ${MOD}_omit_$o KILN_BENCH_OMIT=$o; done
done
for sk in 300 1520 2130; do step ncu_$sk 60 ncu --clock-control none --kill on -k regex:matvec_kernel --launch-skip $sk --launch-count 1 --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats $W/kiln bench gpu-kernels --quick --matvec
  grep -E "matvec_kernel|Duration|DRAM Throughput|Registers Per|Achieved Occupancy|Theoretical Occupancy|Warp Cycles Per Issued|Block Limit Reg|Grid Size" $L/ncu_$sk.log | tee -a $SUM; done
tar -cJf $OUT/logs.tar.xz -C $OUT logs && rm -rf $L
echo "total $(( $(date +%s)-T0 ))s"
