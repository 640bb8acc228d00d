build-cpu/obj/engine/serve/sampler.o: engine/serve/sampler.c \
 engine/serve/sampler.h engine/ipc/llm_request.h engine/ipc/llm_ipc.h
engine/serve/sampler.h:
engine/ipc/llm_request.h:
engine/ipc/llm_ipc.h:
