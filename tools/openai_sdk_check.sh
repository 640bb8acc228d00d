#!/bin/sh
# The official OpenAI Node SDK against a running stack (start `make run`
# first).  Installs the `openai` npm package under build/sdk on first use
# (needs node, npm and the npm registry).
set -e
top=$(cd "$(dirname "$0")/.." && pwd)
dir=$top/build/sdk
if [ ! -d "$dir/node_modules/openai" ]; then
    mkdir -p "$dir"
    (cd "$dir" && npm init -y >/dev/null && npm install --silent openai@^7 >/dev/null) \
        || { echo "openai_sdk_check: npm install openai failed" >&2; exit 1; }
fi
cp "$top/tools/openai_sdk_check.mjs" "$dir/check.mjs"
cd "$dir" && exec node check.mjs
