build-cpu/obj/engine/serve/janitor.o: engine/serve/janitor.c \
 engine/serve/janitor.h engine/util/strbuf.h engine/util/json.h \
 engine/util/strbuf.h engine/serve/procfs.h engine/serve/segment.h \
 engine/ipc/llm_ipc.h
engine/serve/janitor.h:
engine/util/strbuf.h:
engine/util/json.h:
engine/util/strbuf.h:
engine/serve/procfs.h:
engine/serve/segment.h:
engine/ipc/llm_ipc.h:
