build-cpu/obj/engine/serve/server.o: engine/serve/server.c \
 engine/serve/server.h engine/serve/recipe.h engine/model/backend_modes.h \
 engine/text/chat_render.h engine/util/strbuf.h engine/ipc/llm_ipc.h \
 engine/serve/runner.h engine/serve/scheduler.h engine/serve/segment.h
engine/serve/server.h:
engine/serve/recipe.h:
engine/model/backend_modes.h:
engine/text/chat_render.h:
engine/util/strbuf.h:
engine/ipc/llm_ipc.h:
engine/serve/runner.h:
engine/serve/scheduler.h:
engine/serve/segment.h:
