#!/bin/sh
# One GPU session's work, run on the GPU machine from a folder that holds
# binaries built elsewhere (make CUDA=1 gpu-tests) plus lib/ with the
# shared libraries that machine lacks (docs/GPU_NOTES.md says how):
#   sh tools/gpu_run.sh OUTDIR [bench]
# Logs go to OUTDIR; a short summary is printed last.
out=${1:-/tmp/gpu-out}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0     # never NVLink multicast
export LD_LIBRARY_PATH=$PWD/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# Fixtures come from the checkout this folder sits in (.xfer/NAME).
[ -e tests/fixtures ] || { mkdir -p tests && ln -s ../../../tests/fixtures tests/fixtures; }
{ nvidia-smi; ls /usr/local/cuda/lib64 | grep -E 'nccl|cublasLt'; } > "$out/machine.txt" 2>&1
build/bin/llm-engine version > "$out/version.txt" 2>&1

timeout 300 build/tests/gpu/test_cuda_kernels > "$out/kernels.log" 2>&1
krc=$?
LLM_TEST_BACKEND=cuda timeout 240 build/tests/test_model_golden > "$out/golden.log" 2>&1
grc=$?
if [ $krc -ne 0 ] && command -v compute-sanitizer > /dev/null; then
    timeout 200 compute-sanitizer --print-limit 5 build/tests/gpu/test_cuda_kernels \
        > "$out/sanitizer.log" 2>&1
fi
if [ "$2" = bench ]; then
    for tp in 1 2; do
        build/bin/llm-engine bench --model tests/fixtures/demo --backend cuda --tp $tp \
            --prompt 1024 --decode 128
    done > "$out/bench.log" 2>&1
fi

echo "== machine"; grep -E "H200|Driver" "$out/machine.txt" | head -3; grep -c nccl "$out/machine.txt"
echo "== kernels exit $krc: $(grep -c '^ok' "$out/kernels.log") ok, $(grep -c '^not ok' "$out/kernels.log") not ok"
grep -E '^not ok|NCCL all-reduce [0-9]+ KB|Aborted|rror' "$out/kernels.log" | head -40
echo "== golden exit $grc: $(grep -c '^ok' "$out/golden.log") ok, $(grep -c '^not ok' "$out/golden.log") not ok"
grep -E '^not ok|^#' "$out/golden.log" | head -20
grep -E 'tp=. (full|incremental): rel' "$out/golden.log" | head -12
[ -f "$out/sanitizer.log" ] && { echo "== sanitizer"; grep -E 'ERROR|Invalid|at 0x|by thread' "$out/sanitizer.log" | head -20; }
[ -f "$out/bench.log" ] && { echo "== bench"; cat "$out/bench.log"; }
exit 0
