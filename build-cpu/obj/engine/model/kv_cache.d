build-cpu/obj/engine/model/kv_cache.o: engine/model/kv_cache.c \
 engine/model/kv_cache.h kernels/cpu/kv_quant.h \
 engine/model/model_config.h engine/util/strbuf.h
engine/model/kv_cache.h:
kernels/cpu/kv_quant.h:
engine/model/model_config.h:
engine/util/strbuf.h:
