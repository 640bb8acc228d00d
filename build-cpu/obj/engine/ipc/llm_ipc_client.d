build-cpu/obj/engine/ipc/llm_ipc_client.o: engine/ipc/llm_ipc_client.c \
 engine/ipc/llm_ipc_client.h engine/ipc/llm_ipc.h
engine/ipc/llm_ipc_client.h:
engine/ipc/llm_ipc.h:
