#!/bin/sh
# make test-gpu: the GPU suite, run on a machine with NVIDIA GPUs.
#   build/tests/gpu/test_cuda_kernels  every CUDA kernel against its CPU twin
#                                      on fresh random inputs, NCCL all-reduce
#   build/tests/gpu/test_cuda_model    decode graphs replay = op by op, bit
#                                      for bit; gpu_memory_utilization sizing
#   test_model_golden (backend cuda)   the whole model on the committed
#                                      fixtures at TP=1 and TP=2 against the
#                                      transformers golden logits, with
#                                      bf16x2 prefill GEMMs, then
#                                      LLM_CUDA_GEMM=bf16, f32 and fp8
#   test_model_kv_dtype (backend cuda)  every cache dtype, default and fp8
#   build/tests/gpu/test_cuda_host_copies  the prefix cache's host-tier copies
#                                      (pinned memory, a copy stream) keep
#                                      their order against the compute stream
# Verbose TAP, so the measured errors are in the log.
set -e
export NCCL_NVLS_ENABLE=0     # never NVLink multicast (see cuda_comm.cu)
# (from a gpu_pack.sh folder: the model tests' fixtures linked; run A1
# lost its model tests without them)
. tools/gpu_links.sh
bin=build/bin/llm-engine
$bin version
n=$($bin version | sed -n 's/^cuda devices: //p')
if [ -z "$n" ] || [ "$n" -eq 0 ]; then
    echo "test-gpu: no CUDA device visible (or built with CUDA=0)" >&2
    exit 1
fi
# One GPU: the TP=2 cases are skipped (they say so).
export LLM_TEST_MAX_TP=$([ "$n" -ge 2 ] && echo 2 || echo 1)
LLM_TEST_BACKEND=cuda prove -v -f --exec '' build/tests/gpu/test_cuda_kernels \
    build/tests/gpu/test_cuda_model build/tests/gpu/test_cuda_host_copies build/tests/test_model_golden build/tests/test_model_kv_dtype \
    build/tests/test_model_fork build/tests/test_prefix_cache
for g in bf16 f32 fp8; do
    LLM_CUDA_GEMM=$g LLM_TEST_BACKEND=cuda prove -v -f --exec '' build/tests/test_model_golden
done
LLM_CUDA_GEMM=fp8 LLM_TEST_BACKEND=cuda prove -v -f --exec '' build/tests/test_model_kv_dtype
