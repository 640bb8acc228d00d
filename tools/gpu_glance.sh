#!/bin/sh
# The open issues' at-a-glance rows (docs/PERFORMANCE.md) in one short
# device call, from a tools/gpu_pack.sh folder: rank6, FP8 cache; decode B
# = 1 at 8K and 131K, B = 32 and 64 at 8K, the fp8 prefill of 32K (its
# second prompt, as the table's) and 131K -- each run twice, the GPU's
# name first (the issues' targets are an H200's).  About 4 minutes.
#   sh tools/gpu_glance.sh OUT
# Logs in OUT/glance.tgz; one summary line a run on stdout.
out=${1:?usage: gpu_glance.sh OUT}
w=/tmp/gpu-glance.$$
mkdir -p "$w" "$out"
export NCCL_NVLS_ENABLE=0     # never NVLink multicast
export LD_LIBRARY_PATH=$PWD/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
. tools/gpu_links.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$w/gpu.txt"
B="build/bin/llm-engine bench --synthetic conf/models/deepseek-v4-flash-rank6.json --tp 1 \
--kv-cache-dtype fp8"
run() {     # LABEL SECONDS ENV... -- ARGS...
    label=$1 t=$2
    shift 2
    envs=
    while [ "$1" != -- ]; do envs="$envs $1"; shift; done
    shift
    env $envs timeout "$t" $B "$@" > "$w/$label.log" 2>&1 || echo "$label: exit $?"
    echo "$label: $(grep -E '^(decode B|prefill|decode launches)' "$w/$label.log" |
        sed 's/ per sequence.*//; s/, TTFT.*//; s/ kernels per step.*/ kernels a step/; s/  */ /g' | tr '\n' ';')"
}
for i in 1 2; do
    run "decode-$i" 90 -- --prompts 8192,131072 --decode 64
    run "batch-$i" 120 -- --prompt 8192 --batch 32,64 --decode 16
    run "prefill-$i" 90 LLM_CUDA_GEMM=fp8 -- --prompts 32768,32768,131072 --decode 4
done
tar czf "$out/glance.tgz" -C "$w" . && rm -rf "$w"
