build-cpu/obj/engine/text/constraint.o: engine/text/constraint.c \
 engine/text/constraint.h engine/text/grammar.h engine/text/json_schema.h \
 engine/text/token_mask.h engine/text/tokenizer.h engine/util/strbuf.h \
 engine/util/utf8.h engine/util/strbuf.h engine/util/json.h
engine/text/constraint.h:
engine/text/grammar.h:
engine/text/json_schema.h:
engine/text/token_mask.h:
engine/text/tokenizer.h:
engine/util/strbuf.h:
engine/util/utf8.h:
engine/util/strbuf.h:
engine/util/json.h:
