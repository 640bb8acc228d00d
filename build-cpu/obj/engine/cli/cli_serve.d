build-cpu/obj/engine/cli/cli_serve.o: engine/cli/cli_serve.c \
 engine/cli/cli.h engine/serve/runner.h engine/ipc/llm_ipc.h \
 engine/serve/recipe.h engine/model/backend_modes.h \
 engine/text/chat_render.h engine/util/strbuf.h engine/serve/server.h
engine/cli/cli.h:
engine/serve/runner.h:
engine/ipc/llm_ipc.h:
engine/serve/recipe.h:
engine/model/backend_modes.h:
engine/text/chat_render.h:
engine/util/strbuf.h:
engine/serve/server.h:
