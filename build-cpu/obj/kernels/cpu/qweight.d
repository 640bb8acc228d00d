build-cpu/obj/kernels/cpu/qweight.o: kernels/cpu/qweight.c \
 kernels/cpu/qweight.h kernels/cpu/hot.h kernels/cpu/quant.h
kernels/cpu/qweight.h:
kernels/cpu/hot.h:
kernels/cpu/quant.h:
