build-cpu/obj/engine/ipc/llm_ipc_event.o: engine/ipc/llm_ipc_event.c \
 engine/ipc/llm_ipc.h
engine/ipc/llm_ipc.h:
