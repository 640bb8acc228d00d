build-cpu/obj/engine/cli/cli_tokenize.o: engine/cli/cli_tokenize.c \
 engine/cli/cli.h engine/text/tokenizer.h engine/util/strbuf.h \
 engine/util/utf8.h engine/util/strbuf.h
engine/cli/cli.h:
engine/text/tokenizer.h:
engine/util/strbuf.h:
engine/util/utf8.h:
engine/util/strbuf.h:
