build-cpu/obj/engine/serve/segment.o: engine/serve/segment.c \
 engine/serve/segment.h engine/ipc/llm_ipc.h engine/util/strbuf.h \
 engine/serve/procfs.h engine/util/version.h
engine/serve/segment.h:
engine/ipc/llm_ipc.h:
engine/util/strbuf.h:
engine/serve/procfs.h:
engine/util/version.h:
