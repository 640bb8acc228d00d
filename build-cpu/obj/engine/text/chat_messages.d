build-cpu/obj/engine/text/chat_messages.o: engine/text/chat_messages.c \
 engine/text/chat_render.h engine/util/strbuf.h engine/util/json.h \
 engine/util/strbuf.h engine/util/utf8.h
engine/text/chat_render.h:
engine/util/strbuf.h:
engine/util/json.h:
engine/util/strbuf.h:
engine/util/utf8.h:
