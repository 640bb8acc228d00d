build-cpu/obj/engine/text/token_mask.o: engine/text/token_mask.c \
 engine/text/token_mask.h engine/text/grammar.h engine/text/tokenizer.h \
 engine/util/strbuf.h engine/util/utf8.h engine/util/strbuf.h
engine/text/token_mask.h:
engine/text/grammar.h:
engine/text/tokenizer.h:
engine/util/strbuf.h:
engine/util/utf8.h:
engine/util/strbuf.h:
