build-cpu/obj/engine/serve/event_json.o: engine/serve/event_json.c \
 engine/serve/event_json.h engine/ipc/llm_ipc.h engine/util/strbuf.h \
 engine/util/json.h engine/util/strbuf.h
engine/serve/event_json.h:
engine/ipc/llm_ipc.h:
engine/util/strbuf.h:
engine/util/json.h:
engine/util/strbuf.h:
