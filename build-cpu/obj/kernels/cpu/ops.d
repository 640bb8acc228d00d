build-cpu/obj/kernels/cpu/ops.o: kernels/cpu/ops.c kernels/cpu/ops.h \
 kernels/cpu/matmul.h kernels/cpu/qweight.h kernels/cpu/threadpool.h
kernels/cpu/ops.h:
kernels/cpu/matmul.h:
kernels/cpu/qweight.h:
kernels/cpu/threadpool.h:
