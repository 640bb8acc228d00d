build-cpu/obj/engine/util/sha256.o: engine/util/sha256.c \
 engine/util/sha256.h
engine/util/sha256.h:
