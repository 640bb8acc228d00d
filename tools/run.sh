#!/bin/sh
# make run: serve the tiny demo model through nginx on 127.0.0.1:${LLM_PORT:-8080}.
# The engine daemon and the module's serving path are not built yet (see
# the open issues); this script refuses rather than pretend to serve.
echo "make run: the serving path (engine daemon + nginx handlers) is not built yet." >&2
echo "          What works now: make test, build/bin/llm-engine check --recipe conf/recipes/tiny-demo.yaml" >&2
exit 1
