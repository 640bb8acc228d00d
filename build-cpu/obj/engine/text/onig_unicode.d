build-cpu/obj/engine/text/onig_unicode.o: engine/text/onig_unicode.c \
 engine/text/onig_unicode.h
engine/text/onig_unicode.h:
