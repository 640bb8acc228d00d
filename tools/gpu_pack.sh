#!/bin/sh
# Assemble what the GPU machine needs into DEST, a folder under the
# checkout's ignored .xfer/ (it travels with `carry`): the engine and GPU
# test binaries built here by `make CUDA=1 gpu-tests`, the scripts that run
# them, and lib/ with the shared libraries the GPU image lacks, stripped
# and packed as DEST/pack.txz: unpacked they pass the 64 MiB a call may
# carry (every binary holds the same ~6.7 MB of CUDA kernels), xz's
# window spans files and keeps one copy of them: ~4 MB (gzip's 32 KB
# window cannot: 34 MB, with the tracked tree over the limit).  One
# thread and -8's 32 MB window: two threads cut the stream into blocks
# that each start afresh, 38 MB once the binaries passed 10 MB.
#   make CUDA=1 gpu-tests && sh tools/gpu_pack.sh .xfer/NAME
# Then `run` with carry [".xfer/NAME"] and the command
#   cd .xfer/NAME && tar xJf pack.txz && cd pack && sh tools/gpu_run.sh $OUT [bench]
set -e
dest=${1:?usage: tools/gpu_pack.sh DEST}
rm -rf "$dest"
final=$dest
dest=$dest/pack
mkdir -p "$dest/build/bin" "$dest/build/tests/gpu" "$dest/tools" "$dest/lib"
cp build/bin/llm-engine "$dest/build/bin/"
cp build/tests/gpu/test_cuda_* build/tests/gpu/bench_cuda_* build/tests/test_model_golden \
    build/tests/test_model_kv_dtype build/tests/test_model_fork build/tests/test_prefix_cache \
    "$dest/build/tests/" 2>/dev/null || true
mv "$dest"/build/tests/test_cuda_* "$dest"/build/tests/bench_cuda_* "$dest/build/tests/gpu/"
cp tools/gpu_run.sh tools/gpu_session.sh tools/gpu_ab.sh tools/gpu_glance.sh \
    tools/gpu_serve_check.sh tools/test_gpu.sh tools/gpu_links.sh \
    tools/mode_drift.py tools/gpu_profile_step.sh tools/ncu_regions.py \
    tools/ncu_stalls.py "$dest/tools/"
for l in libyajl.so.2 libyaml-0.so.2 libpcre2-8.so.0; do
    cp -L /usr/lib/x86_64-linux-gnu/$l "$dest/lib/"
done
# the kernel tracer (CUDA_INJECTION64_PATH=$PWD/lib/libkernel_trace.so)
# and the CUPTI it loads from beside it
if [ -f build/lib/libkernel_trace.so ]; then
    cp build/lib/libkernel_trace.so "$dest/lib/"
    cp -L /usr/local/cuda/lib64/libcupti.so.13 "$dest/lib/"
fi
strip "$dest"/build/bin/* "$dest"/build/tests/test_* "$dest"/build/tests/gpu/*
XZ_OPT="-8 -T1" tar cJf "$final/pack.txz" -C "$final" pack
rm -rf "$dest"
du -sh "$final/pack.txz"
