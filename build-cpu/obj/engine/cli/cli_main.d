build-cpu/obj/engine/cli/cli_main.o: engine/cli/cli_main.c \
 engine/cli/cli.h
engine/cli/cli.h:
