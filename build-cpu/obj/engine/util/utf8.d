build-cpu/obj/engine/util/utf8.o: engine/util/utf8.c engine/util/utf8.h \
 engine/util/strbuf.h
engine/util/utf8.h:
engine/util/strbuf.h:
