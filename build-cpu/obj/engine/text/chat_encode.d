build-cpu/obj/engine/text/chat_encode.o: engine/text/chat_encode.c \
 engine/text/chat_encode.h engine/text/chat_render.h engine/util/strbuf.h \
 engine/text/tokenizer.h engine/util/utf8.h engine/util/strbuf.h
engine/text/chat_encode.h:
engine/text/chat_render.h:
engine/util/strbuf.h:
engine/text/tokenizer.h:
engine/util/utf8.h:
engine/util/strbuf.h:
