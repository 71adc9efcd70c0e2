#!/bin/bash
# One prepared pass on a CUDA machine (docs/performance.md, "GPU"): what the device is,
# every algorithm's batched and sequential executions against each other there (and against
# the CPU), whether several launch-bound runs share the device (FedSDR's Table 5.1 round alone
# and four at once), round_speed's workloads with fedshift and the reference both on the
# device, the paper-scale estimate of Table 5.1 CMNIST-8, and the CLI's run path. Each step
# has its own time limit inside one overall deadline, so a slow step cannot take the others'
# results with it; logs and JSON go to $OUT (or ./gpu-out). The order puts first what the
# last lease (H200, 2026-12-01) left unmeasured.
#   FEDSHIFT_DATA=<folder holding mnist/> DEADLINE=500 bash benchmarks/gpu_check.sh
# STEPS="device fedsdr-alone ..." runs only the steps named (default: all, in this order).
# On a lent machine the data must travel with the tree: copy MNIST into a folder that
# .git/info/exclude ignores, carry it, and point FEDSHIFT_DATA there. The tree travels only
# under 64 MiB: docs/results is most of it (move its largest folders aside for the call).
# Only a few files come back from such a machine: everything under $OUT is packed into
# gpu-check.tgz at the end.
set -u
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
FS="$PY -c 'import sys; from fedshift.cli import main; sys.argv[0]=\"fedshift\"; main()'"
END=$((SECONDS + ${DEADLINE:-540}))
step() {  # step NAME SECONDS COMMAND...: run within min(SECONDS, time left), log to $OUT/NAME.log
  local name=$1 limit=$2; shift 2
  local left=$((END - SECONDS)) t0=$SECONDS
  [ -n "${STEPS:-}" ] && [[ " $STEPS " != *" $name "* ]] && return
  [ "$left" -lt 15 ] && { echo "== $name: skipped (deadline)"; return; }
  [ "$limit" -gt "$left" ] && limit=$left
  timeout "$limit" bash -c "$*" > "$OUT/$name.log" 2>&1
  echo "== $name: rc $? in $((SECONDS - t0)) s (limit $limit)"
  tail -3 "$OUT/$name.log" | cut -c1-600
}
step device 20 "nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; $PY -c 'import torch; print(torch.__version__, torch.cuda.get_device_name(0), torch.cuda.is_available())'"
# FedSDR's round fresh and after other methods in one process (4.09 against 6.69 s on the
# H200, 2026-12-01: unexplained)
step fedsdr-rounds 150 "$PY benchmarks/rounds_in_process.py FedSDR --device cuda --rounds 8 > $OUT/fedsdr-rounds.jsonl && $PY benchmarks/rounds_in_process.py FedAvg,FedSR,pFedMe,FedSDR --device cuda --rounds 8 >> $OUT/fedsdr-rounds.jsonl"
step executions 90 "$PY benchmarks/gpu_executions.py > $OUT/executions.jsonl"
# several launch-bound runs at once (each a process with one CPU thread, as --workers starts
# them): FedSDR's Table 5.1 round alone, then four and eight at once
step fedsdr-alone 60 "$FS reproduce thesis-5.1-cmnist8 --estimate --methods FedSDR --set device=cuda --set threads=1 --json > $OUT/fedsdr-alone.json"
for n in 4 8; do
  step "fedsdr-$n" 150 "for i in \$(seq $n); do $FS reproduce thesis-5.1-cmnist8 --estimate --methods FedSDR --set device=cuda --set threads=1 --json > $OUT/fedsdr-$n-\$i.json & done; wait"
done
RS="$PY benchmarks/round_speed.py --device cuda --json"
step w2 150 "$RS --only w2 --rounds 2 > $OUT/w2.json"  # ran past 70 s on the H200 (2026-11-30)
for a in ${W3_ALGORITHMS:-fedsdr}; do  # one process each: a failure stays its own
  step "w3-$a" 90 "$RS --only w3 --quick --rounds 3 --w3-algorithms $a > $OUT/w3-$a.json"
done
step w1 90 "$RS --only w1 --rounds 5 > $OUT/w1.json"
step estimate 150 "$FS reproduce thesis-5.1-cmnist8 --estimate ${ESTIMATE_METHODS:+--methods $ESTIMATE_METHODS} --set device=cuda --json > $OUT/estimate.json"
step cli 40 "$FS run --set algorithm=fedpin --set scenario=cmnist --set scenario.samples=4000 --device cuda --rounds 2 --seed 0 --db $OUT/gpu.db --json && $FS runs --db $OUT/gpu.db"
echo "== done at $SECONDS s"
# what comes back from a lent machine is a few files (eight on 2026-12-01, the first eight
# by name): everything in one archive, and nothing else left beside it
tar -czf /tmp/gpu-check.tgz -C "$OUT" . && find "$OUT" -mindepth 1 -delete && mv /tmp/gpu-check.tgz "$OUT/"
