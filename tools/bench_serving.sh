#!/bin/bash
# What nginx and the module add on top of the engine (docs/PERFORMANCE.md).
#
# An engine with the scripted test runner (build/tests/llm-engine-test;
# no model: its cost is the protocol and the scheduler) behind nginx with
# the module.  Measures:
#   - GET /health through nginx (wrk)
#   - 1-token chat requests: through nginx (wrk, one connection) and
#     through the client library directly (llm-engine client --repeat);
#     the difference is the time nginx + the module add per request
#   - a long streamed completion (N tokens, one per engine step): through
#     nginx (curl, SSE) and directly; the difference over N is the time
#     added per streamed token
# Needs wrk and curl.  usage: tools/bench_serving.sh [TOKENS]
set -eu
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"
tokens=${1:-20000}
command -v wrk >/dev/null || { echo "bench_serving: install wrk (apt-get install wrk)" >&2; exit 1; }
dir=$(mktemp -d /tmp/llm-bench-XXXXXX)
name=bench-$$
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
cleanup() {
    [ -f "$dir/nginx.pid" ] && kill -QUIT "$(cat "$dir/nginx.pid")" 2>/dev/null
    [ -n "${epid:-}" ] && kill -TERM "$epid" 2>/dev/null
    sleep 0.5
    rm -rf "$dir"
}
trap cleanup EXIT

cat > "$dir/r.yaml" <<EOF
name: $name
run_dir: $dir
backend: cpu
model:
  path: /nonexistent
  served_model_name: bench
max_model_len: 1000000
max_num_seqs: 8
EOF
build/tests/llm-engine-test serve --recipe "$dir/r.yaml" --test-runner scripted 2>"$dir/engine.log" &
epid=$!
user=""
[ "$(id -u)" -eq 0 ] && user="user root;"
cat > "$dir/nginx.conf" <<EOF
load_module $top/build/nginx/ngx_http_llm_module.so;
$user
worker_processes 1;
error_log $dir/error.log warn;
pid $dir/nginx.pid;
events { worker_connections 1024; }
http {
    access_log off;
    client_body_temp_path $dir/body;
    llm_engine $name run_dir=$dir;
    llm_test_script on;
    server {
        listen 127.0.0.1:$port;
        location = /v1/chat/completions { llm_api chat_completions; }
        location = /health { llm_api health; }
    }
}
EOF
/usr/sbin/nginx -p "$dir" -c "$dir/nginx.conf"
for _ in $(seq 100); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/health")" = 200 ] && break
    sleep 0.1
done

one='{"model":"bench","messages":[{"role":"user","content":"hi"}],"test_script":{"content":"x"}}'
long="{\"model\":\"bench\",\"stream\":true,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":$tokens,\"test_script\":{\"content\":\"$(head -c "$tokens" /dev/zero | tr '\0' 'a')\"}}"
printf '%s' "$one" > "$dir/one.json"
printf '%s' "$long" > "$dir/long.json"
cat > "$dir/one.lua" <<EOF
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '$one'
EOF

echo "== machine: $(nproc) cores, $(uname -r), load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "== GET /health through nginx (wrk -t1 -c8 -d5s)"
wrk -t1 -c8 -d5s --latency "http://127.0.0.1:$port/health" | grep -E "Requests/sec|50%|99%"
echo "== 1-token chat through nginx (wrk -t1 -c1 -d5s)"
wrk -t1 -c1 -d5s --latency -s "$dir/one.lua" "http://127.0.0.1:$port/v1/chat/completions" \
    | grep -E "Requests/sec|50%|99%"
echo "== 1-token chat through the client library (2000 requests)"
build/bin/llm-engine client --run-dir "$dir" --name "$name" --request "$dir/one.json" --repeat 2000
echo "== $tokens streamed tokens through nginx (curl, SSE)"
t=$(curl -sN -o "$dir/sse.txt" -w '%{time_total}' -H 'Content-Type: application/json' \
    --data-binary @"$dir/long.json" "http://127.0.0.1:$port/v1/chat/completions")
echo "total ${t} s, $(grep -c '^data: {' "$dir/sse.txt") chunks"
echo "== $tokens streamed tokens through the client library"
build/bin/llm-engine client --run-dir "$dir" --name "$name" --request "$dir/long.json" --repeat 3
