#!/bin/bash
# run35.sh (device): the weight gradients' own stream (KILN_TRAIN_DW_STREAM) and the dq helpers (next/dq-helpers, on
# branch s13; pack with TESTS="test_cuda_train_attention test_cuda_train" bash .carry/pack.sh). Tests, the attention
# kernels (the helpers must not move them), the 124m and 350m steps with the stream off and on, then PyTorch beside.
set -u
LIM=${LIM:-540}; . "$(dirname "$0")/runlib.sh" # T0, left, step; the binaries in /tmp/k, the logs in $OUT
row() { grep -A2 "^| config" $L/$1.log | tail -1 | sed "s/^/$1 /" | tee -a $SUM; }
step train_test 150 $W/test_cuda_train
grep -E "^ok|^FAIL|^not ok|^# options" $L/train_test.log | cut -c1-300 | tee -a $SUM
step attn_test 120 $W/test_cuda_train_attention
grep -E "^ok|^FAIL|^not ok" $L/attn_test.log | cut -c1-300 | tee -a $SUM
step gk_attn 60 $W/kiln bench gpu-kernels --attention
grep -E "^ *124m  wgmma|^ *350m  wgmma" $L/gk_attn.log | tee -a $SUM
for r in 1 2 3; do
  step s124_dw0_$r 60 env KILN_TRAIN_DW_STREAM=0 $W/kiln bench train --gpu --config 124m -B 16; row s124_dw0_$r
  step s124_dw1_$r 60 env KILN_TRAIN_DW_STREAM=1 $W/kiln bench train --gpu --config 124m -B 16; row s124_dw1_$r
done
step s124_prio0 60 env KILN_TRAIN_DW_PRIO=0 $W/kiln bench train --gpu --config 124m -B 16; row s124_prio0
for n in 100 66; do
  step s124_sms$n 60 env KILN_TRAIN_DW_SMS=$n $W/kiln bench train --gpu --config 124m -B 16; row s124_sms$n
done
for r in 1 2; do
  step s350_dw0_$r 60 env KILN_TRAIN_DW_STREAM=0 $W/kiln bench train --gpu --config 350m -B 16; row s350_dw0_$r
  step s350_dw1_$r 60 env KILN_TRAIN_DW_STREAM=1 $W/kiln bench train --gpu --config 350m -B 16; row s350_dw1_$r
done
step memcheck 120 env KILN_TEST_ONLY=test_options_same_bits_hs64 compute-sanitizer --tool memcheck $W/test_cuda_train
grep -E "ERROR SUMMARY|^ok|FAIL" $L/memcheck.log | tail -3 | tee -a $SUM
step peer124 110 $W/kiln bench train --gpu --config 124m -B 16 --peer python3 --peer-script .carry/train/torch_llama_train.py; row peer124
tar -cJf $OUT/logs.tar.xz -C $OUT logs && rm -rf $L
echo "total $(( $(date +%s)-T0 ))s"
