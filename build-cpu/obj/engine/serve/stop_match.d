build-cpu/obj/engine/serve/stop_match.o: engine/serve/stop_match.c \
 engine/serve/stop_match.h engine/ipc/llm_request.h engine/ipc/llm_ipc.h \
 engine/util/strbuf.h
engine/serve/stop_match.h:
engine/ipc/llm_request.h:
engine/ipc/llm_ipc.h:
engine/util/strbuf.h:
