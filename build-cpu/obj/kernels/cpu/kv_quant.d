build-cpu/obj/kernels/cpu/kv_quant.o: kernels/cpu/kv_quant.c \
 kernels/cpu/kv_quant.h kernels/cpu/quant.h
kernels/cpu/kv_quant.h:
kernels/cpu/quant.h:
