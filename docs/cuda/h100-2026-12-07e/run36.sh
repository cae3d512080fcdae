#!/bin/bash
# run36.sh (device): the weight gradients' stream with the classifier's dW on it too (two logits buffers), and the
# side's SM target swept (KILN_TRAIN_DW_SMS) at 124m and 350m; pack with TESTS="test_cuda_train" bash .carry/pack.sh
set -u
LIM=${LIM:-540}; . "$(dirname "$0")/runlib.sh" # T0, left, step; the binaries in /tmp/k, the logs in $OUT
row() { grep -A2 "^| config" $L/$1.log | tail -1 | sed "s/^/$1 /" | cut -d'|' -f1-8 | tee -a $SUM; }
step train_test 150 $W/test_cuda_train
grep -E "^ok|^FAIL|^not ok|^# options" $L/train_test.log | cut -c1-300 | tee -a $SUM
for r in 1 2; do
  for v in off def 33 50 66 80; do
    case $v in off) e="KILN_TRAIN_DW_STREAM=0";; def) e="X=1";; *) e="KILN_TRAIN_DW_SMS=$v";; esac
    step s124_${v}_$r 60 env $e $W/kiln bench train --gpu --config 124m -B 16; row s124_${v}_$r
  done
done
for v in off def 50 66; do
  case $v in off) e="KILN_TRAIN_DW_STREAM=0";; def) e="X=1";; *) e="KILN_TRAIN_DW_SMS=$v";; esac
  step s350_${v} 60 env $e $W/kiln bench train --gpu --config 350m -B 16; row s350_${v}
done
step memcheck 120 env KILN_TEST_ONLY=test_head_chunks_one_stream compute-sanitizer --tool memcheck $W/test_cuda_train
grep -E "ERROR SUMMARY|^ok|FAIL" $L/memcheck.log | tail -3 | tee -a $SUM
tar -cJf $OUT/logs.tar.xz -C $OUT logs && rm -rf $L
echo "total $(( $(date +%s)-T0 ))s"
