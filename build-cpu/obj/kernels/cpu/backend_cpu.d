build-cpu/obj/kernels/cpu/backend_cpu.o: kernels/cpu/backend_cpu.c \
 engine/model/backend.h engine/model/backend_modes.h \
 kernels/cpu/kv_quant.h kernels/cpu/qweight.h kernels/cpu/matmul.h \
 kernels/cpu/qweight.h kernels/cpu/threadpool.h kernels/cpu/ops.h \
 kernels/cpu/quant.h kernels/cpu/threadpool.h engine/model/tp.h
engine/model/backend.h:
engine/model/backend_modes.h:
kernels/cpu/kv_quant.h:
kernels/cpu/qweight.h:
kernels/cpu/matmul.h:
kernels/cpu/qweight.h:
kernels/cpu/threadpool.h:
kernels/cpu/ops.h:
kernels/cpu/quant.h:
kernels/cpu/threadpool.h:
engine/model/tp.h:
