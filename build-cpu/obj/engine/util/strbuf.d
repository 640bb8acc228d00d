build-cpu/obj/engine/util/strbuf.o: engine/util/strbuf.c \
 engine/util/strbuf.h
engine/util/strbuf.h:
