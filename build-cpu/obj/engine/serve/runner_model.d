build-cpu/obj/engine/serve/runner_model.o: engine/serve/runner_model.c \
 engine/text/chat_encode.h engine/text/chat_render.h engine/util/strbuf.h \
 engine/text/tokenizer.h engine/util/utf8.h engine/util/strbuf.h \
 engine/text/chat_render.h engine/text/constraint.h engine/text/grammar.h \
 engine/text/json_schema.h engine/text/token_mask.h \
 engine/text/fingerprint.h engine/ipc/llm_request.h engine/ipc/llm_ipc.h \
 engine/util/json.h engine/model/model.h engine/model/backend_modes.h \
 kernels/cpu/kv_quant.h engine/model/model_config.h \
 engine/text/output_parser.h engine/serve/runner.h engine/ipc/llm_ipc.h \
 engine/serve/recipe.h engine/model/backend_modes.h \
 engine/serve/sampler.h engine/serve/stop_match.h \
 engine/text/token_mask.h engine/text/tokenizer.h
engine/text/chat_encode.h:
engine/text/chat_render.h:
engine/util/strbuf.h:
engine/text/tokenizer.h:
engine/util/utf8.h:
engine/util/strbuf.h:
engine/text/chat_render.h:
engine/text/constraint.h:
engine/text/grammar.h:
engine/text/json_schema.h:
engine/text/token_mask.h:
engine/text/fingerprint.h:
engine/ipc/llm_request.h:
engine/ipc/llm_ipc.h:
engine/util/json.h:
engine/model/model.h:
engine/model/backend_modes.h:
kernels/cpu/kv_quant.h:
engine/model/model_config.h:
engine/text/output_parser.h:
engine/serve/runner.h:
engine/ipc/llm_ipc.h:
engine/serve/recipe.h:
engine/model/backend_modes.h:
engine/serve/sampler.h:
engine/serve/stop_match.h:
engine/text/token_mask.h:
engine/text/tokenizer.h:
