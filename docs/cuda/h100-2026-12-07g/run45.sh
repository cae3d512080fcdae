#!/bin/bash
# run45.sh (device): issue 23, no new code: the matvec's lanes a row (KILN_MATVEC_GS) and rows a group
# (KILN_MATVEC_WIDE) over the 7B shapes, alone (bench gpu-kernels --matvec) and in the tg128 step, to see what the
# down projection (172 pieces a row on 128 lanes: 44 lanes take a second piece) would gain from another mapping.
set -u
LIM=${LIM:-300}
. docs/cuda/h100-2026-12-07e/runlib.sh
for v in "X=1" "KILN_MATVEC_GS=64" "KILN_MATVEC_GS=32" "KILN_MATVEC_WIDE=0" "KILN_MATVEC_WIDE=1"; do n=gk_${v#*_}; n=${n//=/}
  step $n 60 env $v $W/kiln bench gpu-kernels --quick --matvec
  grep -E "^(7b|1.1b) " $L/$n.log | grep -E " (q4_K|q6_K) " | sed "s/^/$n /" | tee -a $SUM; done
M=/tmp/m; mkdir -p $M
step synth 60 bash -c "$W/kiln synth --shape llama2-7b --type q4_k_m --fast -o $M/7b.gguf && $W/kiln synth --shape tinyllama-1.1b --type q4_k_m --fast -o $M/1b.gguf"
tg() { local name=$1 n=$2; shift 2; step $name 60 env "$@" $W/kiln bench --gpu -m $M/$MOD.gguf -n $n -r 2 -p 0
  grep -E "tg$n " $L/$name.log | grep -v '^{' | tail -1 | sed "s/^/$name /" | tee -a $SUM; }
for MOD in 7b 1b; do tg ${MOD}_def 128 X=1; tg ${MOD}_gs64 128 KILN_MATVEC_GS=64; tg ${MOD}_wide0 128 KILN_MATVEC_WIDE=0
  tg ${MOD}_wide1 128 KILN_MATVEC_WIDE=1; tg ${MOD}_two1 128 KILN_MV_TWO=1; tg ${MOD}_defb 128 X=1; done
tar -cJf $OUT/logs.tar.xz -C $OUT logs && rm -rf $L
echo "total $(( $(date +%s)-T0 ))s"
