build-cpu/obj/engine/cli/cli_render.o: engine/cli/cli_render.c \
 engine/text/chat_encode.h engine/text/chat_render.h engine/util/strbuf.h \
 engine/text/tokenizer.h engine/util/utf8.h engine/util/strbuf.h \
 engine/text/chat_render.h engine/cli/cli.h engine/text/fingerprint.h \
 engine/util/json.h engine/serve/recipe.h engine/model/backend_modes.h \
 engine/ipc/llm_ipc.h
engine/text/chat_encode.h:
engine/text/chat_render.h:
engine/util/strbuf.h:
engine/text/tokenizer.h:
engine/util/utf8.h:
engine/util/strbuf.h:
engine/text/chat_render.h:
engine/cli/cli.h:
engine/text/fingerprint.h:
engine/util/json.h:
engine/serve/recipe.h:
engine/model/backend_modes.h:
engine/ipc/llm_ipc.h:
