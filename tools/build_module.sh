#!/bin/bash
# Build ngx_http_llm_module.so against Debian's nginx-dev tree so that the
# stock /usr/sbin/nginx loads it with load_module.
# usage: tools/build_module.sh BUILD_DIR [EXTRA_CFLAGS]
# EXTRA_CFLAGS go to both compile and link (make test-asan: sanitizers).
set -e
out=$1
extra=${2:-}
top=$(cd "$(dirname "$0")/.." && pwd)
src=/usr/share/nginx/src
[ -x "$src/configure" ] || { echo "build_module: $src missing (apt-get install nginx-dev)" >&2; exit 1; }
mkdir -p "$out"
out=$(cd "$out" && pwd)
# Work on a private copy: configure writes next to its sources.
rm -rf "$out/src"
cp -a "$src" "$out/src"
cd "$out/src"
# Debian's own configure flags, so the module signature matches the binary.
. ./conf_flags
./configure "${NGX_CONF_FLAGS[@]}" --add-dynamic-module="$top" \
    --with-cc-opt="-g -O2 -fPIC -Wall -Werror $extra" \
    ${extra:+--with-ld-opt="$extra"} >"$out/configure.log" 2>&1 \
    || { tail -20 "$out/configure.log" >&2; exit 1; }
make -f objs/Makefile modules >"$out/make.log" 2>&1 \
    || { grep -E "error|warning" "$out/make.log" | head -40 >&2; exit 1; }
# Install by rename: a running nginx keeps its mapping of the old file
# (overwriting it in place would crash its workers).
cp objs/ngx_http_llm_module.so "$out/.ngx_http_llm_module.so.new"
mv -f "$out/.ngx_http_llm_module.so.new" "$out/ngx_http_llm_module.so"
echo "built $out/ngx_http_llm_module.so"
