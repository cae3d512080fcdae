#!/bin/bash
# run39.sh (device): s13b: a second dxb (KILN_TRAIN_DW_SLACK=1, b) against one (=0, a, run37's default), the head's dW
# forked before its dx matmul in both; alternating, one binary; then test_cuda_train.
# pack: TESTS=test_cuda_train bash .carry/pack.sh
set -u
LIM=${LIM:-400}; . "$(dirname "$0")/runlib.sh" # T0, left, step; the binaries in /tmp/k, the logs in $OUT
row() { grep -A2 "^| config" $L/$1.log | tail -1 | sed "s/^/$1 /" | cut -d'|' -f1-8,10 | tee -a $SUM; }
step train_test 150 $W/test_cuda_train
grep -cE "^ok" $L/train_test.log | sed 's/^/train_test ok: /' | tee -a $SUM; grep -E "^FAIL|^# weight" $L/train_test.log | tee -a $SUM
for r in 1 2 3; do
  for b in a b; do step s124_${b}_$r 60 env KILN_TRAIN_DW_SLACK=$([ $b = a ] && echo 0 || echo 1) $W/kiln bench train --gpu --config 124m -B 16 --steps 30; row s124_${b}_$r; done
done
step s124_b50 60 env KILN_TRAIN_DW_SMS=50 $W/kiln bench train --gpu --config 124m -B 16 --steps 30; row s124_b50
for r in 1 2; do
  for b in a b; do step s350_${b}_$r 60 env KILN_TRAIN_DW_SLACK=$([ $b = a ] && echo 0 || echo 1) $W/kiln bench train --gpu --config 350m -B 16 --steps 20; row s350_${b}_$r; done
done
tar -cJf $OUT/logs.tar.xz -C $OUT logs && rm -rf $L
echo "total $(( $(date +%s)-T0 ))s"
