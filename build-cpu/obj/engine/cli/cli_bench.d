build-cpu/obj/engine/cli/cli_bench.o: engine/cli/cli_bench.c \
 engine/cli/cli.h kernels/cpu/qweight.h engine/model/model.h \
 engine/model/backend_modes.h kernels/cpu/kv_quant.h \
 engine/model/model_config.h engine/util/strbuf.h \
 engine/model/model_weights.h engine/model/safetensors.h
engine/cli/cli.h:
kernels/cpu/qweight.h:
engine/model/model.h:
engine/model/backend_modes.h:
kernels/cpu/kv_quant.h:
engine/model/model_config.h:
engine/util/strbuf.h:
engine/model/model_weights.h:
engine/model/safetensors.h:
