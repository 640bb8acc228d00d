#!/bin/sh
# One GPU session's work, run on the GPU machine from a folder that holds
# binaries built elsewhere (make CUDA=1 gpu-tests) plus lib/ with the
# shared libraries that machine lacks (docs/GPU_NOTES.md says how):
#   sh tools/gpu_run.sh OUTDIR [bench]
#   sh tools/gpu_run.sh OUTDIR long [ENGINE BENCH OPTIONS...]
#   sh tools/gpu_run.sh OUTDIR prefix [ENGINE BENCH OPTIONS...]
#   sh tools/gpu_run.sh OUTDIR models
# Logs go to OUTDIR (as logs.tgz); a short summary is printed last.
# `models`: all but test_cuda_kernels (the suite less its longest part):
# the model-level checks after a change to the model's ops.  A
# failing kernel test reruns under compute-sanitizer unless NO_SANITIZER
# is set (it takes minutes).  BENCH_LONG=1 adds
# the 32K-token prefill to the benchmark.  `long` skips the tests and runs
# V4-Flash at 8K, 32K and 119,503-token prompts (the r33 report's longest),
# decoding at each context, with the extra options given (e.g.
# --kv-cache-dtype fp8).  `prefix` skips the tests and measures prefix
# caching on rank6 shapes (issue 17): TTFT of a 100,000-token prompt cold,
# then of it + 1,000 new tokens from the GPU tier and from the host tier
# (bench --prefix-repeat; about a minute).
out=${1:-/tmp/gpu-out}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0     # never NVLink multicast
export LD_LIBRARY_PATH=$PWD/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# Fixtures and configs come from the checkout this folder sits in.
. tools/gpu_links.sh
{ nvidia-smi; ls /usr/local/cuda/lib64 | grep -E 'nccl|cublasLt'; } > "$out/machine.txt" 2>&1
build/bin/llm-engine version > "$out/version.txt" 2>&1
# One GPU: the tests' TP=2 cases are skipped, the serving check runs TP=1.
ndev=$(sed -n 's/^cuda devices: //p' "$out/version.txt")
export LLM_TEST_MAX_TP=$([ "${ndev:-0}" -ge 2 ] && echo 2 || echo 1)

if [ "$2" = long ]; then
    shift 2
    echo "== long-context bench $*"
    build/bin/llm-engine bench --synthetic conf/models/deepseek-v4-flash.json --tp 2 \
        --prompts 8192,32768,119503 --decode 32 "$@" 2>&1 | tee "$out/long.log"
    exit 0
fi
if [ "$2" = prefix ]; then
    shift 2
    echo "== prefix caching TTFT $*"
    timeout 170 build/bin/llm-engine bench --synthetic conf/models/deepseek-v4-flash-rank6.json \
        --tp 1 --kv-cache-dtype fp8 --prompt 100000 --prefix-repeat 1000 --rounds 3 \
        --kv-offloading-size 4 "$@" 2>&1 | tee "$out/prefix.log"
    exit 0
fi
# (run A1: 300 s cut it ~150 tests short once the prefill top-k's
# 20K- and 40K-entry cases, whose double-precision references take tens
# of seconds on the CPU, joined)
if [ "$2" = models ]; then
    echo "(skipped: gpu_run.sh models)" > "$out/kernels.log"
    krc=skipped
else
    timeout 420 build/tests/gpu/test_cuda_kernels > "$out/kernels.log" 2>&1
    krc=$?
fi
timeout 90 build/tests/gpu/test_cuda_model > "$out/model.log" 2>&1
mrc=$?
# Golden logits with each kind of prefill GEMMs: bf16x2 (the default),
# bf16, f32, fp8 (with the cache dtypes too).
LLM_TEST_BACKEND=cuda timeout 120 build/tests/test_model_golden > "$out/golden.log" 2>&1
grc=$?
for g in bf16 f32 fp8; do
    LLM_CUDA_GEMM=$g LLM_TEST_BACKEND=cuda timeout 120 build/tests/test_model_golden \
        > "$out/golden-$g.log" 2>&1
    echo $? > "$out/golden-$g.rc"
done
# Weights uploaded through 4 KB staging buffers: many chunks, rows wider
# than a buffer copied straight (cuda_memory.cu's two paths).
LLM_CUDA_UPLOAD_STAGE=4096 LLM_TEST_BACKEND=cuda timeout 120 build/tests/test_model_golden \
    > "$out/golden-stage.log" 2>&1
echo $? > "$out/golden-stage.rc"
LLM_CUDA_GEMM=fp8 LLM_TEST_BACKEND=cuda timeout 90 build/tests/test_model_kv_dtype \
    > "$out/kv_dtype-fp8.log" 2>&1
echo $? > "$out/kv_dtype-fp8.rc"
LLM_TEST_BACKEND=cuda timeout 90 build/tests/test_model_kv_dtype > "$out/kv_dtype.log" 2>&1
vrc=$?
for t in test_model_fork test_prefix_cache; do
    LLM_TEST_BACKEND=cuda timeout 120 build/tests/$t > "$out/$t.log" 2>&1
    echo $? > "$out/$t.rc"
done
timeout 60 build/tests/gpu/test_cuda_host_copies > "$out/host_copies.log" 2>&1
echo $? > "$out/host_copies.rc"
if [ "$krc" != 0 ] && [ "$krc" != skipped ] && [ -z "${NO_SANITIZER:-}" ] &&
    command -v compute-sanitizer > /dev/null; then
    timeout 200 compute-sanitizer --print-limit 5 build/tests/gpu/test_cuda_kernels \
        > "$out/sanitizer.log" 2>&1
fi
sh tools/gpu_serve_check.sh "$out" > "$out/serve.log" 2>&1
if [ "$2" = bench ]; then
    # This machine's ceilings through PyTorch: device-to-device copy
    # (bytes read + written) and a dense bf16 8192^3 matmul.
    python3 - > "$out/ceilings.txt" 2>&1 <<'PY'
import torch
def timed(f, n):
    for _ in range(3): f()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(n): f()
    e.record(); torch.cuda.synchronize()
    return s.elapsed_time(e) / 1e3 / n
a = torch.empty(4 << 30, dtype=torch.uint8, device="cuda"); a.random_(); b = torch.empty_like(a)
t = timed(lambda: b.copy_(a), 10)
print("copy_gbs %.0f" % (2 * a.numel() / t / 1e9))
x = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda"); y = torch.randn_like(x)
t = timed(lambda: x @ y, 10)
print("bf16_tflops %.0f" % (2 * 8192 ** 3 / t / 1e12))
PY
    gbs=$(sed -n 's/^copy_gbs //p' "$out/ceilings.txt"); tf=$(sed -n 's/^bf16_tflops //p' "$out/ceilings.txt")
    flash="conf/models/deepseek-v4-flash.json"
    b=build/bin/llm-engine
    peaks="${gbs:+--peak-gbs $gbs} ${tf:+--peak-tflops $tf}"
    # Decode with CUDA graphs (the default), then op by op for comparison,
    # then the pool sized as a server sizes it.
    { timeout 60 $b bench --synthetic tests/fixtures/demo/config.json --tp 2 --prompts 512 --decode 16
      timeout 180 $b bench --synthetic $flash --tp 2 --prompts 8192${BENCH_LONG:+,32768} \
          --decode 128 $peaks
      echo "== LLM_CUDA_GRAPHS=0"
      LLM_CUDA_GRAPHS=0 timeout 90 $b bench --synthetic $flash --tp 2 --prompts 8192 \
          --decode 64 $peaks
      echo "== --gpu-memory-utilization 0.9"
      timeout 90 $b bench --synthetic $flash --tp 2 --prompts 8192 --decode 32 \
          --gpu-memory-utilization 0.9 $peaks; } > "$out/bench.log" 2>&1
    LLM_CUDA_PROFILE=1 timeout 60 $b bench --synthetic $flash --tp 2 --prompts 8 --decode 64 \
        > "$out/profile.log" 2>&1
fi

echo "== machine"; grep -E "H200|Driver" "$out/machine.txt" | head -3; grep -c nccl "$out/machine.txt"
echo "== kernels exit $krc: $(grep -c '^ok' "$out/kernels.log") ok, $(grep -c '^not ok' "$out/kernels.log") not ok"
grep -E '^not ok|NCCL all-reduce [0-9]+ KB|Aborted|rror' "$out/kernels.log" | head -40
echo "== golden (bf16x2 prefill GEMMs, the default) exit $grc: $(grep -c '^ok' "$out/golden.log") ok, $(grep -c '^not ok' "$out/golden.log") not ok"
grep -E '^not ok|^#' "$out/golden.log" | head -20
grep -E 'tp=. (full|incremental)(: rel| equals|: greedy)' "$out/golden.log" | head -40
for g in bf16 f32 fp8; do
    echo "== golden (LLM_CUDA_GEMM=$g) exit $(cat "$out/golden-$g.rc"): $(grep -c '^ok' "$out/golden-$g.log") ok, $(grep -c '^not ok' "$out/golden-$g.log") not ok"
    grep -E '^not ok|^#' "$out/golden-$g.log" | head -20
    grep -E 'tp=. (full|incremental)(: rel| equals|: greedy)' "$out/golden-$g.log" | head -40
done
grep -E 'tp=. (full|incremental): rel' "$out/golden.log" | head -12
echo "== kv_dtype exit $vrc: $(grep -c '^ok' "$out/kv_dtype.log") ok, $(grep -c '^not ok' "$out/kv_dtype.log") not ok"
echo "== kv_dtype (LLM_CUDA_GEMM=fp8) exit $(cat "$out/kv_dtype-fp8.rc"): $(grep -c '^ok' "$out/kv_dtype-fp8.log") ok, $(grep -c '^not ok' "$out/kv_dtype-fp8.log") not ok"
grep -E '^not ok' "$out/kv_dtype-fp8.log" | head -10
grep -E '^not ok|^#|^ok' "$out/kv_dtype.log" | head -30
echo "== model exit $mrc: $(grep -c '^ok' "$out/model.log") ok, $(grep -c '^not ok' "$out/model.log") not ok"
grep -E '^not ok|^#|^ok' "$out/model.log" | head -20
for t in test_model_fork test_prefix_cache host_copies golden-stage; do
    echo "== $t exit $(cat "$out/$t.rc"): $(grep -c '^ok' "$out/$t.log") ok, $(grep -c '^not ok' "$out/$t.log") not ok"
    grep -E '^not ok' "$out/$t.log" | head -10
done
grep '^== serve' "$out/serve.log"
[ -f "$out/sanitizer.log" ] && { echo "== sanitizer"; grep -E 'ERROR|Invalid|at 0x|by thread' "$out/sanitizer.log" | head -20; }
[ -f "$out/bench.log" ] && { echo "== ceilings"; cat "$out/ceilings.txt" | tail -3; echo "== bench"; cat "$out/bench.log"; }
[ -f "$out/profile.log" ] && { echo "== profile"; grep -vE "^model|^backend|^cache|^capacity" "$out/profile.log" | head -60; }
# The device tool brings back only a few files: the logs travel as one.
tar czf /tmp/gpu-logs.$$.tgz -C "$out" . && rm -rf "$out"/* && mv /tmp/gpu-logs.$$.tgz "$out/logs.tgz"
exit 0
