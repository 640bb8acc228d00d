build-cpu/obj/kernels/cpu/matmul.o: kernels/cpu/matmul.c \
 kernels/cpu/matmul.h kernels/cpu/qweight.h kernels/cpu/threadpool.h \
 kernels/cpu/hot.h
kernels/cpu/matmul.h:
kernels/cpu/qweight.h:
kernels/cpu/threadpool.h:
kernels/cpu/hot.h:
