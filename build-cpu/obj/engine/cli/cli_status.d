build-cpu/obj/engine/cli/cli_status.o: engine/cli/cli_status.c \
 engine/cli/cli.h engine/ipc/llm_ipc_client.h engine/ipc/llm_ipc.h \
 engine/util/json.h engine/util/strbuf.h engine/serve/procfs.h
engine/cli/cli.h:
engine/ipc/llm_ipc_client.h:
engine/ipc/llm_ipc.h:
engine/util/json.h:
engine/util/strbuf.h:
engine/serve/procfs.h:
