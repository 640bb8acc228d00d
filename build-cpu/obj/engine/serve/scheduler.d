build-cpu/obj/engine/serve/scheduler.o: engine/serve/scheduler.c \
 engine/serve/scheduler.h engine/ipc/llm_ipc.h engine/serve/runner.h \
 engine/serve/recipe.h engine/model/backend_modes.h \
 engine/text/chat_render.h engine/util/strbuf.h engine/serve/procfs.h \
 engine/serve/req_output.h
engine/serve/scheduler.h:
engine/ipc/llm_ipc.h:
engine/serve/runner.h:
engine/serve/recipe.h:
engine/model/backend_modes.h:
engine/text/chat_render.h:
engine/util/strbuf.h:
engine/serve/procfs.h:
engine/serve/req_output.h:
