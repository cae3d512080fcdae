# kiln build. `make` builds build/libkiln.a and build/kiln; `make test` builds and runs every test;
# `make test SAN=1` does the same under AddressSanitizer + UndefinedBehaviorSanitizer (in build-san/);
# `make fuzz FUZZ_SECONDS=60` runs the GGUF reader fuzzer (fuzz-tokenize, fuzz-shards, fuzz-ckpt, fuzz-serve and fuzz-grammar: the
# tokenizers', the shard loader's, the checkpoint loader's, kiln serve's request handling and the GBNF parser); `make install PREFIX=/usr/local` (and DESTDIR) installs libkiln.a,
# libkiln.so, kiln.h and kiln.pc. The CUDA backend is compiled in when nvcc is on the PATH (CUDA_ARCH SASS plus its
# PTX, sm_90 by default); CUDA=0 leaves it out. Before the first compile the preflight checks that the compiler and
# every header and library are there, and names the package of one that is not.

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
LDLIBS  += -lpcre2-8 -lutf8proc -ljansson -lmicrohttpd -lpthread -lm

ARCH := $(shell uname -m)
ifeq ($(ARCH),x86_64)
AVX2_FLAGS   = -mavx2 -mfma -mf16c
AVX512_FLAGS = $(AVX2_FLAGS) -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512vnni -mavx512bf16
AMX_FLAGS    = $(AVX512_FLAGS) -mamx-tile -mamx-int8
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
NVCC_GENCODE = -gencode arch=compute_$(CUDA_CC),code=sm_$(CUDA_CC) -gencode arch=compute_$(CUDA_CC),code=compute_$(CUDA_CC)
NVCCFLAGS += $(NVCC_GENCODE) -DKILN_CUDA_ARCH=$(CUDA_CC) -Iinclude -Isrc -Isrc/core

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

C_SRC   := $(wildcard src/*/*.c)
CU_SRC  := $(if $(filter 1,$(CUDA)),$(filter-out $(if $(filter 11,$(CUDA)$(NCCL)),,src/cuda/dist.cu),$(wildcard src/cuda/*.cu)),)
# The workbench's page (web/*), compiled in as $(BUILD)/wb_static.c (tools/bin2c.c; served by src/serve/routes_static.c).
WEB_FILES := $(sort $(wildcard web/*))
OBJ     := $(C_SRC:%.c=$(BUILD)/%.o) $(CU_SRC:%.cu=$(BUILD)/%.cu.o) $(BUILD)/wb_static.o
# The shared library's objects: the same sources compiled position-independent into $(BUILD)/pic/, so that the
# static library and the programs linked with it keep the faster non-PIC code.
PIC_OBJ := $(C_SRC:%.c=$(BUILD)/pic/%.o) $(CU_SRC:%.cu=$(BUILD)/pic/%.cu.o) $(BUILD)/pic/wb_static.o
# The *_wg.cu files hold wgmma kernels, which exist only on the sm_90a target (Hopper's architecture-specific
# features): built for sm_90, they are compiled for sm_90a (SASS) and compute_90 (PTX, where their bodies trap and
# the host never launches them: it asks kiln_cuda_attention_wgmma first). For any other CUDA_ARCH they are stubs.
ifeq ($(CUDA_CC),90)
WG_OBJ := $(patsubst %.cu,$(BUILD)/%.cu.o,$(filter %_wg.cu,$(CU_SRC))) $(patsubst %.cu,$(BUILD)/pic/%.cu.o,$(filter %_wg.cu,$(CU_SRC)))
$(WG_OBJ): NVCC_GENCODE = -gencode arch=compute_90a,code=sm_90a -gencode arch=compute_90,code=compute_90 -DKILN_WGMMA=1
endif
ifeq ($(CUDA),1)
CFLAGS += -DKILN_CUDA=1
LDLIBS += -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublasLt -lcudart -lstdc++
endif

# The version, from include/kiln.h alone: "0.1.0" and its three numbers, in the order kiln.h defines them.
VERSION_DEFS := $(shell sed -n 's/^\#define KILN_VERSION\(_[A-Z]*\)\{0,1\} "\{0,1\}\([0-9.]*\)"\{0,1\}$$/\2/p' include/kiln.h)
VERSION      := $(word 1,$(VERSION_DEFS))
ifneq ($(VERSION),$(word 2,$(VERSION_DEFS)).$(word 3,$(VERSION_DEFS)).$(word 4,$(VERSION_DEFS)))
$(error include/kiln.h: KILN_VERSION "$(VERSION)" disagrees with KILN_VERSION_MAJOR/MINOR/PATCH ($(wordlist 2,4,$(VERSION_DEFS))))
endif
SONAME := libkiln.so.$(word 2,$(VERSION_DEFS))

TEST_SRC     := $(wildcard tests/test_*.c)
TESTS        := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)
# Shell-driven tests (the build itself: preflight, install); tests/run.sh counts their lines as the programs'.
SCRIPT_TESTS := $(wildcard tests/test_*.sh)
BENCH_SRC    := $(wildcard bench/*.c)
TOOL_SRC     := $(filter-out tools/bin2c.c,$(wildcard tools/*.c))
TOOL_OBJ     := $(TOOL_SRC:%.c=$(BUILD)/%.o) $(BENCH_SRC:%.c=$(BUILD)/%.o)

.PHONY: all tests test clean fuzz fuzz-tokenize fuzz-shards fuzz-ckpt fuzz-serve fuzz-grammar demo preflight install uninstall
all: $(BUILD)/libkiln.a $(BUILD)/kiln

# ---------------------------------------------------------------- preflight
# Every compile waits for this stamp (order-only, so it never makes an object stale). It is made again when the
# Makefile changes and for each CUDA setting; a failed check leaves no stamp, so the next make checks again. A
# probe is a program that includes the header and links the library, compiled with $(CC) $(CFLAGS) as the sources
# are, so CFLAGS, C_INCLUDE_PATH and LIBRARY_PATH count. The first missing piece stops make with one line naming
# it and its Debian package; the host libraries are probed together so that one apt line covers all of them.
# (The probe defines PCRE2_CODE_UNIT_WIDTH because pcre2.h refuses to be included without it, as bpe.c does.)
PREFLIGHT      := $(BUILD)/preflight-cuda$(CUDA).ok
PREFLIGHT_LIBS := pcre2.h:-lpcre2-8:libpcre2-dev utf8proc.h:-lutf8proc:libutf8proc-dev jansson.h:-ljansson:libjansson-dev \
                  microhttpd.h:-lmicrohttpd:libmicrohttpd-dev curl/curl.h:-lcurl:libcurl4-openssl-dev
CUDA_TOOLKIT   := the CUDA toolkit (NVIDIA's cuda-toolkit package, or Debian's nvidia-cuda-toolkit) in $(CUDA_HOME)
preflight: $(PREFLIGHT)
$(PREFLIGHT): Makefile
	@probe() { printf '#define PCRE2_CODE_UNIT_WIDTH 8\n#include <%s>\nint main(void) { return 0; }\n' "$$1" | \
	  $(CC) $(CFLAGS) -x c - -x none -o /dev/null $$2 >/dev/null 2>&1; }; \
	fail() { echo "kiln: $$*" >&2; exit 1; }; \
	command -v $(firstword $(CC)) >/dev/null || fail "C compiler $(firstword $(CC)) not found: apt install gcc"; \
	probe stdio.h || fail "stdio.h not found ($(CC) compiles no C program): apt install libc6-dev"; \
	missing=; pkgs=; \
	for d in $(PREFLIGHT_LIBS); do \
	  h=$${d%%:*}; r=$${d#*:}; \
	  probe $$h $${r%%:*} || { missing="$$missing$${missing:+, }$$h"; pkgs="$$pkgs $${r#*:}"; }; \
	done; \
	[ -z "$$missing" ] || fail "$$missing not found: apt install$$pkgs"; \
	if [ "$(CUDA)" = 1 ]; then \
	  command -v $(NVCC) >/dev/null || fail "$(NVCC) not found (CUDA=1): install $(CUDA_TOOLKIT), or build with CUDA=0"; \
	  for d in cuda_runtime.h:-lcudart cublasLt.h:-lcublasLt; do \
	    probe $${d%%:*} "-I$(CUDA_HOME)/include -L$(CUDA_HOME)/lib64 $${d#*:}" || \
	      fail "$${d%%:*} or lib$${d#*-l}.so not found: it is part of $(CUDA_TOOLKIT); or build with CUDA=0"; \
	  done; \
	fi
	@mkdir -p $(dir $@) && touch $@

# ---------------------------------------------------------------- objects
# SRC_FLAGS: what one group of files adds to CFLAGS (the SIMD files their instruction sets, tools/ and bench/ the
# repository root for "bench/..." includes).
%_avx2.o: SRC_FLAGS = $(AVX2_FLAGS)
%_avx512.o: SRC_FLAGS = $(AVX512_FLAGS)
%_amx.o: SRC_FLAGS = $(AMX_FLAGS)
$(TOOL_OBJ): SRC_FLAGS = -I.

$(BUILD)/%.o: %.c | $(PREFLIGHT)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(SRC_FLAGS) -MMD -MP -c $< -o $@
$(BUILD)/%.cu.o: %.cu | $(PREFLIGHT)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -MMD -MP -c $< -o $@
$(BUILD)/pic/%.o: %.c | $(PREFLIGHT)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(SRC_FLAGS) -fPIC -MMD -MP -c $< -o $@
$(BUILD)/pic/%.cu.o: %.cu | $(PREFLIGHT)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -Xcompiler -fPIC -MMD -MP -c $< -o $@

# bin2c runs on the build machine: compiled with the host compiler, without the sanitizers, never linked into kiln.
HOST_CC ?= cc
$(BUILD)/bin2c: tools/bin2c.c | $(PREFLIGHT)
	@mkdir -p $(dir $@)
	$(HOST_CC) -std=c11 -O1 -Wall -Wextra -o $@ $<
$(BUILD)/wb_static.c: $(WEB_FILES) $(BUILD)/bin2c
	$(BUILD)/bin2c $@ $(WEB_FILES)
$(BUILD)/wb_static.o: $(BUILD)/wb_static.c | $(PREFLIGHT)
	$(CC) $(CFLAGS) -MMD -MP -c $< -o $@
$(BUILD)/pic/wb_static.o: $(BUILD)/wb_static.c | $(PREFLIGHT)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -fPIC -MMD -MP -c $< -o $@

$(BUILD)/libkiln.a: $(OBJ)
	@rm -f $@
	ar rcs $@ $^

# libkiln.so -> libkiln.so.MAJOR (the soname) -> libkiln.so.MAJOR.MINOR.PATCH, linked with the libraries it uses
# so that programs need only -lkiln.
$(BUILD)/libkiln.so.$(VERSION): $(PIC_OBJ)
	$(CC) $(CFLAGS) -shared -Wl,-soname,$(SONAME) -o $@ $^ $(LDLIBS)
$(BUILD)/libkiln.so: $(BUILD)/libkiln.so.$(VERSION)
	ln -sf libkiln.so.$(VERSION) $(BUILD)/$(SONAME)
	ln -sf $(SONAME) $@

# The CLI alone links libcurl: `kiln bench serve`'s HTTP client (bench/bench_serve.c); libkiln does not need it.
TOOL_LDLIBS := -lcurl
$(BUILD)/kiln: $(TOOL_OBJ) $(BUILD)/libkiln.a
	$(CC) $(CFLAGS) -o $@ $(TOOL_OBJ) $(BUILD)/libkiln.a $(LDLIBS) $(TOOL_LDLIBS)

# Each test is one C file linked with the library; -MMD makes it depend on every header it includes. A test of
# code in tools/ links that tool's object (listed as an extra prerequisite below).
$(BUILD)/tests/%: tests/%.c $(BUILD)/libkiln.a | $(PREFLIGHT)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -I. -Wno-format-truncation -MMD -MP -MF $@.d -MT $@ -o $@ $< $(filter $(BUILD)/tools/%.o,$^) \
	  $(BUILD)/libkiln.a $(LDLIBS)
$(BUILD)/tests/test_dist: $(BUILD)/tools/launch.o
$(BUILD)/tests/test_data: $(BUILD)/tools/plot.o

# tests/test_install.sh installs the plain build and links against it; SAN=1 builds no shared library.
TEST_NEEDS := $(TESTS) $(BUILD)/kiln $(if $(filter 0,$(SAN)),$(BUILD)/libkiln.so)
tests: $(TEST_NEEDS)

# tests/test_*.sh (tests/test_deps.sh among them: the objects of this build checked for circles and layering)
# run beside the C tests.
test: $(TEST_NEEDS)
	@KILN_BIN=$(BUILD)/kiln KILN_BUILD=$(BUILD) KILN_CC="$(CC)" KILN_CUDA=$(CUDA) KILN_SAN=$(SAN) \
	  tests/run.sh $(TESTS) $(SCRIPT_TESTS)

# ---------------------------------------------------------------- install
# make install PREFIX=/usr/local DESTDIR=: the libraries, the header and kiln.pc, whose Libs.private and
# Requires.private list what a static link needs (the CUDA libraries too when built with CUDA). A library whose
# own .pc file pkg-config cannot find is listed by its -l flag instead, so that `pkg-config kiln` still works.
PREFIX     ?= /usr/local
LIBDIR     ?= $(PREFIX)/lib
INCLUDEDIR ?= $(PREFIX)/include
# libmicrohttpd (kiln serve) goes into Libs.private as -lmicrohttpd, not Requires.private: its own .pc lists GnuTLS's
# private libraries, which Debian ships without static archives or dev links (-lunistring), so a static link fails.
PC_DEPS    := libpcre2-8:-lpcre2-8 libutf8proc:-lutf8proc jansson:-ljansson
pc_found    = $(shell pkg-config --exists $(1) 2>/dev/null && echo yes)
PC_REQUIRES = $(foreach d,$(PC_DEPS),$(if $(call pc_found,$(firstword $(subst :, ,$(d)))),$(firstword $(subst :, ,$(d)))))
PC_LIBS     = $(foreach d,$(PC_DEPS),$(if $(call pc_found,$(firstword $(subst :, ,$(d)))),,$(lastword $(subst :, ,$(d))))) \
              $(filter-out $(foreach d,$(PC_DEPS),$(lastword $(subst :, ,$(d)))),$(LDLIBS))
pc_var      = $(patsubst $(PREFIX)/%,$${prefix}/%,$(1))
define KILN_PC
prefix=$(PREFIX)
libdir=$(call pc_var,$(LIBDIR))
includedir=$(call pc_var,$(INCLUDEDIR))

Name: kiln
Description: C engine that trains and runs LLaMA-family models
Version: $(VERSION)
Requires.private: $(strip $(PC_REQUIRES))
Libs: -L$${libdir} -lkiln
Libs.private: $(strip $(PC_LIBS))
Cflags: -I$${includedir}
endef

install: $(BUILD)/libkiln.a $(BUILD)/libkiln.so
	install -d $(DESTDIR)$(LIBDIR)/pkgconfig $(DESTDIR)$(INCLUDEDIR)
	install -m 644 $(BUILD)/libkiln.a $(DESTDIR)$(LIBDIR)/libkiln.a
	install -m 755 $(BUILD)/libkiln.so.$(VERSION) $(DESTDIR)$(LIBDIR)/libkiln.so.$(VERSION)
	ln -sf libkiln.so.$(VERSION) $(DESTDIR)$(LIBDIR)/$(SONAME)
	ln -sf $(SONAME) $(DESTDIR)$(LIBDIR)/libkiln.so
	install -m 644 include/kiln.h $(DESTDIR)$(INCLUDEDIR)/kiln.h
	$(file >$(BUILD)/kiln.pc,$(KILN_PC))
	install -m 644 $(BUILD)/kiln.pc $(DESTDIR)$(LIBDIR)/pkgconfig/kiln.pc

uninstall:
	rm -f $(DESTDIR)$(LIBDIR)/libkiln.a $(DESTDIR)$(LIBDIR)/libkiln.so $(DESTDIR)$(LIBDIR)/$(SONAME) \
	  $(DESTDIR)$(LIBDIR)/libkiln.so.$(VERSION) $(DESTDIR)$(INCLUDEDIR)/kiln.h $(DESTDIR)$(LIBDIR)/pkgconfig/kiln.pc

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
# One input running past FUZZ_TIMEOUT seconds is a hang (libFuzzer's own default, 1200 s, ate 20 minutes of CI).
FUZZ_TIMEOUT ?= 120
FUZZ_CC ?= clang
fuzz:
	@mkdir -p build-fuzz/corpus tests/fuzz/crashes
	$(FUZZ_CC) -std=c11 -D_GNU_SOURCE -g -O1 -fsanitize=fuzzer,address,undefined -Iinclude -Isrc -Isrc/core \
	  tests/fuzz/fuzz_gguf.c src/core/status.c src/core/types.c src/core/file.c src/core/finite.c src/core/gguf.c \
	  -o build-fuzz/fuzz_gguf -lm -lpthread
	build-fuzz/fuzz_gguf -max_total_time=$(FUZZ_SECONDS) -timeout=$(FUZZ_TIMEOUT) -max_len=65536 -artifact_prefix=tests/fuzz/crashes/ \
	  build-fuzz/corpus tests/fuzz/corpus

# Needs ../shared/data/vocab (KILN_DATA overrides): the harness encodes with real vocabularies. The seeds in
# tests/fuzz/corpus-tok are a few KB each of real Turkish, English and C, and -max_len (16 KiB) is above their
# sizes, so the fuzzer starts from long, real text rather than short strings.
fuzz-tokenize:
	@mkdir -p build-fuzz/corpus-tok tests/fuzz/crashes
	$(FUZZ_CC) -std=c11 -D_GNU_SOURCE -g -O1 -fsanitize=fuzzer,address,undefined -Iinclude -Isrc -Isrc/core \
	  tests/fuzz/fuzz_tokenize.c src/core/status.c src/core/types.c src/core/file.c src/core/gguf.c $(filter-out src/tok/bpe_train.c src/tok/import_hf.c,$(wildcard src/tok/*.c)) \
	  -o build-fuzz/fuzz_tokenize -lpcre2-8 -lutf8proc -lm -lpthread
	build-fuzz/fuzz_tokenize -max_total_time=$(FUZZ_SECONDS) -timeout=$(FUZZ_TIMEOUT) -max_len=16384 -artifact_prefix=tests/fuzz/crashes/ \
	  build-fuzz/corpus-tok tests/fuzz/corpus-tok

# The checkpoint loader (kiln_train_load_checkpoint: the GGUF, the model's config, the run's keys, the weights and the
# moments with their validation), on the CPU build's sources (the CUDA seam's stubs, no nvcc), each compiled with the
# fuzzer's instrumentation; the SIMD kernels (*_avx2.c, *_avx512.c, *_amx.c: the loader never runs them) with their flags and
# no sanitizers, which take clang many minutes on them. The harness seeds build-fuzz/corpus-ckpt with tiny real
# checkpoints.
FUZZ_CKPT_SRC := $(C_SRC)
define fuzz_lib_objs
	@mkdir -p build-fuzz/ckpt tests/fuzz/crashes
	@for f in $(FUZZ_CKPT_SRC); do \
	  fl="-fsanitize=fuzzer-no-link,address,undefined"; \
	  case $$f in *_avx2.c) fl="$(AVX2_FLAGS)";; *_avx512.c) fl="$(AVX512_FLAGS)";; *_amx.c) fl="$(AMX_FLAGS)";; esac; \
	  o=build-fuzz/ckpt/$$(echo $$f | tr / _).o; \
	  if [ ! -e $$o ] || [ $$f -nt $$o ]; then echo "  fuzz cc $$f"; \
	    $(FUZZ_CC) -std=c11 -D_GNU_SOURCE -g -O1 $$fl -Iinclude -Isrc -Isrc/core -c $$f -o $$o || exit 1; fi; \
	done
	@$(HOST_CC) -std=c11 -O1 -o build-fuzz/bin2c tools/bin2c.c && build-fuzz/bin2c build-fuzz/wb_static.c $(WEB_FILES)
	@$(FUZZ_CC) -std=c11 -g -O1 -fsanitize=fuzzer-no-link,address,undefined -Isrc -c build-fuzz/wb_static.c -o build-fuzz/ckpt/wb_static.o
endef
fuzz-ckpt:
	$(fuzz_lib_objs)
	@mkdir -p build-fuzz/corpus-ckpt
	$(FUZZ_CC) -std=c11 -D_GNU_SOURCE -g -O1 -fsanitize=fuzzer,address,undefined -Iinclude -Isrc -Isrc/core \
	  tests/fuzz/fuzz_checkpoint.c build-fuzz/ckpt/*.o -o build-fuzz/fuzz_checkpoint -lpcre2-8 -lutf8proc -ljansson -lmicrohttpd -lm -lpthread
	KILN_FUZZ_SEED_DIR=build-fuzz/corpus-ckpt build-fuzz/fuzz_checkpoint -max_total_time=$(FUZZ_SECONDS) -timeout=$(FUZZ_TIMEOUT) -max_len=65536 \
	  -artifact_prefix=tests/fuzz/crashes/ build-fuzz/corpus-ckpt

# kiln serve's request handling (srv_handle: routes, auth, limits, JSON bodies), on the library's objects of fuzz-ckpt
# and the bundled model; seeds in tests/fuzz/corpus-serve (fuzz_serve.c gives the input's layout).
fuzz-serve:
	$(fuzz_lib_objs)
	@mkdir -p build-fuzz/corpus-serve
	$(FUZZ_CC) -std=c11 -D_GNU_SOURCE -g -O1 -fsanitize=fuzzer,address,undefined -Iinclude -Isrc -Isrc/core \
	  tests/fuzz/fuzz_serve.c build-fuzz/ckpt/*.o -o build-fuzz/fuzz_serve -lpcre2-8 -lutf8proc -ljansson -lmicrohttpd -lm -lpthread
	build-fuzz/fuzz_serve -max_total_time=$(FUZZ_SECONDS) -timeout=$(FUZZ_TIMEOUT) -max_len=8192 -artifact_prefix=tests/fuzz/crashes/ \
	  build-fuzz/corpus-serve tests/fuzz/corpus-serve

# The shard manifest and loader (src/train/data.c): inputs become manifests and shards in a temporary folder.
fuzz-shards:
	@mkdir -p build-fuzz/corpus-shards tests/fuzz/crashes
	$(FUZZ_CC) -std=c11 -D_GNU_SOURCE -g -O1 -fsanitize=fuzzer,address,undefined -Iinclude -Isrc -Isrc/core \
	  tests/fuzz/fuzz_shards.c src/train/data.c src/core/status.c src/core/types.c src/core/file.c src/core/gguf.c \
	  $(filter-out src/tok/bpe_train.c src/tok/import_hf.c,$(wildcard src/tok/*.c)) -o build-fuzz/fuzz_shards -lpcre2-8 -lutf8proc -lm -lpthread
	build-fuzz/fuzz_shards -max_total_time=$(FUZZ_SECONDS) -timeout=$(FUZZ_TIMEOUT) -max_len=4096 -artifact_prefix=tests/fuzz/crashes/ \
	  build-fuzz/corpus-shards tests/fuzz/corpus-shards

# The GBNF parser and the recognizer's code-point walk (src/infer/grammar_parse.c, grammar.c); the tokenizer sources only resolve the
# matcher's symbols (the harness makes no matcher).
fuzz-grammar:
	@mkdir -p build-fuzz/corpus-grammar tests/fuzz/crashes
	$(FUZZ_CC) -std=c11 -D_GNU_SOURCE -g -O1 -fsanitize=fuzzer,address,undefined -Iinclude -Isrc -Isrc/core \
	  tests/fuzz/fuzz_grammar.c src/infer/grammar.c src/infer/grammar_parse.c src/core/status.c src/core/types.c src/core/file.c src/core/gguf.c \
	  $(filter-out src/tok/bpe_train.c src/tok/import_hf.c,$(wildcard src/tok/*.c)) -o build-fuzz/fuzz_grammar -lpcre2-8 -lutf8proc -lm -lpthread
	build-fuzz/fuzz_grammar -max_total_time=$(FUZZ_SECONDS) -timeout=$(FUZZ_TIMEOUT) -max_len=4096 -artifact_prefix=tests/fuzz/crashes/ \
	  build-fuzz/corpus-grammar tests/fuzz/corpus-grammar

clean:
	rm -rf build build-san build-fuzz

-include $(OBJ:.o=.d) $(PIC_OBJ:.o=.d) $(TOOL_OBJ:.o=.d) $(TESTS:=.d)
