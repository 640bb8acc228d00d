build-cpu/obj/engine/model/safetensors_write.o: \
 engine/model/safetensors_write.c engine/util/json.h engine/util/strbuf.h \
 engine/model/safetensors.h engine/util/strbuf.h
engine/util/json.h:
engine/util/strbuf.h:
engine/model/safetensors.h:
engine/util/strbuf.h:
