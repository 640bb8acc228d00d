build-cpu/obj/engine/model/forward.o: engine/model/forward.c \
 engine/model/model_internal.h engine/model/backend.h \
 engine/model/backend_modes.h kernels/cpu/kv_quant.h \
 kernels/cpu/qweight.h engine/model/kv_cache.h \
 engine/model/model_config.h engine/util/strbuf.h engine/model/model.h \
 engine/model/model_weights.h engine/model/safetensors.h \
 engine/model/prefix_cache.h engine/model/prefix_disk.h engine/model/tp.h
engine/model/model_internal.h:
engine/model/backend.h:
engine/model/backend_modes.h:
kernels/cpu/kv_quant.h:
kernels/cpu/qweight.h:
engine/model/kv_cache.h:
engine/model/model_config.h:
engine/util/strbuf.h:
engine/model/model.h:
engine/model/model_weights.h:
engine/model/safetensors.h:
engine/model/prefix_cache.h:
engine/model/prefix_disk.h:
engine/model/tp.h:
