build-cpu/obj/engine/cli/cli_client.o: engine/cli/cli_client.c \
 engine/cli/cli.h engine/serve/event_json.h engine/ipc/llm_ipc.h \
 engine/util/strbuf.h engine/ipc/llm_ipc_client.h engine/ipc/llm_ipc.h
engine/cli/cli.h:
engine/serve/event_json.h:
engine/ipc/llm_ipc.h:
engine/util/strbuf.h:
engine/ipc/llm_ipc_client.h:
engine/ipc/llm_ipc.h:
