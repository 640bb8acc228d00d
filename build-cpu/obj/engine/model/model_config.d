build-cpu/obj/engine/model/model_config.o: engine/model/model_config.c \
 engine/model/model_config.h engine/util/strbuf.h engine/model/backend.h \
 engine/model/backend_modes.h kernels/cpu/kv_quant.h \
 kernels/cpu/qweight.h engine/util/json.h engine/util/strbuf.h
engine/model/model_config.h:
engine/util/strbuf.h:
engine/model/backend.h:
engine/model/backend_modes.h:
kernels/cpu/kv_quant.h:
kernels/cpu/qweight.h:
engine/util/json.h:
engine/util/strbuf.h:
