#!/bin/sh
# Before and after in one device call, for a change without a switch (the
# issues ask every speed change for both in the same call; runs E1, E3-E4):
#
#   here:  make -j2 CUDA=1 gpu-tests && sh tools/gpu_ab.sh base .xfer/base
#          (on main, before the change: its binaries become "old")
#          make -j2 CUDA=1 gpu-tests && sh tools/gpu_pack.sh .xfer/m
#          (with the change: "new")
#   there: carry [".xfer/m", ".xfer/base"]; cd .xfer/m && tar xJf pack.txz
#          && cd pack && sh tools/gpu_ab.sh run $OUT [SECONDS] [STEPS]
#          (steps suite, switches and kernels alone: no base needed)
#
# STEPS, in order, each skipped once fewer seconds are left than it needs
# (default "suite attention decode prefill batch"):
#   suite      tools/gpu_run.sh on the new binaries (the whole GPU suite)
#   attention  bench_cuda_attention 8192, old and new alternated twice
#   moe        bench_cuda_moe 1 and 8, old and new
#   decode     rank6 fp8 cache --prompts 8192,131072 --decode 64, twice each
#   prefill    LLM_CUDA_GEMM=fp8 --prompts 32768,32768,131072, twice each
#   batch      --prompt 8192 --batch 1,8,32,64 --decode 16, once each
#   batch2     the same with each step's graph time (LLM_CUDA_GRAPH_TIME=1),
#              old and new alternated twice (issue 15's rows; ~20 s a run)
#   tiles      bench_cuda_moe 32 and 64 (the expert tiles on tensor cores,
#              their default two blocks an SM), old and new alternated twice
#   kernels    test_cuda_kernels on the new binaries with the filters in
#              $AB_KERNELS (default "moe"), its ok / not ok counts
#   long       LLM_CUDA_GEMM=fp8 --prompts 1048576 --decode 4 (issue 14's 1M
#              prompt, ~35 s a run), once each
#   profile    LLM_CUDA_PROFILE=1 fp8 --prompts 131072: the big ops' ms, once each
#   switches   the new binaries alone, as they are and under each of
#              $AB_SWITCHES (space-separated VAR=VALUE, e.g.
#              "LLM_CUDA_LT_TUNE=8 LLM_CUDA_LT_TUNE=16"),
#              alternated twice: --prompt 8192 --batch $AB_BATCH (default
#              32,64) --decode 16, with each step's graph time (~16 s a
#              run of 1,8,32,64 on an H100; each needs 70 s left)
# A summary on stdout as it goes; every log in OUT/ab.tgz at the end.
set -u
mode=${1:?usage: gpu_ab.sh base DEST | run OUT [SECONDS] [STEPS]}

if [ "$mode" = base ]; then
    set -e
    dest=${2:?usage: gpu_ab.sh base DEST}
    rm -rf "$dest"
    mkdir -p "$dest/b"
    cp build/bin/llm-engine build/tests/gpu/bench_cuda_attention build/tests/gpu/bench_cuda_moe \
        "$dest/b/"
    strip "$dest"/b/*
    XZ_OPT="-6 -T2" tar cJf "$dest/base.txz" -C "$dest" b
    rm -rf "$dest/b"
    du -sh "$dest/base.txz"
    exit 0
fi

[ "$mode" = run ] || { echo "usage: gpu_ab.sh base DEST | run OUT [SECONDS] [STEPS]" >&2; exit 2; }
out=${2:?usage: gpu_ab.sh run OUT [SECONDS] [STEPS]}
budget=${3:-540}
steps=${4:-suite attention decode prefill batch}
start=$(date +%s)
left() { echo $((budget - ($(date +%s) - start))); }
w=/tmp/gpu-ab.$$
mkdir -p "$w" "$out"
base=${BASE:-../../base/base.txz}
# (suite, switches and kernels run the new binaries alone: no base needed)
if [ -n "$(echo " $steps " | sed 's/ suite / /g; s/ switches / /g; s/ kernels / /g; s/ //g')" ]; then
    tar xJf "$base" || { echo "gpu_ab.sh: no $base (gpu_ab.sh base, carried)" >&2; exit 1; }
fi
export NCCL_NVLS_ENABLE=0     # never NVLink multicast
export LD_LIBRARY_PATH=$PWD/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
. tools/gpu_links.sh

# LABEL SECONDS ENV... -- BIN ARGS...: one run logged with its exit
# status, if time is left; false when skipped or failed (said so)
one() {
    ol=$1 ot=$2
    shift 2
    [ "$(left)" -gt $((ot + 10)) ] || { echo "$ol: skipped (time)"; return 1; }
    oe=
    while [ "$1" != -- ]; do oe="$oe $1"; shift; done
    shift
    env $oe timeout "$ot" "$@" > "$w/$ol.log" 2>&1
    rc=$?
    echo "exit $rc" >> "$w/$ol.log"
    [ $rc = 0 ] && return 0
    echo "$ol: exit $rc ($(tail -n 2 "$w/$ol.log" | head -n 1 | cut -c1-100))"
    return 1
}
bench() {   # LABEL SECONDS ENV... -- ARGS...: old and new llm-engine bench
    label=$1 t=$2
    shift 2
    envs=
    while [ "$1" != -- ]; do envs="$envs $1"; shift; done
    shift
    for v in old new; do
        bin=b/llm-engine
        [ $v = new ] && bin=build/bin/llm-engine
        one "$label-$v" "$t" $envs -- $bin bench --synthetic \
            conf/models/deepseek-v4-flash-rank6.json --tp 1 --kv-cache-dtype fp8 "$@" || continue
        echo "$label $v: $(grep -E '^(prefill|decode B)' "$w/$label-$v.log" | sed 's/ per step.*//;
            s/TTFT.*steps); //; s/tokens\/s aggregate.*/tok\/s/; s/  */ /g' | tr '\n' ';')"
    done
}
# a batched bench log's rows on one line: "B=32 3.61 ms (graph 3.594 ms) ..."
graph_rows() {
    grep -E '^decode (B=|device)' "$1" | sed -E \
        's/^decode (B=[0-9]+) .*: ([0-9.]+ ms)\/token.*/\1 \2/; s/^decode device +([0-9.]+ ms).*/(graph \1)/' |
        tr '\n' ' '
}
for s in $steps; do
    case $s in
    suite)
        # (the whole suite took 282 s on an H100 in run B2: it gets what
        # is left, and a cut one says which parts ran; run B1's fixed 280
        # s cut it silently)
        [ "$(left)" -gt 200 ] || { echo "suite: skipped (time)"; continue; }
        st=$(($(left) - 15))
        NO_SANITIZER=1 timeout "$st" sh tools/gpu_run.sh "$w/suite" > "$w/suite.txt" 2>&1
        rc=$?
        sed -n '/^== machine/,$p' "$w/suite.txt" | grep -E '^==' | grep -v tokens | cut -c1-120
        if [ $rc = 124 ]; then
            echo "suite: cut after $st s; the logs it left:"
            for f in "$w"/suite/*.log; do
                [ -f "$f" ] || continue
                echo "  ${f##*/}: $(grep -c '^ok' "$f") ok, $(grep -c '^not ok' "$f") not ok"
            done
        fi ;;
    attention)
        for i in 1 2; do for v in old new; do
            bin=b/bench_cuda_attention
            [ $v = new ] && bin=build/tests/gpu/bench_cuda_attention
            one "attention-$v-$i" 40 -- $bin 8192 || continue
            echo "attention $v: $(grep '^attention' "$w/attention-$v-$i.log" | awk '{ print $2, $4, $6 }' |
                tr '\n' ';')"
        done; done ;;
    moe)
        for v in old new; do
            bin=b/bench_cuda_moe
            [ $v = new ] && bin=build/tests/gpu/bench_cuda_moe
            one "moe-$v" 100 -- sh -c "$bin 1 && $bin 8" || continue
            echo "moe $v: $(grep 'moe decode' "$w/moe-$v.log" | tr -s ' ' | tr '\n' ';')"
        done ;;
    decode)
        for i in 1 2; do bench "decode-$i" 60 -- --prompts 8192,131072 --decode 64; done ;;
    prefill)
        for i in 1 2; do bench "prefill-$i" 60 LLM_CUDA_GEMM=fp8 -- --prompts 32768,32768,131072 \
            --decode 4; done ;;
    batch)
        bench batch 100 -- --prompt 8192 --batch 1,8,32,64 --decode 16 ;;
    batch2)
        for i in 1 2; do for v in old new; do
            bin=b/llm-engine
            [ $v = new ] && bin=build/bin/llm-engine
            l="batch2-$v-$i"
            one "$l" 60 LLM_CUDA_GRAPH_TIME=1 -- $bin bench --synthetic \
                conf/models/deepseek-v4-flash-rank6.json --tp 1 --kv-cache-dtype fp8 --prompt 8192 \
                --batch 1,8,32,64 --decode 16 || continue
            echo "batch2 $v ($i): $(graph_rows "$w/$l.log")"
        done; done ;;
    tiles)
        for i in 1 2; do for v in old new; do
            bin=b/bench_cuda_moe
            [ $v = new ] && bin=build/tests/gpu/bench_cuda_moe
            one "tiles-$v-$i" 60 -- sh -c "$bin 32 && $bin 64" || continue
            echo "tiles $v ($i): $(grep -E 'moe decode T=(32|64) .*2 blocks/SM' "$w/tiles-$v-$i.log" |
                sed -E 's/.*(T=[0-9]+) .*: +([0-9.]+ us) +([0-9]+ GB\/s).*/\1 \2 \3/' | tr '\n' ';')"
        done; done ;;
    kernels)
        for f in ${AB_KERNELS:-moe}; do
            one "kernels-$f" 200 -- build/tests/gpu/test_cuda_kernels "$f"
            echo "kernels $f: $(grep -c '^ok' "$w/kernels-$f.log") ok, $(grep -c '^not ok' \
                "$w/kernels-$f.log") not ok"
            grep '^not ok' "$w/kernels-$f.log" | head -n 5
        done ;;
    long)
        bench long 100 LLM_CUDA_GEMM=fp8 -- --prompts 1048576 --decode 4 ;;
    profile)
        bench profile 60 LLM_CUDA_GEMM=fp8 LLM_CUDA_PROFILE=1 -- --prompts 131072 --decode 2
        for v in old new; do
            [ -f "$w/profile-$v.log" ] || continue
            echo "profile $v: $(grep -E '^  (attention|indexer|matmuls|moe w1 w3|moe w2|hc_pre logits) ' \
                "$w/profile-$v.log" | sed -E 's/^ +(.*[^ ]) +[0-9]+ calls +([0-9.]+) ms.*/\1 \2 ms/' |
                tr '\n' ';')"
        done ;;
    switches)
        for i in 1 2; do for sw in default ${AB_SWITCHES:-}; do
            e=
            [ "$sw" = default ] || e=$sw
            l="switch-$(echo "$sw" | tr -c 'A-Za-z0-9_\n' -)-$i"
            one "$l" 60 LLM_CUDA_GRAPH_TIME=1 $e -- build/bin/llm-engine bench --synthetic \
                conf/models/deepseek-v4-flash-rank6.json --tp 1 --kv-cache-dtype fp8 --prompt 8192 \
                --batch "${AB_BATCH:-32,64}" --decode 16 || continue
            echo "$sw ($i): $(graph_rows "$w/$l.log")"
        done; done ;;
    *)
        echo "gpu_ab.sh: unknown step $s" >&2 ;;
    esac
done
tar czf "$out/ab.tgz" -C "$w" . && rm -rf "$w"
echo "== done in $(( $(date +%s) - start )) s"
