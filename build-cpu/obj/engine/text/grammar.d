build-cpu/obj/engine/text/grammar.o: engine/text/grammar.c \
 engine/text/grammar.h
engine/text/grammar.h:
