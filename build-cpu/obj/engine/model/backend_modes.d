build-cpu/obj/engine/model/backend_modes.o: engine/model/backend_modes.c \
 engine/model/backend_modes.h
engine/model/backend_modes.h:
