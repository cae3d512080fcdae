#!/bin/bash
# run44 (device): test_cuda_attention alone under the new defaults (one query head a decode block), with the time it
# needs (227 s on the device's CPU oracle; run43 gave it 120 s and cut it off after its first test).
W=/tmp/k; rm -rf $W; mkdir -p $W; tar -xJf .carry/bin.tar.xz -C $W; export LD_LIBRARY_PATH=$W/lib:/usr/local/cuda/lib64
s=$(date +%s); timeout 470 stdbuf -oL $W/test_cuda_attention > $OUT/t_attention.log 2>&1; echo "rc=$? $(( $(date +%s)-s ))s"
