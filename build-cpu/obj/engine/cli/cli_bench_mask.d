build-cpu/obj/engine/cli/cli_bench_mask.o: engine/cli/cli_bench_mask.c \
 engine/cli/cli.h engine/text/constraint.h engine/text/grammar.h \
 engine/text/json_schema.h engine/text/token_mask.h \
 engine/text/tokenizer.h engine/util/strbuf.h engine/util/utf8.h \
 engine/util/strbuf.h engine/util/json.h engine/text/token_mask.h \
 engine/text/tokenizer.h
engine/cli/cli.h:
engine/text/constraint.h:
engine/text/grammar.h:
engine/text/json_schema.h:
engine/text/token_mask.h:
engine/text/tokenizer.h:
engine/util/strbuf.h:
engine/util/utf8.h:
engine/util/strbuf.h:
engine/util/json.h:
engine/text/token_mask.h:
engine/text/tokenizer.h:
