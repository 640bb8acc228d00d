build-cpu/obj/engine/util/version.o: engine/util/version.c \
 engine/util/version.h
engine/util/version.h:
