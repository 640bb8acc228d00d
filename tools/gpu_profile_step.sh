#!/bin/sh
# Where one decode step's kernels spend their instructions and stalls, on
# the GPU machine, from a gpu_pack.sh folder (docs/GPU_NOTES.md says how):
#   sh tools/gpu_profile_step.sh OUT [BATCH] [SKIP] [COUNT]
# ncu --set full over COUNT kernel launches (graph nodes) after SKIP of
# `llm-engine bench` on rank6 shapes at 8K context, BATCH sequences
# (default 1: one step is 79 launches since run E11, and SKIP 2500 passes
# the prefill and the graph warm-up, as in run L3; a batch prefills each
# sequence, so give it a SKIP of its own: ~24,000 at 64, run H5's
# trace), then per
# kernel: its details (SpeedOfLight, occupancy, warp states) as CSV and
# tools/ncu_regions.py's SASS regions, run here so that only text comes
# back (the source export of a whole step is hundreds of MB).  Times
# under ncu are per kernel, serialized, at the clock ncu sets (base
# unless --clock-control none): read shares, not step times.
# STALLS=1: instead, a few metrics a launch at the real clock (one or two
# passes, seconds for a whole step) and tools/ncu_stalls.py's table in
# OUT/stalls.txt: per kernel its time, instructions and the cycles an
# issued instruction waited on each stall reason (run H7; "no
# instruction" is instruction fetch).
set -e
out=${1:?usage: gpu_profile_step.sh OUT [BATCH] [SKIP] [COUNT]}
batch=${2:-1}
skip=${3:-2500}
count=${4:-79}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0
export LD_LIBRARY_PATH=$PWD/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
ncu=/usr/local/cuda/bin/ncu
rep="$out/step"
if [ "$batch" = 1 ]; then steps="--prompts 8192 --decode 60"
else steps="--prompt 8192 --batch $batch --decode 16"; fi
if [ "${STALLS:-0}" = 1 ]; then
    $ncu --csv --clock-control none --graph-profiling node \
        --metrics "$(python3 tools/ncu_stalls.py --metrics)" \
        --launch-skip "$skip" --launch-count "$count" \
        build/bin/llm-engine bench --synthetic conf/models/deepseek-v4-flash-rank6.json --tp 1 \
        --kv-cache-dtype fp8 $steps > "$out/stalls.csv" 2> "$out/ncu.log"
    python3 tools/ncu_stalls.py "$out/stalls.csv" > "$out/stalls.txt"
    gzip -f "$out/stalls.csv"
    head -n 1 "$out/stalls.txt"
    exit 0
fi
$ncu -o "$rep" -f --set full --import-source no --graph-profiling node \
    --launch-skip "$skip" --launch-count "$count" \
    build/bin/llm-engine bench --synthetic conf/models/deepseek-v4-flash-rank6.json --tp 1 \
    --kv-cache-dtype fp8 $steps > "$out/ncu.log" 2>&1
$ncu --import "$rep.ncu-rep" --page details --csv > "$out/details.csv" 2>> "$out/ncu.log"
$ncu --import "$rep.ncu-rep" --page source --csv --print-source sass 2>> "$out/ncu.log" |
    python3 tools/ncu_regions.py /dev/stdin 0.02 > "$out/regions.txt"
rm -f "$rep.ncu-rep"
gzip -f "$out/details.csv"
grep -c '^==' "$out/regions.txt" | sed 's/^/kernels profiled: /'
