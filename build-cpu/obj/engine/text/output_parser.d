build-cpu/obj/engine/text/output_parser.o: engine/text/output_parser.c \
 engine/text/output_parser.h engine/util/strbuf.h engine/util/json.h \
 engine/util/strbuf.h engine/util/utf8.h
engine/text/output_parser.h:
engine/util/strbuf.h:
engine/util/json.h:
engine/util/strbuf.h:
engine/util/utf8.h:
