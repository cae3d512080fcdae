# kiln build. `make` builds build/libkiln.a and build/kiln; `make test` builds and runs every test;
# `make test SAN=1` does the same under AddressSanitizer + UndefinedBehaviorSanitizer (in build-san/);
# `make fuzz FUZZ_SECONDS=60` runs the GGUF reader fuzzer. The CUDA backend is compiled in when nvcc is
# on the PATH (sm_90 SASS plus compute_90 PTX); CUDA=0 leaves it out.

CC      ?= cc
NVCC    ?= nvcc
SAN     ?= 0
ifeq ($(SAN),1)
BUILD   ?= build-san
SANFLAGS = -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
else
BUILD   ?= build
SANFLAGS =
endif
OPT     ?= -O2
CFLAGS  ?= $(OPT) -g
CFLAGS  += -std=c11 -D_GNU_SOURCE -Wall -Wextra -Wshadow -Wno-unused-parameter -Iinclude -Isrc -Isrc/core $(SANFLAGS)
LDLIBS  += -lpcre2-8 -lutf8proc -lpthread -lm

ARCH := $(shell uname -m)
ifeq ($(ARCH),x86_64)
AVX2_FLAGS   = -mavx2 -mfma -mf16c
AVX512_FLAGS = $(AVX2_FLAGS) -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512vnni -mavx512bf16
endif

CUDA ?= $(if $(shell command -v $(NVCC) 2>/dev/null),1,0)
CUDA_HOME ?= $(patsubst %/bin/,%,$(dir $(shell command -v $(NVCC) 2>/dev/null)))
# CUDA_ARCH=sm_XX: SASS for compute capability X.x and PTX that the driver compiles for any later one. The
# backend refuses an older device when an engine or trainer starts (kiln_cuda_check_device, from KILN_CUDA_ARCH)
# instead of failing at the first launch with "no kernel image is available".
CUDA_ARCH ?= sm_90
CUDA_CC   := $(patsubst sm_%,%,$(CUDA_ARCH))
non_digits = $(subst 0,,$(subst 1,,$(subst 2,,$(subst 3,,$(subst 4,,$(subst 5,,$(subst 6,,$(subst 7,,$(subst 8,,$(subst 9,,$(1)))))))))))
ifneq ($(CUDA_ARCH)$(call non_digits,$(CUDA_CC)),sm_$(CUDA_CC))
$(error CUDA_ARCH=$(CUDA_ARCH) is not of the form sm_XX (sm_80, sm_90, sm_100))
endif
NVCCFLAGS ?= -O3 -std=c++17
NVCCFLAGS += -gencode arch=compute_$(CUDA_CC),code=sm_$(CUDA_CC) -gencode arch=compute_$(CUDA_CC),code=compute_$(CUDA_CC) \
             -DKILN_CUDA_ARCH=$(CUDA_CC) -Iinclude -Isrc -Isrc/core

# NCCL, for multi-GPU training (src/cuda/dist.cu), with CUDA only: found when nccl.h is in $(NCCL_HOME)/include,
# $(CUDA_HOME)/include or /usr/include and libnccl.so (or .so.2) in $(NCCL_HOME)/lib, $(CUDA_HOME)/lib, $(CUDA_HOME)/lib64
# or on the compiler's library path (-print-file-name answers a bare name when it is not). NCCL_HOME is for an NCCL
# of its own, e.g. the nvidia-nccl wheel's directory. Without NCCL, src/cuda/dist_none.c answers "built without NCCL".
ifeq ($(CUDA),1)
NCCL_HOME ?=
ifneq ($(NCCL_HOME),)
ifeq ($(wildcard $(NCCL_HOME)/include/nccl.h),)
$(error NCCL_HOME=$(NCCL_HOME) has no include/nccl.h)
endif
endif
NCCL_INC := $(firstword $(wildcard $(if $(NCCL_HOME),$(NCCL_HOME)/include/nccl.h) $(CUDA_HOME)/include/nccl.h /usr/include/nccl.h))
NCCL_LIB := $(firstword $(wildcard $(if $(NCCL_HOME),$(NCCL_HOME)/lib/libnccl.so $(NCCL_HOME)/lib/libnccl.so.2) \
              $(CUDA_HOME)/lib/libnccl.so $(CUDA_HOME)/lib64/libnccl.so) $(filter /%,$(shell $(CC) -print-file-name=libnccl.so)))
NCCL ?= $(if $(and $(NCCL_INC),$(NCCL_LIB)),1,0)
endif
ifeq ($(CUDA)$(NCCL),11)
NCCL_DIR   := $(patsubst %/,%,$(dir $(NCCL_LIB)))
CFLAGS     += -DKILN_NCCL=1
NVCCFLAGS  += -DKILN_NCCL=1 $(if $(NCCL_INC),-I$(patsubst %/,%,$(dir $(NCCL_INC))))
comma      := ,
LDLIBS     += $(if $(NCCL_LIB),$(NCCL_LIB) -Wl$(comma)-rpath$(comma)$(NCCL_DIR),-lnccl)
endif

C_SRC  := $(wildcard src/*/*.c)
CU_SRC := $(if $(filter 1,$(CUDA)),$(filter-out $(if $(filter 11,$(CUDA)$(NCCL)),,src/cuda/dist.cu),$(wildcard src/cuda/*.cu)),)
OBJ    := $(C_SRC:%.c=$(BUILD)/%.o) $(CU_SRC:%.cu=$(BUILD)/%.cu.o)
ifeq ($(CUDA),1)
CFLAGS += -DKILN_CUDA=1
LDLIBS += -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublasLt -lcudart -lstdc++
endif

TEST_SRC := $(wildcard tests/test_*.c)
TESTS    := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)

.PHONY: all tests test clean fuzz fuzz-tokenize demo
all: $(BUILD)/libkiln.a $(BUILD)/kiln

$(BUILD)/src/cpu/%_avx2.o: src/cpu/%_avx2.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(AVX2_FLAGS) -MMD -MP -c $< -o $@
$(BUILD)/src/cpu/%_avx512.o: src/cpu/%_avx512.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(AVX512_FLAGS) -MMD -MP -c $< -o $@
$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -MMD -MP -c $< -o $@
$(BUILD)/%.cu.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/libkiln.a: $(OBJ)
	@rm -f $@
	ar rcs $@ $^

BENCH_SRC := $(wildcard bench/*.c)
TOOL_SRC  := $(wildcard tools/*.c)
$(BUILD)/kiln: $(TOOL_SRC) tools/cmd.h $(BENCH_SRC) $(wildcard bench/*.h) $(BUILD)/libkiln.a
	$(CC) $(CFLAGS) -I. -o $@ $(TOOL_SRC) $(BENCH_SRC) $(BUILD)/libkiln.a $(LDLIBS)

$(BUILD)/tests/%: tests/%.c tests/test.h $(BUILD)/libkiln.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Wno-format-truncation -o $@ $< $(BUILD)/libkiln.a $(LDLIBS)

tests: $(TESTS)

test: $(TESTS) $(BUILD)/kiln
	@KILN_BIN=$(BUILD)/kiln tests/run.sh $(TESTS)

# The quick start: a synthetic llama model, quantized to Q4_K_M and inspected; then, where ../shared/data
# has it, the real stories260K model converted from llama2.c and run.
STORIES ?= ../shared/data/models/stories260K
demo: all
	$(BUILD)/kiln synth -o $(BUILD)/demo-f32.gguf
	$(BUILD)/kiln quantize $(BUILD)/demo-f32.gguf $(BUILD)/demo-q4_k_m.gguf q4_k_m
	$(BUILD)/kiln inspect $(BUILD)/demo-q4_k_m.gguf
	@if [ -f $(STORIES)/stories260K.bin ]; then \
	  $(BUILD)/kiln convert llama2c $(STORIES)/stories260K.bin --tokenizer $(STORIES)/tok512.bin -o $(BUILD)/stories260K.gguf && \
	  $(BUILD)/kiln generate -m $(BUILD)/stories260K.gguf -p "Once upon a time" -n 120 --temp 0.8 --seed 7; echo; \
	else echo "demo: $(STORIES) not found: skipping text generation"; fi

# libFuzzer needs clang. Crashes land in tests/fuzz/crashes/; copy each into tests/fuzz/regress/ so
# test_gguf_fuzz_regress replays it on every `make test`.
FUZZ_SECONDS ?= 60
FUZZ_CC ?= clang
fuzz:
	@mkdir -p build-fuzz/corpus tests/fuzz/crashes
	$(FUZZ_CC) -std=c11 -D_GNU_SOURCE -g -O1 -fsanitize=fuzzer,address,undefined -Iinclude -Isrc -Isrc/core \
	  tests/fuzz/fuzz_gguf.c src/core/status.c src/core/types.c src/core/gguf.c -o build-fuzz/fuzz_gguf -lm -lpthread
	build-fuzz/fuzz_gguf -max_total_time=$(FUZZ_SECONDS) -max_len=65536 -artifact_prefix=tests/fuzz/crashes/ \
	  build-fuzz/corpus tests/fuzz/corpus

# Needs ../shared/data/vocab (KILN_DATA overrides): the harness encodes with real vocabularies.
fuzz-tokenize:
	@mkdir -p build-fuzz/corpus-tok tests/fuzz/crashes
	$(FUZZ_CC) -std=c11 -D_GNU_SOURCE -g -O1 -fsanitize=fuzzer,address,undefined -Iinclude -Isrc -Isrc/core \
	  tests/fuzz/fuzz_tokenize.c src/core/status.c src/core/types.c src/core/gguf.c $(filter-out src/tok/bpe_train.c,$(wildcard src/tok/*.c)) \
	  -o build-fuzz/fuzz_tokenize -lpcre2-8 -lutf8proc -lm -lpthread
	build-fuzz/fuzz_tokenize -max_total_time=$(FUZZ_SECONDS) -max_len=4096 -artifact_prefix=tests/fuzz/crashes/ \
	  build-fuzz/corpus-tok tests/fuzz/corpus-tok

clean:
	rm -rf build build-san build-fuzz

-include $(OBJ:.o=.d)
