build-cpu/obj/engine/cli/cli_synth.o: engine/cli/cli_synth.c \
 engine/cli/cli.h engine/model/synth_model.h engine/model/model_config.h \
 engine/util/strbuf.h engine/model/safetensors.h
engine/cli/cli.h:
engine/model/synth_model.h:
engine/model/model_config.h:
engine/util/strbuf.h:
engine/model/safetensors.h:
