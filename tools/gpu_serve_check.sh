#!/bin/sh
# The serving engine on the GPU: the demo model served with the CUDA
# backend at TP=2 (TP=1 when LLM_TEST_MAX_TP=1: one GPU) and with the CPU
# backend at the same TP, the same greedy chat
# request to both through the client library; the generated token ids
# must be the same.  Run on the GPU machine (tools/gpu_run.sh calls it).
#   sh tools/gpu_serve_check.sh OUTDIR
out=${1:-/tmp/gpu-out}
tp=${LLM_TEST_MAX_TP:-2}
b=build/bin/llm-engine
run=$(mktemp -d /tmp/llm-gpu-serve-XXXXXX)
model=$(cd tests/fixtures/demo && pwd)
for backend in cpu cuda; do
    cat > "$run/$backend.yaml" <<YAML
name: demo-$backend-$$
run_dir: $run
backend: $backend
model:
  path: $model
  served_model_name: demo
tensor_parallel_size: $tp
max_model_len: 4096
max_num_seqs: 4
kv_cache_memory_bytes: 256MiB
YAML
    $b serve --recipe "$run/$backend.yaml" > "$out/serve-$backend.log" 2>&1 &
done
req='{"messages":[{"role":"user","content":"Tell me about the sea."}],"max_tokens":48,"temperature":0,"logprobs":true,"ignore_eos":true}'
printf '%s' "$req" > "$run/req.json"
rc=0
for backend in cpu cuda; do
    for _ in $(seq 300); do
        $b status --run-dir "$run" --name "demo-$backend-$$" 2>/dev/null | grep -q '"state":"ready"' && break
        sleep 0.1
    done
    $b client --run-dir "$run" --name "demo-$backend-$$" --request "$run/req.json" \
        > "$out/client-$backend.jsonl" 2>&1 || rc=1
    grep -o '"token_id":[0-9]*' "$out/client-$backend.jsonl" | cut -d: -f2 | tr '\n' ' ' \
        > "$out/tokens-$backend.txt"
done
echo "== serve: cpu tokens  $(cat "$out/tokens-cpu.txt")"
echo "== serve: cuda tokens $(cat "$out/tokens-cuda.txt")"
grep -h "KV cache" "$out"/serve-*.log
if [ -s "$out/tokens-cuda.txt" ] && cmp -s "$out/tokens-cpu.txt" "$out/tokens-cuda.txt"; then
    echo "== serve: PASS, 48 greedy tokens identical on the CUDA (TP=$tp) and CPU (TP=$tp) engines"
else
    echo "== serve: FAIL (client exit $rc)"; tail -5 "$out/serve-cuda.log"
fi
pkill -TERM -f "demo-(cpu|cuda)-$$" 2>/dev/null
sleep 1
rm -rf "$run"
