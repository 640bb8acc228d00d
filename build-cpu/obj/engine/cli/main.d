build-cpu/obj/engine/cli/main.o: engine/cli/main.c engine/cli/cli.h
engine/cli/cli.h:
