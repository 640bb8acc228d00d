#!/bin/sh
# The demo model's retrain (issue 19) in one device call.
#
# Here (needs build/bin/llm-engine; ~22 min on 2 cores: rendering is one
# `llm-engine render` per example):
#   sh tools/demo_train_run.sh pack /work/main/.xfer/demo2
# makes DEST/train.bin.gz (tools/demo_data.py train --seed 19, N examples),
# DEST/eval.jsonl (100 held-out prompts), the three Python tools, the
# fixture tokenizer and this script; ~4 MB (N=60000: 24M tokens).
#
# Then `run` (nvidia-h200, timeout_s 420) with carry [".xfer/demo2"] and
#   cd .xfer/demo2 && sh demo_train_run.sh run $OUT
# which trains TRAIN_S seconds, QAT QAT_S, exports, reloads, runs the
# held-out prompts greedily for EVAL_S and writes $OUT/demo-trained.tgz
# (the checkpoint + train.json + eval_hf.jsonl) and $OUT/train.log.
# Expected wall ~380 s: setup, export and reload ~30 (run T1), training
# 270 (the phases stop by 1.05x their budget), QAT 35, eval
# 30.  Run T1's start added ~130 s of device time to its 287 s wall: if
# the device time must stay within 420 s, run
#   cd .xfer/demo2 && TRAIN_S=180 QAT_S=25 EVAL_S=20 LIMIT_S=270 sh demo_train_run.sh run $OUT
# (wall ~260 s, T1's training time with 2.7x its tokens a step).
#
# Afterwards, here: untar into tests/fixtures/demo-trained (model files,
# train.json, eval_hf.jsonl), then `make run` and
#   python3 tools/demo_eval.py --eval DEST/eval.jsonl --base-url http://127.0.0.1:8080 \
#       --hf tests/fixtures/demo-trained/eval_hf.jsonl
# for docs/MODEL.md's table.
set -e
cmd=${1:?usage: demo_train_run.sh pack DEST | run OUT}
case $cmd in
pack)
    dest=${2:?usage: demo_train_run.sh pack DEST}
    n=${N:-60000}
    mkdir -p "$dest"
    python3 tools/demo_data.py train --seed 19 --n "$n" --out "$dest/train.bin" --jobs 2
    python3 tools/demo_data.py eval --seed 19 --out "$dest/eval.jsonl" --jobs 2
    gzip -f "$dest/train.bin"
    cp tools/demo_data.py tools/train_demo_v4.py tools/make_tiny_v4.py \
        tools/demo_train_run.sh tests/fixtures/tokenizer/tokenizer.json "$dest/"
    du -sh "$dest"
    ;;
run)
    out=${2:?usage: demo_train_run.sh run OUT}
    gunzip -kf train.bin.gz
    nvidia-smi --query-gpu=name,memory.used --format=csv > "$out/train.log" 2>&1 || true
    # the limit leaves time to pack what was written
    timeout "${LIMIT_S:-400}" python3 train_demo_v4.py --data train.bin --eval eval.jsonl \
        --tokenizer tokenizer.json --out model --seed 19 \
        --train-seconds "${TRAIN_S:-270}" --qat-seconds "${QAT_S:-35}" \
        --eval-seconds "${EVAL_S:-30}" >> "$out/train.log" 2>&1 || echo "train_demo_v4.py: exit $?" >> "$out/train.log"
    [ -d model ] && tar czf "$out/demo-trained.tgz" model
    tail -5 "$out/train.log"
    ;;
*)
    echo "usage: demo_train_run.sh pack DEST | run OUT" >&2
    exit 2
    ;;
esac
