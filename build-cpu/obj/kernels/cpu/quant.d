build-cpu/obj/kernels/cpu/quant.o: kernels/cpu/quant.c \
 kernels/cpu/quant.h
kernels/cpu/quant.h:
