build-cpu/obj/engine/text/fingerprint.o: engine/text/fingerprint.c \
 engine/text/fingerprint.h engine/util/sha256.h
engine/text/fingerprint.h:
engine/util/sha256.h:
