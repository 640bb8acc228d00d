build-cpu/obj/engine/cli/cli_janitor.o: engine/cli/cli_janitor.c \
 engine/cli/cli.h engine/serve/janitor.h engine/util/strbuf.h
engine/cli/cli.h:
engine/serve/janitor.h:
engine/util/strbuf.h:
