build-cpu/obj/engine/text/tokenizer.o: engine/text/tokenizer.c \
 engine/text/tokenizer_impl.h engine/util/hashmap.h \
 engine/text/onig_regex.h engine/util/strbuf.h engine/text/tokenizer.h \
 engine/util/utf8.h engine/util/strbuf.h
engine/text/tokenizer_impl.h:
engine/util/hashmap.h:
engine/text/onig_regex.h:
engine/util/strbuf.h:
engine/text/tokenizer.h:
engine/util/utf8.h:
engine/util/strbuf.h:
