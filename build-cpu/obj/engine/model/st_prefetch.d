build-cpu/obj/engine/model/st_prefetch.o: engine/model/st_prefetch.c \
 engine/model/st_prefetch.h engine/model/safetensors.h \
 engine/util/strbuf.h
engine/model/st_prefetch.h:
engine/model/safetensors.h:
engine/util/strbuf.h:
