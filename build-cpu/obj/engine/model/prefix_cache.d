build-cpu/obj/engine/model/prefix_cache.o: engine/model/prefix_cache.c \
 engine/model/prefix_cache.h engine/model/kv_cache.h \
 kernels/cpu/kv_quant.h engine/model/model_config.h engine/util/strbuf.h \
 engine/util/sha256.h
engine/model/prefix_cache.h:
engine/model/kv_cache.h:
kernels/cpu/kv_quant.h:
engine/model/model_config.h:
engine/util/strbuf.h:
engine/util/sha256.h:
