#!/bin/sh
# make test-asan: the C tests and the nginx tests against an engine, test
# programs and nginx module built with AddressSanitizer and
# UndefinedBehaviorSanitizer (gcc; CUDA=0, -O2) in build-asan/, so build/
# is left alone.  Arguments are make targets instead of `test` (e.g.
# tools/test_asan.sh test-nginx).
#
# Debian's /usr/sbin/nginx is not built with ASan; an ASan-built module
# loads into it only when the ASan runtime is the first library of the
# process, so the nginx tests run nginx through tools/nginx_asan.sh
# (LD_PRELOAD of gcc's libasan; leak checking off for nginx, which frees
# its pools by exiting).  Engines and test programs run with leak
# checking on.
#
# Every ASan/LSan report goes to build-asan/san-logs/; the run fails when
# a test fails or when any report was written (a report from a process
# whose failure no test noticed, e.g. a daemon's exit, still counts).
set -eu
cd "$(dirname "$0")/.."
top=$PWD
build=build-asan
san="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
# the C harness's hang bounds (tests/test_env.h), not timings
export LLM_TEST_TIME_SCALE=4
logs=$top/$build/san-logs
rm -rf "$logs"
mkdir -p "$logs"

LLM_ASAN_LIB=$(gcc -print-file-name=libasan.so)
[ -f "$LLM_ASAN_LIB" ] || { echo "test-asan: gcc's libasan.so not found" >&2; exit 1; }
export LLM_ASAN_LIB
export NGINX="$top/tools/nginx_asan.sh"
# gcc 12's UBSan ignores log_path next to ASan (and a recoverable report
# with one set is lost): its reports go to the process's stderr, and
# -fno-sanitize-recover makes the process exit 1 there, which fails the
# test that ran it.
export ASAN_OPTIONS="log_path=$logs/asan:detect_leaks=1:strict_string_checks=1:detect_stack_use_after_return=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"

rc=0
make --no-print-directory BUILD=$build CUDA=0 OPT=-O2 EXTRA_CFLAGS="$san" \
     MODULE_CFLAGS="$san" "${@:-test}" || rc=$?

reports=$(find "$logs" -type f -size +0 | sort)
if [ -n "$reports" ]; then
    echo "test-asan: sanitizer reports:" >&2
    for f in $reports; do
        echo "==== $f" >&2
        head -60 "$f" >&2
    done
    rc=1
fi
[ $rc -eq 0 ] && echo "test-asan: all tests passed, no sanitizer reports"
exit $rc
