#!/bin/bash
# run40.sh (device): main's final build (96c30ce): test_cuda_train, the 124m and 350m steps beside PyTorch compiled,
# and the time to loss (bench/time_to_loss.sh on tinyshakespeare); pack with TESTS=test_cuda_train bash .carry/pack.sh
set -u
T0=$(date +%s); LIM=${LIM:-500}
left() { echo $(( LIM - ($(date +%s) - T0) )); }
W=/tmp/k; rm -rf $W; mkdir -p $W; tar -xJf .carry/bin.tar.xz -C $W
export LD_LIBRARY_PATH=$W/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
L=$OUT/logs; mkdir -p $L; SUM=$OUT/summary.txt
step() { local name=$1 t=$2; shift 2; local l; l=$(left)
  if [ $l -lt 20 ]; then echo "SKIP $name (no time)" | tee -a $SUM; return; fi
  [ $t -gt $((l-10)) ] && t=$((l-10))
  local s; s=$(date +%s); timeout $t "$@" > $L/$name.log 2>&1; local rc=$?
  echo "== $name rc=$rc $(( $(date +%s)-s ))s" | tee -a $SUM; }
row() { grep -A2 "^| config" $L/$1.log | tail -1 | sed "s/^/$1 /" | tee -a $SUM; }
nvidia-smi -L | tee -a $SUM
step train_test 150 $W/test_cuda_train
grep -cE "^ok" $L/train_test.log | sed 's/^/train_test ok: /' | tee -a $SUM; grep -E "^FAIL|^# weight|^# options" $L/train_test.log | tee -a $SUM
step peer124 110 $W/kiln bench train --gpu --config 124m -B 16 --peer python3 --peer-script .carry/train/torch_llama_train.py; row peer124
step peer350 150 $W/kiln bench train --gpu --config 350m -B 16 --peer python3 --peer-script .carry/train/torch_llama_train.py; row peer350
step ttl 150 env KILN=$W/kiln bash bench/time_to_loss.sh .carry/data/tinyshakespeare.txt
tail -12 $L/ttl.log | tee -a $SUM
tar -cJf $OUT/logs.tar.xz -C $OUT logs && rm -rf $L
echo "total $(( $(date +%s)-T0 ))s"
