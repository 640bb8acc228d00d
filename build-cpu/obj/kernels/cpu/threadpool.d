build-cpu/obj/kernels/cpu/threadpool.o: kernels/cpu/threadpool.c \
 kernels/cpu/threadpool.h
kernels/cpu/threadpool.h:
