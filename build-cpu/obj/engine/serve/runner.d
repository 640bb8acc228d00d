build-cpu/obj/engine/serve/runner.o: engine/serve/runner.c \
 engine/serve/runner.h engine/ipc/llm_ipc.h engine/serve/recipe.h \
 engine/model/backend_modes.h engine/text/chat_render.h \
 engine/util/strbuf.h
engine/serve/runner.h:
engine/ipc/llm_ipc.h:
engine/serve/recipe.h:
engine/model/backend_modes.h:
engine/text/chat_render.h:
engine/util/strbuf.h:
