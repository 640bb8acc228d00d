build-cpu/obj/engine/text/chat_render.o: engine/text/chat_render.c \
 engine/text/chat_render.h engine/util/strbuf.h engine/util/json.h \
 engine/util/strbuf.h
engine/text/chat_render.h:
engine/util/strbuf.h:
engine/util/json.h:
engine/util/strbuf.h:
