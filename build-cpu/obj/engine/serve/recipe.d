build-cpu/obj/engine/serve/recipe.o: engine/serve/recipe.c \
 engine/serve/recipe.h engine/model/backend_modes.h \
 engine/text/chat_render.h engine/util/strbuf.h engine/ipc/llm_ipc.h \
 engine/util/sha256.h engine/util/version.h
engine/serve/recipe.h:
engine/model/backend_modes.h:
engine/text/chat_render.h:
engine/util/strbuf.h:
engine/ipc/llm_ipc.h:
engine/util/sha256.h:
engine/util/version.h:
