build-cpu/obj/engine/text/json_schema.o: engine/text/json_schema.c \
 engine/text/json_schema.h engine/text/grammar.h engine/util/json.h \
 engine/util/strbuf.h engine/util/strbuf.h
engine/text/json_schema.h:
engine/text/grammar.h:
engine/util/json.h:
engine/util/strbuf.h:
engine/util/strbuf.h:
