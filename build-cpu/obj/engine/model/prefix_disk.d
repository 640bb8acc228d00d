build-cpu/obj/engine/model/prefix_disk.o: engine/model/prefix_disk.c \
 engine/model/prefix_disk.h engine/util/strbuf.h engine/util/sha256.h
engine/model/prefix_disk.h:
engine/util/strbuf.h:
engine/util/sha256.h:
