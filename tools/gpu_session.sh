#!/bin/sh
# A device session's standard first call, from the folder tools/gpu_pack.sh
# made (binaries built here): the whole GPU suite (tools/gpu_run.sh), then
# the rank6 benchmarks with every comparison switch on (the default) and
# off (the paths before them), the prefill attention kernel's cases, the
# GEMM modes' drift on the trained demo model and the prefill profile;
# everything into OUT/session.tgz (the
# device tool brings back only a few files) and a summary on stdout.
#   sh tools/gpu_session.sh OUT [SECONDS]
# Steps are skipped once fewer seconds than they need are left.
out=${1:?usage: gpu_session.sh OUT [SECONDS]}
budget=${2:-540}
start=$(date +%s)
left() { echo $((budget - ($(date +%s) - start))); }
w=/tmp/gpu-session.$$
mkdir -p "$w"
export NCCL_NVLS_ENABLE=0     # never NVLink multicast
NO_SANITIZER=1 sh tools/gpu_run.sh "$w/suite" > "$w/suite.txt" 2>&1
export LD_LIBRARY_PATH=$PWD/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
sed -n '/^== machine/,$p' "$w/suite.txt" | grep -E '^==' 
B="build/bin/llm-engine bench --synthetic conf/models/deepseek-v4-flash-rank6.json --tp 1 \
--kv-cache-dtype fp8"
# the paths before this session's switches
OFF="LLM_CUDA_HC_PRE_TAIL=0 LLM_CUDA_INDEXER_TILED=0 LLM_CUDA_MOE_MMA=0 LLM_CUDA_PREFETCH=0"
run() {     # LABEL SECONDS ENV... -- ARGS...: one bench, its decode/prefill lines
    label=$1 t=$2
    shift 2
    [ "$(left)" -gt $((t + 20)) ] || { echo "$label: skipped (time)"; return; }
    envs=
    while [ "$1" != -- ]; do envs="$envs $1"; shift; done
    shift
    env $envs timeout "$t" $B "$@" > "$w/$label.log" 2>&1
    echo "$label: $(grep -E '^(decode|prefill) ' "$w/$label.log" | sed 's/ per step.*//; s/tokens\/s aggregate.*/tok\/s/' | tr '\n' ';')"
}
for i in 1 2; do
    run "decode-new-$i" 90 -- --prompts 8192,131072 --decode 64
    run "decode-old-$i" 90 $OFF -- --prompts 8192,131072 --decode 64
done
run batch-new 120 -- --prompt 8192 --batch 1,8,32,64 --decode 16
run batch-old 120 $OFF -- --prompt 8192 --batch 1,8,32,64 --decode 16
run batch-tiles1 120 LLM_CUDA_MOE_MMA_MIN_T=1 -- --prompt 8192 --batch 1,8 --decode 16
run prefill-fp8 60 LLM_CUDA_GEMM=fp8 -- --prompts 32768,131072 --decode 8
run profile-prefill 60 LLM_CUDA_GEMM=fp8 LLM_CUDA_PROFILE=1 -- --prompts 8192 --decode 2
run decode-1m 150 -- --prompts 1048576 --decode 16
if [ "$(left)" -gt 60 ]; then
    timeout 60 build/tests/gpu/bench_cuda_moe 1 > "$w/moe1.log" 2>&1
    timeout 60 build/tests/gpu/bench_cuda_moe 8 >> "$w/moe1.log" 2>&1
    grep 'moe decode' "$w/moe1.log"
fi
if [ "$(left)" -gt 40 ]; then    # the prefill attention kernel, case by case (run D6's table)
    timeout 40 build/tests/gpu/bench_cuda_attention 8192 > "$w/attention.log" 2>&1
    grep '^attention' "$w/attention.log" | cut -c1-80
fi
if [ "$(left)" -gt 40 ] && command -v python3 > /dev/null; then
    timeout 40 python3 tools/mode_drift.py --backend cuda > "$w/drift.txt" 2>&1
    cat "$w/drift.txt"
fi
tar czf "$out/session.tgz" -C "$w" . && rm -rf "$w"
echo "== done in $(( $(date +%s) - start )) s"
