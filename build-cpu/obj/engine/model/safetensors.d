build-cpu/obj/engine/model/safetensors.o: engine/model/safetensors.c \
 engine/model/safetensors.h engine/util/strbuf.h engine/util/json.h \
 engine/util/strbuf.h
engine/model/safetensors.h:
engine/util/strbuf.h:
engine/util/json.h:
engine/util/strbuf.h:
