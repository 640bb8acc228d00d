#!/usr/bin/env bash
# Generate the tiny DeepSeek V4 fixtures with transformers golden logits.
# Run on the GPU machine (python3 with torch, transformers 5.17, numpy) from
# the repo root:
#
#     tools/gpu_fixtures.sh [TOKENIZER_JSON]
#
# Fixtures are built in $WORK (default /tmp/v4-fixtures/<name>) and packed
# into $OUT, which then holds only what the device tool brings back:
#   fixtures.tgz  tiny-a/ tiny-b/   (unpack with: tar -xzf fixtures.tgz -C tests/fixtures)
#   demo.tgz      demo/             (only with a tokenizer; without weights
#                                    and logits when they would not fit)
#   fixtures.log  everything printed, with timings
# Exits non-zero when any fixture failed; the others are still packed.
set -euo pipefail
export PYTHONUNBUFFERED=1

OUT=${OUT:?set OUT to the directory that receives the tarballs}
TOKENIZER=${1:-tests/fixtures/tokenizer/tokenizer.json}
WORK=${WORK:-/tmp/v4-fixtures}
DEMO_MAX_BYTES=$((15 * 1024 * 1024))

mkdir -p "$OUT" "$WORK"
exec > >(tee "$OUT/fixtures.log") 2>&1

echo "== $(date -u +%FT%TZ) $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
python3 -c 'import sys, numpy, torch, transformers
print("python", sys.version.split()[0], "numpy", numpy.__version__,
      "torch", torch.__version__, "transformers", transformers.__version__)'

failed=""
step() {            # step NAME COMMAND...: run, time, remember failures
    local name=$1 t0=$SECONDS
    shift
    echo "== $name: $*"
    if "$@"; then
        echo "== $name: ok ($((SECONDS - t0)) s)"
    else
        echo "== $name: FAILED with status $? ($((SECONDS - t0)) s)"
        failed="$failed $name"
    fi
}

step selftest python3 tools/test_make_tiny_v4.py
for name in tiny-a tiny-b; do
    rm -rf "${WORK:?}/$name"
    step "$name" python3 tools/make_tiny_v4.py --preset "$name" --out "$WORK/$name"
done
tar -C "$WORK" -czf "$OUT/fixtures.tgz" tiny-a tiny-b
ls -l "$OUT/fixtures.tgz"

if [ -f "$TOKENIZER" ]; then
    rm -rf "${WORK:?}/demo"
    step demo python3 tools/make_tiny_v4.py --preset demo --tokenizer "$TOKENIZER" \
        --out "$WORK/demo"
    size=$(du -sb "$WORK/demo" | cut -f1)
    if [ "$size" -le "$DEMO_MAX_BYTES" ]; then
        tar -C "$WORK" -czf "$OUT/demo.tgz" demo
    else
        echo "== demo: $size bytes is too large to bring back; packing it" \
             "without weights and logits. Rebuild the weights anywhere with" \
             "numpy (golden.json lists their sha256):"
        grep '"reproduce_checkpoint"' "$WORK/demo/golden.json" || true
        tar -C "$WORK" -czf "$OUT/demo.tgz" --exclude='*.safetensors' \
            --exclude='logits.f32' demo
    fi
    ls -l "$OUT/demo.tgz"
else
    echo "== demo: skipped, no tokenizer at $TOKENIZER" \
         "(produce it with tools/make_tokenizer.py, or pass its path)"
fi

if [ -n "$failed" ]; then
    echo "== FAILED:$failed"
    exit 1
fi
echo "== all fixtures ok"
