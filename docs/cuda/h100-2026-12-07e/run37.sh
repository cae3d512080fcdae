#!/bin/bash
# run37.sh (device): the default (the weight gradients' stream on half the SMs) against one stream, 30 steps each,
# alternating, then 124m and 350m beside PyTorch compiled; pack with TESTS="test_cuda_train" bash .carry/pack.sh
set -u
LIM=${LIM:-540}; . "$(dirname "$0")/runlib.sh" # T0, left, step; the binaries in /tmp/k, the logs in $OUT
row() { grep -A2 "^| config" $L/$1.log | tail -1 | sed "s/^/$1 /" | tee -a $SUM; }
step train_test 150 $W/test_cuda_train
grep -cE "^ok" $L/train_test.log | sed 's/^/train_test ok: /' | tee -a $SUM; grep -E "^FAIL" $L/train_test.log | tee -a $SUM
for r in 1 2 3; do
  step s124_off_$r 60 env KILN_TRAIN_DW_STREAM=0 $W/kiln bench train --gpu --config 124m -B 16 --steps 30; row s124_off_$r
  step s124_def_$r 60 $W/kiln bench train --gpu --config 124m -B 16 --steps 30; row s124_def_$r
done
for r in 1 2; do
  step s350_off_$r 60 env KILN_TRAIN_DW_STREAM=0 $W/kiln bench train --gpu --config 350m -B 16 --steps 20; row s350_off_$r
  step s350_def_$r 60 $W/kiln bench train --gpu --config 350m -B 16 --steps 20; row s350_def_$r
done
step peer124 110 $W/kiln bench train --gpu --config 124m -B 16 --peer python3 --peer-script .carry/train/torch_llama_train.py; row peer124
step peer350 150 $W/kiln bench train --gpu --config 350m -B 16 --peer python3 --peer-script .carry/train/torch_llama_train.py; row peer350
tar -cJf $OUT/logs.tar.xz -C $OUT logs && rm -rf $L
echo "total $(( $(date +%s)-T0 ))s"
