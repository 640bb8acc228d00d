build-cpu/obj/engine/cli/cli_parse.o: engine/cli/cli_parse.c \
 engine/cli/cli.h engine/text/output_parser.h engine/util/strbuf.h
engine/cli/cli.h:
engine/text/output_parser.h:
engine/util/strbuf.h:
