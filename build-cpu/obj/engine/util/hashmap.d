build-cpu/obj/engine/util/hashmap.o: engine/util/hashmap.c \
 engine/util/hashmap.h
engine/util/hashmap.h:
