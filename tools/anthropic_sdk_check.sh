#!/bin/sh
# The official Anthropic Node SDK against a running stack (start `make run`
# first; with LLM_API_KEY set there, export the same here).  Installs the
# `@anthropic-ai/sdk` npm package under build/sdk on first use (needs node,
# npm and the npm registry).  Not part of CI.
set -e
top=$(cd "$(dirname "$0")/.." && pwd)
dir=$top/build/sdk
if [ ! -d "$dir/node_modules/@anthropic-ai/sdk" ]; then
    mkdir -p "$dir"
    (cd "$dir" && { [ -f package.json ] || npm init -y >/dev/null; } \
        && npm install --silent @anthropic-ai/sdk >/dev/null) \
        || { echo "anthropic_sdk_check: npm install @anthropic-ai/sdk failed" >&2; exit 1; }
fi
cp "$top/tools/anthropic_sdk_check.mjs" "$dir/anthropic_check.mjs"
cd "$dir" && exec node anthropic_check.mjs
