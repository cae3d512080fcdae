# runlib.sh: what every runNN.sh here starts with (factored out after the runs; the steps are as they ran): the
# packed binaries unpacked into $W, the logs under $L, step NAME SECONDS CMD... to run a command within what is left
# of LIM seconds and add its exit status and time to $SUM.
T0=$(date +%s)
left() { echo $(( LIM - ($(date +%s) - T0) )); }
W=/tmp/k; rm -rf $W; mkdir -p $W; tar -xJf .carry/bin.tar.xz -C $W
export LD_LIBRARY_PATH=$W/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
L=$OUT/logs; mkdir -p $L; SUM=$OUT/summary.txt
step() { local name=$1 t=$2; shift 2; local l; l=$(left)
  if [ $l -lt 20 ]; then echo "SKIP $name (no time)" | tee -a $SUM; return; fi
  [ $t -gt $((l-10)) ] && t=$((l-10))
  local s; s=$(date +%s); timeout $t "$@" > $L/$name.log 2>&1; local rc=$?
  echo "== $name rc=$rc $(( $(date +%s)-s ))s" | tee -a $SUM; }
nvidia-smi -L | tee -a $SUM
