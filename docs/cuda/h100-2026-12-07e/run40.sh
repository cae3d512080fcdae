#!/bin/bash
# run40.sh (device): main's final build (96c30ce): test_cuda_train, the 124m and 350m steps beside PyTorch compiled,
# and the time to loss (bench/time_to_loss.sh on tinyshakespeare); pack with TESTS=test_cuda_train bash .carry/pack.sh
set -u
LIM=${LIM:-500}; . "$(dirname "$0")/runlib.sh" # T0, left, step; the binaries in /tmp/k, the logs in $OUT
row() { grep -A2 "^| config" $L/$1.log | tail -1 | sed "s/^/$1 /" | tee -a $SUM; }
step train_test 150 $W/test_cuda_train
grep -cE "^ok" $L/train_test.log | sed 's/^/train_test ok: /' | tee -a $SUM; grep -E "^FAIL|^# weight|^# options" $L/train_test.log | tee -a $SUM
step peer124 110 $W/kiln bench train --gpu --config 124m -B 16 --peer python3 --peer-script .carry/train/torch_llama_train.py; row peer124
step peer350 150 $W/kiln bench train --gpu --config 350m -B 16 --peer python3 --peer-script .carry/train/torch_llama_train.py; row peer350
step ttl 150 env KILN=$W/kiln bash bench/time_to_loss.sh .carry/data/tinyshakespeare.txt
tail -12 $L/ttl.log | tee -a $SUM
tar -cJf $OUT/logs.tar.xz -C $OUT logs && rm -rf $L
echo "total $(( $(date +%s)-T0 ))s"
