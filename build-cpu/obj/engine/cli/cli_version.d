build-cpu/obj/engine/cli/cli_version.o: engine/cli/cli_version.c \
 engine/cli/cli.h engine/util/version.h
engine/cli/cli.h:
engine/util/version.h:
