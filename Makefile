# ResNet-50 trainer in CUDA C++.
#   make            bin/train with every optimization on
#   make run        set up, then train on the default data (CIFAR-10 if fetched, else Fashion-MNIST)
#   make test       set up, build and run every test; ends with "N passed, N failed, N skipped"
#   make variants   the optimization ladder: bin/train-{baseline,devloss,pinned,autotune,fp16,nhwc}
#   make custom NAME=x DEVICE_LOSS=1 PINNED=0 AUTOTUNE=1 FP16=1 NHWC=0   any other combination
#   make bench / make profile / make fuzz / make sanitize / make data / make deps
SHELL := /bin/bash
.DEFAULT_GOAL := all

# ---- toolchain and libraries (found both on Debian with CUDA in /usr/local/cuda and on Ubuntu with
# ---- cuDNN under /usr/include/x86_64-linux-gnu) ---------------------------------------------------
CUDA_HOME ?= $(firstword $(wildcard /usr/local/cuda /usr/lib/cuda))
NVCC      := $(CUDA_HOME)/bin/nvcc
CXX       ?= g++
first_dir  = $(patsubst %/,%,$(dir $(firstword $(wildcard $(1)))))
CUDNN_INC ?= $(call first_dir,$(CUDA_HOME)/include/cudnn.h /usr/include/x86_64-linux-gnu/cudnn.h /usr/include/cudnn.h)
CUDNN_LIB ?= $(call first_dir,$(CUDA_HOME)/lib64/libcudnn.so /usr/lib/x86_64-linux-gnu/libcudnn.so /usr/lib64/libcudnn.so)
CUPTI_INC ?= $(call first_dir,$(CUDA_HOME)/include/cupti.h $(CUDA_HOME)/extras/CUPTI/include/cupti.h)
CUPTI_LIB ?= $(call first_dir,$(CUDA_HOME)/lib64/libcupti.so $(CUDA_HOME)/extras/CUPTI/lib64/libcupti.so)
# Where Debian/Ubuntu's libstb-dev and googletest packages put them (make deps installs them).
STB_INCLUDE ?= /usr/include/stb
GTEST_SRC ?= /usr/src/googletest/googletest

# The GPU this machine has, else Hopper (sm_90); CUDA_ARCH=80 etc. overrides.
CUDA_ARCH ?= $(or $(shell nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d .),90)

INCLUDES := -Iinclude -I$(CUDA_HOME)/include -I$(CUDNN_INC) -I$(CUPTI_INC) -isystem $(STB_INCLUDE)
CXXFLAGS := -std=c++20 -O2 -g -Wall -Wextra -Wno-unused-parameter $(INCLUDES)
NVFLAGS  := -std=c++20 -O3 -g -lineinfo -gencode arch=compute_$(CUDA_ARCH),code=sm_$(CUDA_ARCH) \
            --expt-relaxed-constexpr -Xcompiler -Wall $(INCLUDES)
LDFLAGS  := -L$(CUDA_HOME)/lib64 -L$(CUDNN_LIB) -L$(CUPTI_LIB) \
            -Wl,-rpath,$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDNN_LIB) -Wl,-rpath,$(CUPTI_LIB)
LDLIBS   := -lcudnn -lcublas -lcupti -lcudart -lz -lpthread -ldl

# ---- sources ------------------------------------------------------------------------------------
# Only the files that read the switchboard (include/settings.h) are built once per variant.
VARIANT_SRC := src/main.cpp src/train.cpp
COMMON_SRC  := $(filter-out $(VARIANT_SRC),$(wildcard src/*.cpp))
KERNEL_SRC  := $(wildcard kernels/*.cu)
COMMON_OBJ  := $(COMMON_SRC:src/%.cpp=build/obj/%.o) $(KERNEL_SRC:kernels/%.cu=build/obj/kernels/%.o)
TEST_SRC    := $(wildcard tests/*.cpp)
TEST_OBJ    := $(TEST_SRC:tests/%.cpp=build/tests/%.o)

# The ladder, cumulative in the seed posts' order: DEVICE_LOSS PINNED AUTOTUNE FP16 NHWC.
LADDER          := baseline devloss pinned autotune fp16 nhwc
OPTS_baseline   := 0 0 0 0 0
OPTS_devloss    := 1 0 0 0 0
OPTS_pinned     := 1 1 0 0 0
OPTS_autotune   := 1 1 1 0 0
OPTS_fp16       := 1 1 1 1 0
OPTS_nhwc       := 1 1 1 1 1
OPTS_train      := 1 1 1 1 1
opt_defines = $(shell set -- $(1); echo -DOPT_DEVICE_LOSS=$$1 -DOPT_PINNED=$$2 -DOPT_AUTOTUNE=$$3 -DOPT_FP16=$$4 -DOPT_NHWC=$$5)
variant_name = $(if $(filter train,$(1)),train,train-$(1))

.PHONY: all variants custom run test unit-tests bench profile fuzz fuzz-build sanitize data deps clean
all: bin/train

# ---- set-up: what a fresh Debian/Ubuntu machine with CUDA and cuDNN may lack -----------------------
# Installs with apt-get what is missing (as root, or through passwordless sudo), saying what and why;
# where it cannot, it names the package and stops. The stamp keeps later builds from asking again.
APT_PACKAGES = $(if $(wildcard $(STB_INCLUDE)/stb_image.h),,libstb-dev) \
               $(if $(wildcard $(GTEST_SRC)/src/gtest-all.cc),,googletest) \
               $(if $(or $(FASHION_MNIST_DIR),$(wildcard /usr/share/datasets/fashion-mnist/*.gz)),,dataset-fashion-mnist)
build/.deps-ok:
	@pkgs="$(strip $(APT_PACKAGES))"; \
	if [ -n "$$pkgs" ]; then \
	  echo "set-up: installing $$pkgs with apt-get (stb headers for PNG output, GoogleTest sources, Fashion-MNIST data)"; \
	  if [ "$$(id -u)" = 0 ]; then sudo=""; elif sudo -n true 2>/dev/null; then sudo="sudo -n"; \
	  else echo "error: missing $$pkgs and no root rights: run 'sudo apt-get install $$pkgs', then make again"; exit 1; fi; \
	  $$sudo apt-get install -y -q $$pkgs >/dev/null 2>&1 || { $$sudo apt-get update -q >/dev/null 2>&1; \
	    $$sudo apt-get install -y -q $$pkgs >/dev/null; } || \
	    { echo "error: apt-get could not install $$pkgs; install them by hand, then make again"; exit 1; }; \
	fi
	@test -x $(NVCC) || { echo "error: nvcc not found under CUDA_HOME=$(CUDA_HOME): install the CUDA toolkit or set CUDA_HOME"; exit 1; }
	@test -n "$(CUDNN_INC)" || { echo "error: cudnn.h not found (looked in $(CUDA_HOME)/include and /usr/include): install cuDNN 9 or set CUDNN_INC and CUDNN_LIB"; exit 1; }
	@mkdir -p build && touch $@
deps: build/.deps-ok

# ---- compile ------------------------------------------------------------------------------------
build/obj/%.o: src/%.cpp | build/.deps-ok
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) -MMD -MP -c $< -o $@

build/obj/kernels/%.o: kernels/%.cu | build/.deps-ok
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -MMD -MP -c $< -o $@

# Per-variant objects: build/<variant>/{main,train}.o with that variant's defines.
define VARIANT_RULES
build/$(1)/%.o: src/%.cpp | build/.deps-ok
	@mkdir -p $$(dir $$@)
	$$(CXX) $$(CXXFLAGS) $(call opt_defines,$(OPTS_$(1))) -DVARIANT_NAME='"$(call variant_name,$(1))"' -MMD -MP -c $$< -o $$@
bin/$(call variant_name,$(1)): $(VARIANT_SRC:src/%.cpp=build/$(1)/%.o) $(COMMON_OBJ)
	@mkdir -p bin
	$$(CXX) $$^ -o $$@ $$(LDFLAGS) $$(LDLIBS)
endef
$(foreach v,$(LADDER) train,$(eval $(call VARIANT_RULES,$(v))))

variants: $(foreach v,$(LADDER),bin/train-$(v))

# Any other combination: make custom NAME=fp16-only DEVICE_LOSS=1 PINNED=1 AUTOTUNE=1 FP16=1 NHWC=0
NAME ?= custom
OPTS_$(NAME) ?= $(or $(DEVICE_LOSS),1) $(or $(PINNED),1) $(or $(AUTOTUNE),1) $(or $(FP16),1) $(or $(NHWC),1)
ifeq ($(filter $(NAME),$(LADDER) train),)
$(eval $(call VARIANT_RULES,$(NAME)))
endif
custom: bin/train-$(NAME)

# ---- tests --------------------------------------------------------------------------------------
build/gtest/libgtest.a: | build/.deps-ok
	@mkdir -p build/gtest
	$(CXX) -std=c++17 -O1 -I$(GTEST_SRC)/include -I$(GTEST_SRC) -c $(GTEST_SRC)/src/gtest-all.cc -o build/gtest/gtest-all.o
	ar rcs $@ build/gtest/gtest-all.o

build/tests/%.o: tests/%.cpp | build/.deps-ok
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) -I$(GTEST_SRC)/include -MMD -MP -c $< -o $@

bin/unit_tests: $(TEST_OBJ) $(COMMON_OBJ) build/gtest/libgtest.a
	@mkdir -p bin
	$(CXX) $^ -o $@ $(LDFLAGS) $(LDLIBS)

unit-tests: bin/unit_tests

test: bin/unit_tests bin/train fuzz-build
	@python3 tests/run_tests.py

# ---- fuzzing (clang + libFuzzer, CPU only): one target per reader -------------------------------------
# make fuzz runs each target for FUZZ_RUNS executions; make test runs a short smoke of each.
FUZZ_CXX   ?= $(shell command -v clang++ 2>/dev/null)
FUZZ_RUNS  ?= 1000000
FUZZ_SRC   := src/file_io.cpp src/data_cifar10.cpp src/data_fashion_mnist.cpp src/checkpoint.cpp \
              src/autotune_cache.cpp src/options.cpp
FUZZ_TARGETS := $(patsubst tests/fuzz/%.cpp,build/fuzz/%,$(wildcard tests/fuzz/fuzz_*.cpp))
FUZZ_FLAGS := -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -Iinclude
build/fuzz/fuzz_%: tests/fuzz/fuzz_%.cpp $(FUZZ_SRC) include/*.h
	@mkdir -p build/fuzz
	$(FUZZ_CXX) $(FUZZ_FLAGS) $< $(FUZZ_SRC) -o $@ -lz
build/fuzz/corpus: tests/fuzz/make_corpus.py
	python3 $< $@
	@touch $@
ifeq ($(FUZZ_CXX),)
fuzz-build:
	@echo "fuzz: clang++ not found, fuzz targets not built (apt-get install clang)"
else
fuzz-build: $(FUZZ_TARGETS) build/fuzz/corpus
endif
fuzz: fuzz-build
	@for t in $(FUZZ_TARGETS); do n=$$(basename $$t); mkdir -p build/fuzz/work/$$n; \
	  echo "== $$n: $(FUZZ_RUNS) runs"; \
	  $$t -runs=$(FUZZ_RUNS) -max_len=65536 -rss_limit_mb=4096 -print_final_stats=1 build/fuzz/work/$$n build/fuzz/corpus/$${n#fuzz_} 2>&1 \
	    | grep -E "stat::number_of_executed_units|ERROR|SUMMARY|Done" || exit 1; done

# ---- running ------------------------------------------------------------------------------------
run: bin/train
	@bash data/prepare.sh --strict
	./bin/train $(ARGS)

data: build/.deps-ok
	@bash data/prepare.sh --strict

bench: variants
	@python3 bench/bench.py $(BENCH_ARGS)

profile: variants
	@python3 bench/profile.py $(PROFILE_ARGS)

clean:
	rm -rf build bin

-include $(shell find build -name '*.d' 2>/dev/null)
