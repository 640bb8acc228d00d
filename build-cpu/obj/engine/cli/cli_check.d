build-cpu/obj/engine/cli/cli_check.o: engine/cli/cli_check.c \
 engine/cli/cli.h engine/serve/recipe.h engine/model/backend_modes.h \
 engine/text/chat_render.h engine/util/strbuf.h engine/ipc/llm_ipc.h
engine/cli/cli.h:
engine/serve/recipe.h:
engine/model/backend_modes.h:
engine/text/chat_render.h:
engine/util/strbuf.h:
engine/ipc/llm_ipc.h:
