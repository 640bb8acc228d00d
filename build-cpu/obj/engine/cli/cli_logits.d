build-cpu/obj/engine/cli/cli_logits.o: engine/cli/cli_logits.c \
 engine/cli/cli.h engine/model/model.h engine/model/backend_modes.h \
 kernels/cpu/kv_quant.h engine/model/model_config.h engine/util/strbuf.h
engine/cli/cli.h:
engine/model/model.h:
engine/model/backend_modes.h:
kernels/cpu/kv_quant.h:
engine/model/model_config.h:
engine/util/strbuf.h:
