build-cpu/obj/engine/model/tp.o: engine/model/tp.c engine/model/tp.h
engine/model/tp.h:
