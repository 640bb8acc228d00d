build-cpu/obj/engine/model/model_weights.o: engine/model/model_weights.c \
 engine/model/model_weights.h kernels/cpu/qweight.h \
 engine/model/model_config.h engine/util/strbuf.h \
 engine/model/safetensors.h engine/model/backend.h \
 engine/model/backend_modes.h kernels/cpu/kv_quant.h kernels/cpu/quant.h
engine/model/model_weights.h:
kernels/cpu/qweight.h:
engine/model/model_config.h:
engine/util/strbuf.h:
engine/model/safetensors.h:
engine/model/backend.h:
engine/model/backend_modes.h:
kernels/cpu/kv_quant.h:
kernels/cpu/quant.h:
