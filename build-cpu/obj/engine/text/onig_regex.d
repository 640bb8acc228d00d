build-cpu/obj/engine/text/onig_regex.o: engine/text/onig_regex.c \
 engine/text/onig_regex.h engine/util/strbuf.h engine/text/onig_unicode.h
engine/text/onig_regex.h:
engine/util/strbuf.h:
engine/text/onig_unicode.h:
