build-cpu/obj/engine/serve/procfs.o: engine/serve/procfs.c \
 engine/serve/procfs.h
engine/serve/procfs.h:
