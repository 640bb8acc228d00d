build-cpu/obj/engine/util/json.o: engine/util/json.c engine/util/json.h \
 engine/util/strbuf.h engine/util/utf8.h
engine/util/json.h:
engine/util/strbuf.h:
engine/util/utf8.h:
