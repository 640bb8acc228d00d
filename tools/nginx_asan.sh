#!/bin/sh
# Debian's nginx with the ASan runtime preloaded, so that it can load the
# ASan-built module of make test-asan (tools/test_asan.sh sets
# LLM_ASAN_LIB and points the nginx tests here through $NGINX).  No leak
# check: nginx releases its pools by exiting.
export LD_PRELOAD="${LLM_ASAN_LIB:?set by tools/test_asan.sh}${LD_PRELOAD:+ $LD_PRELOAD}"
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
# $NGINX (how the tests find this script) means "inherited sockets" to
# nginx itself, which then would not daemonize.
unset NGINX
exec /usr/sbin/nginx "$@"
