build-cpu/obj/engine/ipc/llm_ipc_ring.o: engine/ipc/llm_ipc_ring.c \
 engine/ipc/llm_ipc.h
engine/ipc/llm_ipc.h:
