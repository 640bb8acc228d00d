build-cpu/obj/engine/model/synth_model.o: engine/model/synth_model.c \
 engine/model/synth_model.h engine/model/model_config.h \
 engine/util/strbuf.h engine/model/safetensors.h kernels/cpu/quant.h
engine/model/synth_model.h:
engine/model/model_config.h:
engine/util/strbuf.h:
engine/model/safetensors.h:
kernels/cpu/quant.h:
