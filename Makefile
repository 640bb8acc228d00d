# DeepSeek V4 serving system: nginx module + inference engine.
# Targets: all (llm-engine), module, test, test-gpu, run, deps, clean.
# Sources are picked up by wildcard: a new engine/<layer>/*.c joins the
# engine library, a new tests/test_*.c becomes a TAP test program.  Each
# layer folder is on the include path (as nginx does with src/core,
# src/event, ...), so a header is included by its name alone.

CC       ?= gcc
LAYERS   := util text model serve cli
INCS     := -Iengine $(LAYERS:%=-Iengine/%) -Ikernels
CUDA     ?= $(if $(wildcard $(NVCC)),1,0)
NVCC     ?= /usr/local/cuda/bin/nvcc
CUDA_HOME ?= /usr/local/cuda
BUILD    := build
.DEFAULT_GOAL := all
OPT      ?= -O2
CFLAGS   := -std=c11 $(OPT) -g -Wall -Wextra -Werror -D_GNU_SOURCE -pthread \
            -fPIC $(INCS) $(EXTRA_CFLAGS)
LDLIBS   := -lyajl -lyaml -lpcre2-8 -lm -lpthread -lrt
# Extra compile+link flags for the nginx module (test-asan: sanitizers).
MODULE_CFLAGS ?=

ENGINE_SRC := $(filter-out engine/cli/main.c,$(wildcard $(LAYERS:%=engine/%/*.c))) \
              $(wildcard engine/ipc/*.c) $(wildcard kernels/cpu/*.c)
ENGINE_OBJ := $(ENGINE_SRC:%.c=$(BUILD)/obj/%.o)
TEST_SRC   := $(wildcard tests/test_*.c)
TEST_BIN   := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)

ifeq ($(CUDA),1)
CU_SRC     := $(wildcard kernels/cuda/*.cu)
CU_OBJ     := $(CU_SRC:%.cu=$(BUILD)/obj/%.o)
CFLAGS     += -DLLM_HAVE_CUDA=1 -I$(CUDA_HOME)/include
NVFLAGS    := -std=c++17 -O3 -Xcompiler -fPIC $(INCS) \
              -gencode arch=compute_90a,code=sm_90a \
              -gencode arch=compute_90,code=compute_90
LDLIBS     += -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 \
              -lnccl -lcublasLt -lcudart_static -ldl -lstdc++
endif

# Objects rebuild when the flags change (CUDA=0 vs 1, OPT=...).
FLAGS_STAMP := $(BUILD)/.flags-$(shell echo '$(CFLAGS) $(NVFLAGS)' | md5sum | cut -c1-8)
$(FLAGS_STAMP):
	@mkdir -p $(BUILD) && rm -f $(BUILD)/.flags-* && touch $@

GIT_REV := $(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)
$(BUILD)/obj/engine/util/version.o: CFLAGS += -DLLM_GIT_REV='"$(GIT_REV)"'
# In a worktree .git is a file; ask git where HEAD lives.
$(BUILD)/obj/engine/util/version.o: $(wildcard $(shell git rev-parse --git-dir 2>/dev/null)/HEAD)

# Dequantization loops vectorize only at -O3 (matmul's dot loop is written
# for -O2's straight-line vectorizer and gets worse at -O3).
$(BUILD)/obj/kernels/cpu/qweight.o: CFLAGS += -O3
$(BUILD)/obj/engine/serve/sampler.o: CFLAGS += -O3 -fno-trapping-math

LIB := $(BUILD)/libengine.a
BIN := $(BUILD)/bin/llm-engine
# The test binary: llm-engine plus the scripted runner and bench-ipc
# (tests/engine_test/README.md); the only one tests start for a
# model-free engine.
ETEST_OBJ := $(patsubst %.c,$(BUILD)/obj/%.o,$(wildcard tests/engine_test/*.c))
ETEST_BIN := $(BUILD)/tests/llm-engine-test
MOD := $(BUILD)/nginx/ngx_http_llm_module.so
DEPS_STAMP := $(BUILD)/.deps-ok
# llm-qualify (qualify/README.md); rules near the end.
QUALIFY_SRC  := $(filter-out qualify/main.c qualify/bench_serve.c,$(wildcard qualify/*.c))
QUALIFY_OBJ  := $(QUALIFY_SRC:%.c=$(BUILD)/obj/%.o)
QUALIFY_LIB  := $(BUILD)/libqualify.a
QUALIFY_BIN  := $(BUILD)/bin/llm-qualify
QUALIFY_FAKE := $(BUILD)/tests/qualify_fake_server
# llm-bench-serve: the serving benchmark, on qualify's HTTP and SSE code.
BENCH_SERVE_BIN := $(BUILD)/bin/llm-bench-serve

.PHONY: all module test test-c test-nginx test-asan test-gpu gpu-tests run deps clean fuzz qualify
all: $(BIN) $(QUALIFY_BIN) $(BENCH_SERVE_BIN)

# Install Debian packages when one is missing (fast no-op otherwise).
deps:
	@tools/deps.sh
$(DEPS_STAMP): tools/deps.sh
	@tools/deps.sh
	@mkdir -p $(BUILD) && touch $@

$(BUILD)/obj/%.o: %.c $(DEPS_STAMP) $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -MMD -MP -c $< -o $@
$(BUILD)/obj/%.o: %.cu $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -MMD -MP -c $< -o $@

$(LIB): $(ENGINE_OBJ) $(CU_OBJ)
	@rm -f $@
	ar rcs $@ $^
$(BIN): $(BUILD)/obj/engine/cli/main.o $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)
$(ETEST_BIN): $(ETEST_OBJ) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)

$(BUILD)/tests/%: tests/%.c tests/tap.h $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests $< $(LIB) -o $@ $(LDLIBS)

module: $(MOD)
$(MOD): $(DEPS_STAMP) config $(wildcard ngx_module/*.c ngx_module/*.h \
        engine/ipc/*.c engine/ipc/*.h)
	tools/build_module.sh $(BUILD)/nginx "$(MODULE_CFLAGS)"

test: $(DEPS_STAMP)
	@$(MAKE) --no-print-directory test-c test-nginx
# Tests find the programs under test in $LLM_BUILD_DIR (tests/build_dir.h).
test-c: $(BIN) $(ETEST_BIN) $(TEST_BIN) $(QUALIFY_BIN) $(QUALIFY_FAKE)
	LLM_BUILD_DIR=$(BUILD) prove -f --exec '' $(TEST_BIN)
test-nginx: $(BIN) $(ETEST_BIN) $(QUALIFY_BIN) $(MOD) $(BENCH_SERVE_BIN)
	LLM_BUILD_DIR=$(BUILD) prove -f t/

# The same suites built with AddressSanitizer + UndefinedBehaviorSanitizer
# in build-asan/ (engine, C tests, module; tools/test_asan.sh says how
# Debian's nginx loads the module).  CI runs it after test.
test-asan: $(DEPS_STAMP)
	@tools/test_asan.sh

# libFuzzer harness for the chat renderer and parser (clang; not in test):
#   make fuzz && build/fuzz/fuzz_chat -max_total_time=300
FUZZ_SRC := $(addprefix engine/text/,chat_render.c chat_messages.c \
              chat_request.c output_parser.c) \
            $(addprefix engine/util/,json.c strbuf.c utf8.c)
fuzz: $(BUILD)/fuzz/fuzz_chat
$(BUILD)/fuzz/fuzz_chat: tests/fuzz/fuzz_chat.c $(FUZZ_SRC)
	@mkdir -p $(dir $@)
	clang -std=c11 -O1 -g -D_GNU_SOURCE $(INCS) -fsanitize=fuzzer,address,undefined \
	    $^ -o $@ -lyajl

# The GPU suite (tools/test_gpu.sh): CUDA kernels against the CPU backend,
# the model on the golden fixtures with --backend cuda.  gpu-tests builds
# it without running (to carry the binaries to a GPU machine).
# (tools/kernel_trace.c: CUPTI's record of each graph replay's kernels, an
# injection library for CUDA_INJECTION64_PATH; CUDA builds only.)
KTRACE := $(if $(filter 1,$(CUDA)),$(BUILD)/lib/libkernel_trace.so)
GPU_TEST_BIN := $(patsubst tests/%.c,$(BUILD)/tests/%,$(wildcard tests/gpu/*.c))
gpu-tests: $(BIN) $(GPU_TEST_BIN) $(BUILD)/tests/test_model_golden $(BUILD)/tests/test_model_kv_dtype \
           $(BUILD)/tests/test_model_fork $(BUILD)/tests/test_prefix_cache $(KTRACE)
test-gpu: gpu-tests
	@tools/test_gpu.sh

$(BUILD)/lib/libkernel_trace.so: tools/kernel_trace.c
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -O2 -Wall -Wextra -Werror -fPIC -shared -I$(CUDA_HOME)/include $< -o $@ \
	    -L$(CUDA_HOME)/lib64 -lcupti -lstdc++ -Wl,-rpath,'$$ORIGIN' -Wl,-rpath,$(CUDA_HOME)/lib64

run: $(BIN) $(MOD)
	@tools/run.sh

clean:
	rm -rf $(BUILD) build-asan

# llm-qualify: the qualification gates as an HTTP client; links libcurl
# and the engine library for json/strbuf/sha256.  Its tests
# (tests/test_qualify_*.c) link it too and drive a fake server.
qualify: $(QUALIFY_BIN)
$(QUALIFY_LIB): $(QUALIFY_OBJ)
	@rm -f $@
	ar rcs $@ $^
$(QUALIFY_BIN): $(BUILD)/obj/qualify/main.o $(QUALIFY_LIB) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS) -lcurl
$(BENCH_SERVE_BIN): $(BUILD)/obj/qualify/bench_serve.o $(QUALIFY_LIB) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS) -lcurl
$(BUILD)/tests/test_qualify_%: tests/test_qualify_%.c tests/tap.h $(QUALIFY_LIB) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests -Iqualify $< $(QUALIFY_LIB) $(LIB) -o $@ $(LDLIBS) -lcurl
$(QUALIFY_FAKE): tests/qualify_fake_server.c tests/qualify_fake_tok.h $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests $< $(LIB) -o $@ $(LDLIBS)

-include $(ENGINE_OBJ:.o=.d) $(CU_OBJ:.o=.d) $(BUILD)/obj/engine/cli/main.d $(ETEST_OBJ:.o=.d) $(QUALIFY_OBJ:.o=.d) \
         $(BUILD)/obj/qualify/main.d $(BUILD)/obj/qualify/bench_serve.d
