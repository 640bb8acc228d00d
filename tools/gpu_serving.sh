#!/bin/sh
# The GPU serving path end to end on one H200 (issue 15), in one session:
#
#   here:  make CUDA=1 BUILD=build-cuda && make module
#          sh tools/gpu_serving.sh pack DEST      (DEST under the checkout's .xfer/)
#   there: cd DEST && sh tools/gpu_serving.sh run OUT [SECONDS]
#
# `run` does, each step skipped when fewer seconds are left than it needs:
#   1. llm-engine bench --synthetic rank6 --prompt 8192 --batch 1,8,32,64
#      (batched decode at 8K context, fp8 cache)
#   2. synth the 6-layer full-shape V4-Flash checkpoint (8 shards), then
#      `serve` it with conf/recipes/v4-flash-6l-1gpu.yaml twice: after
#      dropping the files from the page cache (cold) and again (warm);
#      process start -> "ready" in the log, the loader's GB/s lines
#   3. nginx (the binary carried from here) + the module in front of the
#      warm engine; llm-bench-serve at concurrency 1, 8, 32, 64
# NO_BATCH=1 skips step 1.  PREFIX_AB=1 then also restarts the engine
# with LLM_PREFIX_MARK_MIN=0 (every prompt split at its last block
# boundary for a prefix snapshot: concurrency 1, 8 and 64) and without
# prefix caching (1 and 8): TTFT, what the split costs.  UPLOAD_AB=1
# runs only step 2's synth, then warm starts alternating
# LLM_CUDA_UPLOAD_STAGE=0 (the straight pageable copy) and the pinned
# staging (twice each): the upload's A/B; UPLOAD_AB="VAR=V1 VAR=V2 ..."
# alternates those settings instead.
# Logs and JSON go to OUT (logs.tgz plus a summary on stdout).  LOCAL=1
# runs steps 2 and 3 on the CPU with the demo model's shapes (a check of
# this script on a machine without a GPU).
set -u
mode=${1:?usage: gpu_serving.sh pack DEST | run OUT [SECONDS]}

if [ "$mode" = pack ]; then
    set -e
    dest=${2:?usage: gpu_serving.sh pack DEST}
    build=${BUILD:-build-cuda}
    rm -rf "$dest"
    mkdir -p "$dest/build/bin" "$dest/build/nginx" "$dest/bin" "$dest/lib" "$dest/tools" \
        "$dest/conf/models" "$dest/conf/recipes" "$dest/fixtures"
    cp "$build/bin/llm-engine" "$build/bin/llm-bench-serve" "$dest/build/bin/"
    cp build/nginx/ngx_http_llm_module.so "$dest/build/nginx/"
    cp /usr/sbin/nginx "$dest/bin/"
    cp tools/gpu_serving.sh "$dest/tools/"
    cp conf/models/*.json "$dest/conf/models/"
    cp conf/recipes/v4-flash-6l-1gpu.yaml "$dest/conf/recipes/"
    cp tests/fixtures/demo/tokenizer.json "$dest/fixtures/tokenizer-demo.json"
    cp tests/fixtures/demo/config.json "$dest/fixtures/"
    # The demo tokenizer with every id up to V4's vocab_size decodable
    # ("x<id>"): a random model's tokens then all stream text, so each
    # token is a chunk the benchmark times (out-of-range ids stream none).
    python3 - "$dest/fixtures" <<'PY'
import json, sys
d = sys.argv[1]
t = json.load(open(d + "/tokenizer-demo.json"))
n = json.load(open("conf/models/deepseek-v4-flash.json"))["vocab_size"]
vocab = t["model"]["vocab"]
used = set(vocab.values()) | {a["id"] for a in t["added_tokens"]}
for i in range(n):
    if i not in used:
        vocab["x%d" % i] = i
json.dump(t, open(d + "/tokenizer.json", "w"), ensure_ascii=False)
PY
    # every shared library but the C and C++ runtimes and CUDA's, for an
    # image that lacks Debian's (nginx's, libcurl's and their dependencies)
    for b in "$build/bin/llm-engine" "$build/bin/llm-bench-serve" /usr/sbin/nginx \
             build/nginx/ngx_http_llm_module.so; do
        ldd "$b" | awk '$3 ~ /^\// {print $3}'
    done | sort -u | grep -vE '/(libc|libm|libpthread|libdl|librt|libresolv|libstdc\+\+|libgcc_s)\.so|^/usr/local/cuda' |
        while read -r l; do cp -L "$l" "$dest/lib/"; done
    du -sh "$dest"
    exit 0
fi

[ "$mode" = run ] || { echo "gpu_serving.sh: unknown mode $mode" >&2; exit 2; }
dest=${2:?usage: gpu_serving.sh run OUT [SECONDS]}
budget=${3:-330}
mkdir -p "$dest"
export NCCL_NVLS_ENABLE=0     # never NVLink multicast
export LD_LIBRARY_PATH=$PWD/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
top=$PWD
b=$top/build/bin
work=${WORK:-/tmp/llm-serving}
ckpt=$work/v4-flash-6l
out=$work/logs
start=$(date +%s)
left() { echo $((budget - ($(date +%s) - start))); }
now() { date +%s.%N; }
since() { awk -v a="$(now)" -v b="$1" 'BEGIN { printf "%.2f", a - b }'; }
log() { echo "== $*"; }
rm -rf "$work"
mkdir -p "$work/run" "$out"
epid=
cleanup() {
    [ -f "$work/nginx.pid" ] && kill -QUIT "$(cat "$work/nginx.pid")" 2>/dev/null
    [ -n "$epid" ] && kill -KILL "$epid" 2>/dev/null
}
trap cleanup EXIT
trap 'exit 1' INT TERM

{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; nproc; free -g;
  df -h /tmp; uname -r; } > "$out/machine.txt" 2>&1
"$b/llm-engine" version > "$out/version.txt" 2>&1

config=conf/models/deepseek-v4-flash.json layers=6 backend=cuda
tokenizer=fixtures/tokenizer.json
[ "${LOCAL:-0}" = 1 ] && config=fixtures/config.json layers=3 backend=cpu \
    tokenizer=fixtures/tokenizer-demo.json

# 1. batched decode, rank6 shapes, 8K context
if [ "$backend" = cuda ] && [ "$(left)" -gt 120 ] && [ -z "${UPLOAD_AB:-}${NO_BATCH:-}" ]; then
    log "bench --batch 1,8,32,64 (rank6, 8K, fp8)"
    timeout 150 "$b/llm-engine" bench --synthetic conf/models/deepseek-v4-flash-rank6.json \
        --prompt 8192 --batch 1,8,32,64 --decode 34 --kv-cache-dtype fp8 \
        > "$out/bench-batch.log" 2>&1
    echo "exit $?" >> "$out/bench-batch.log"
    grep -E '^(prefill|decode B)' "$out/bench-batch.log"
fi

# 2. checkpoint files, cold and warm start
serve_ready() {   # $1 label [$2 VAR=VALUE]: start serve, wait for "ready", log the seconds
    t0=$(now)
    env ${2:-} "$b/llm-engine" serve --recipe "$work/r.yaml" 2> "$out/serve-$1.log" &
    epid=$!
    n=0
    while kill -0 $epid 2>/dev/null && ! grep -q 'ready:' "$out/serve-$1.log" &&
          [ $n -lt 1500 ]; do sleep 0.1; n=$((n + 1)); done
    if grep -q 'ready:' "$out/serve-$1.log"; then echo "$1: process start to ready $(since "$t0") s"
    else echo "$1: not ready (exited, or 150 s passed)"; tail -5 "$out/serve-$1.log"
    fi >> "$out/$1.txt"
    cat "$out/$1.txt"
}
stop_engine() {
    kill -TERM $epid 2>/dev/null
    for _ in $(seq 100); do kill -0 $epid 2>/dev/null || break; sleep 0.1; done
    kill -KILL $epid 2>/dev/null
    wait $epid 2>/dev/null
}
sed -e "s|^run_dir:.*|run_dir: $work/run|" -e "s|^  path:.*|  path: $ckpt|" \
    -e "s|^backend:.*|backend: $backend|" conf/recipes/v4-flash-6l-1gpu.yaml > "$work/r.yaml"
# the engine's statistics lines every 2 s: a step's time split into the
# forward pass, sampling and output, the loop between steps
echo "log_stats_interval: ${STATS_INTERVAL:-2}" >> "$work/r.yaml"
if [ "$(left)" -gt 150 ]; then
    log "synth $layers layers of $config"
    t0=$(now)
    timeout 200 "$b/llm-engine" synth --config $config --layers $layers \
        --shards 8 --tokenizer $tokenizer --out "$ckpt" > "$out/synth.log" 2>&1
    echo "exit $? after $(since "$t0") s; $(du -sb "$ckpt" | cut -f1) bytes" >> "$out/synth.log"
    cat "$out/synth.log"
    sync
    if [ -n "${UPLOAD_AB:-}" ]; then
        # 1: the straight pageable copy against the pinned staging;
        # otherwise a list of VAR=VALUE settings, each started twice
        ab=$UPLOAD_AB
        [ "$ab" = 1 ] && ab="LLM_CUDA_UPLOAD_STAGE=0 LLM_CUDA_UPLOAD_STAGE=33554432"
        for i in 1 2; do
            for v in $ab; do
                serve_ready "warm-$v-$i" "$v"
                grep -E 'weights:' "$out/serve-warm-$v-$i.log"
                stop_engine
            done
        done
        tar czf "$dest/logs.tgz" -C "$out" .
        exit 0
    fi
    t0=$(now)
    # The checkpoint's pages out of the page cache (POSIX_FADV_DONTNEED);
    # the whole cache only where that left some (never with LOCAL=1).
    for f in "$ckpt"/*.safetensors; do dd if="$f" iflag=nocache count=0 status=none; done
    res() {
        command -v fincore > /dev/null || { echo unknown; return; }
        fincore -bno RES "$ckpt"/*.safetensors | awk '{ s += $1 } END { print s + 0 }'
    }
    how="dd iflag=nocache"
    if [ "$(res)" != 0 ] && [ "${LOCAL:-0}" != 1 ] && echo 3 > /proc/sys/vm/drop_caches; then
        how="$how, then drop_caches"
    fi
    echo "page cache dropped by $how in $(since "$t0") s; $(res) bytes resident" > "$out/cold.txt"
    serve_ready cold
    grep -E 'checkpoint:|weights:|KV cache' "$out/serve-cold.log"
    stop_engine
fi
if [ -d "$ckpt" ] && [ "$(left)" -gt 60 ]; then
    serve_ready warm
    grep -E 'checkpoint:|weights:|KV cache' "$out/serve-warm.log"

    # 3. nginx + module + engine, the serving benchmark
    port=18080
    cat > "$work/nginx.conf" <<EOF
load_module $top/build/nginx/ngx_http_llm_module.so;
user root;
worker_processes 4;
error_log $work/error.log warn;
pid $work/nginx.pid;
events { worker_connections 4096; }
http {
    access_log off;
    client_body_temp_path $work/body;
    proxy_temp_path $work/proxy;
    fastcgi_temp_path $work/fastcgi;
    uwsgi_temp_path $work/uwsgi;
    scgi_temp_path $work/scgi;
    llm_engine v4-flash-6l run_dir=$work/run;
    server {
        listen 127.0.0.1:$port;
        location = /v1/chat/completions { llm_api chat_completions; }
        location = /tokenize { llm_api tokenize; }
        location = /health { llm_api health; }
    }
}
EOF
    "$top/bin/nginx" -e "$work/error.log" -p "$work" -c "$work/nginx.conf" > "$out/nginx.txt" 2>&1
    healthy() {     # nginx answers /health with 200 (the engine admitted), 30 s at most
        env -u LD_LIBRARY_PATH python3 - "$port" >> "$out/nginx.txt" 2>&1 <<'PY'
import sys, time, urllib.request
for _ in range(300):
    try:
        if urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/health", timeout=2).status == 200:
            print("health 200"); break
    except Exception as e:
        err = e
    time.sleep(0.1)
else:
    print("health never 200:", err)
PY
    }
    healthy
    levels() {  # LABEL C...: bench-serve at each concurrency against engine LABEL
        label=$1
        shift
        for c in "$@"; do
            [ "$(left)" -gt 40 ] || { echo "concurrency $c: skipped (time)"; continue; }
            n=$((c * 2)); [ $n -lt 8 ] && n=8
            log "bench-serve concurrency $c, $n requests, 1024 in, 128 out ($label)"
            from=$(wc -l < "$out/serve-$label.log")
            timeout $(( $(left) - 20 )) "$b/llm-bench-serve" --base-url "http://127.0.0.1:$port" \
                --model v4-flash-6l --num-prompts $n --concurrency $c --input-len 1024 \
                --output-len 128 --json "$out/$label-c$c.json" > "$out/$label-c$c.txt" 2>&1
            echo "exit $?" >> "$out/$label-c$c.txt"
            grep -E 'Successful|Failed|duration|Output token|Total Token|Median TTFT|P99 TTFT|Median TPOT|P99 TPOT|P99 ITL|exit|failed' \
                "$out/$label-c$c.txt"
            # the engine's statistics lines while this level ran
            sed -n "$((from + 1)),\$p" "$out/serve-$label.log" | grep 'stats over' | sed 's/^[^:]*: //'
        done
    }
    levels warm 1 8 32 64
    if [ -n "${PREFIX_AB:-}" ] && [ "$(left)" -gt 60 ]; then
        # the same engine with every prompt split at its last block
        # boundary (the mark's rule before prefix_mark_min_tokens), then
        # without prefix caching; nginx reconnects to each
        stop_engine
        serve_ready mark0 LLM_PREFIX_MARK_MIN=0
        healthy
        levels mark0 1 8 64
        stop_engine
        echo "enable_prefix_caching: false" >> "$work/r.yaml"
        serve_ready noprefix
        healthy
        levels noprefix 1 8
    fi
    cp "$work/error.log" "$out/nginx-error.log" 2>/dev/null
    [ -f "$work/nginx.pid" ] && kill -QUIT "$(cat "$work/nginx.pid")"
    stop_engine
fi
tar czf "$dest/logs.tgz" -C "$out" .
echo "== done in $(( $(date +%s) - start )) s"
