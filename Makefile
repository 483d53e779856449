# ResNet-50 trainer in CUDA C++.
#   make            bin/train with every optimization on
#   make run        set up, then train on the default data (CIFAR-10 if fetched, else Fashion-MNIST)
#   make test       set up, build and run every test; ends with "N passed, N failed, N skipped"
#   make variants   the optimization ladder: bin/train-{baseline,devloss,pinned,autotune,fp16,nhwc,graph,fusedbn,cudagraph,wgradstream}
#   make custom NAME=x DEVICE_LOSS=1 PINNED=0 AUTOTUNE=1 FP16=1 NHWC=0 CONV_GRAPH=1 FUSED_BN=0 CUDA_GRAPH=1 WGRAD_STREAM=1   any other combination
#   make predict-variants   bin/predict's egress ladder: bin/predict-{baseline,workers,pool,async,stream}, bin/predict
#   make kernel-lab [RUN=1 LAB_ARGS=...]   bin/kernel_lab: the BN and fused-conv kernels' versions side by side
#   make run GPUS=N / make profile GPUS=N / make bench-scaling   data parallel on N GPUs (docs/multi-gpu.md)
#   make bench / make bench-predict / make bench-folder / make bench-tta / make profile / make fuzz / make sanitize / make sanitize-gpu
#   make data / make data-folder / make deps
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
# NCCL ships with the CUDA toolkit on some machines and as Debian/Ubuntu packages (libnccl-dev) on others.
NCCL_INC  ?= $(call first_dir,$(CUDA_HOME)/include/nccl.h /usr/include/nccl.h /usr/include/x86_64-linux-gnu/nccl.h)
NCCL_LIB  ?= $(call first_dir,$(CUDA_HOME)/lib64/libnccl.so* /usr/lib/x86_64-linux-gnu/libnccl.so* /usr/lib64/libnccl.so*)
# Without the development symlink libnccl.so, link the runtime library by its name.
NCCL_LINK := $(if $(wildcard $(NCCL_LIB)/libnccl.so),-lnccl,-l:libnccl.so.2)
# Where Debian/Ubuntu's libstb-dev and googletest packages put them (make deps installs them).
STB_INCLUDE ?= /usr/include/stb
GTEST_SRC ?= /usr/src/googletest/googletest

# The kernels are compiled for the GPU this machine has (nvidia-smi); on a machine without one, for
# every architecture the trainer supports (Ampere and later: A100, RTX 30xx/A-series, L4/L40/RTX 40xx,
# H100/H200), plus PTX of the newest, which the driver compiles for GPUs after it. CUDA_ARCH=80, or a
# list CUDA_ARCH="80 90", narrows it (a shorter build).
SUPPORTED_ARCHS := 80 86 89 90
CUDA_ARCH ?= $(shell nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d .)
comma     := ,
SASS_ARCHS := $(or $(strip $(subst $(comma), ,$(CUDA_ARCH))),$(SUPPORTED_ARCHS))
PTX_ARCH   := $(shell echo $(SASS_ARCHS) | tr ' ' '\n' | sort -n | tail -1)
GENCODE    := $(foreach a,$(SASS_ARCHS),-gencode arch=compute_$(a),code=sm_$(a)) \
              -gencode arch=compute_$(PTX_ARCH),code=compute_$(PTX_ARCH)

# The libraries often share a directory (all in /usr/local/cuda): each is named once, in this order.
uniq      = $(if $(1),$(firstword $(1)) $(call uniq,$(filter-out $(firstword $(1)),$(1))))
INC_DIRS := $(call uniq,$(CUDA_HOME)/include $(CUDNN_INC) $(CUPTI_INC) $(NCCL_INC))
LIB_DIRS := $(call uniq,$(CUDA_HOME)/lib64 $(CUDNN_LIB) $(CUPTI_LIB) $(NCCL_LIB))
# include/: the public headers; src/: the few private to a concern (model/cudnn/, the model's layers);
# the root: each kernel family's header beside its .cu ("kernels/<family>.h").
INCLUDES := -Iinclude -Isrc -I. $(addprefix -I,$(INC_DIRS)) -isystem $(STB_INCLUDE)
CXXFLAGS := -std=c++20 -O2 -g -Wall -Wextra -Wno-unused-parameter $(INCLUDES)
NVFLAGS  := -std=c++20 -O3 -g -lineinfo $(GENCODE) --expt-relaxed-constexpr -Xcompiler -Wall $(INCLUDES)
LDFLAGS  := $(addprefix -L,$(LIB_DIRS)) $(addprefix -Wl$(comma)-rpath$(comma),$(LIB_DIRS))
# nvrtc: cudnn-frontend compiles some engines at run time; jpeg: libjpeg-turbo decodes --data folder JPEGs.
LDLIBS   := -lcudnn -lcublasLt -lcublas -lcupti $(NCCL_LINK) -lnvrtc -lcudart -ljpeg -lz -lpthread -ldl

# ---- sources ------------------------------------------------------------------------------------
# src/<concern>/*.cpp and kernels/*.cu are compiled once and shared by every program and variant.
# Each src/programs/<name>.cpp holds one program's main; it alone reads the switchboard
# (include/settings.h), so it is the only unit compiled once per variant.
LIB_SRC     := $(filter-out src/programs/%,$(wildcard src/*/*.cpp src/*/*/*.cpp))
KERNEL_SRC  := $(wildcard kernels/*.cu)
COMMON_OBJ  := $(LIB_SRC:src/%.cpp=build/obj/%.o) $(KERNEL_SRC:kernels/%.cu=build/obj/kernels/%.o)
TEST_SRC    := $(filter-out tests/fuzz/%,$(wildcard tests/*/*.cpp))
TEST_OBJ    := $(TEST_SRC:tests/%.cpp=build/tests/%.o)

# The ladder, cumulative in the seed posts' order: DEVICE_LOSS PINNED AUTOTUNE FP16 NHWC, then the
# rungs past it: CONV_GRAPH (cuDNN's graph API with execution plans built once), FUSED_BN (batch norm
# fused into the convolutions), CUDA_GRAPH (the step replayed as one CUDA graph) and WGRAD_STREAM
# (weight gradients on a second stream, beside the data gradients). bin/train has them all.
LADDER            := baseline devloss pinned autotune fp16 nhwc graph fusedbn cudagraph wgradstream
OPTS_baseline     := 0 0 0 0 0 0 0 0 0
OPTS_devloss      := 1 0 0 0 0 0 0 0 0
OPTS_pinned       := 1 1 0 0 0 0 0 0 0
OPTS_autotune     := 1 1 1 0 0 0 0 0 0
OPTS_fp16         := 1 1 1 1 0 0 0 0 0
OPTS_nhwc         := 1 1 1 1 1 0 0 0 0
OPTS_graph        := 1 1 1 1 1 1 0 0 0
OPTS_fusedbn      := 1 1 1 1 1 1 1 0 0
OPTS_cudagraph    := 1 1 1 1 1 1 1 1 0
OPTS_wgradstream  := 1 1 1 1 1 1 1 1 1
OPTS_train        := 1 1 1 1 1 1 1 1 1
# Not a rung: the graph rung in fp32, for make sanitize-gpu. Run with --no-tf32, its convs and GEMMs
# use the library's FMA kernels, which compute-sanitizer's racecheck can run (tests/sanitize_gpu.sh).
OPTS_fp32-nhwc    := 1 1 1 0 1 1 0 0 0
# Not a rung: bin/train with one gradient all-reduce after the whole backward (several GPUs; the
# seed's single bucket), to measure what overlapping the buckets with backward buys.
OPTS_ddp-naive    := 1 1 1 1 1 1 1 1 1 0
opt_defines = $(shell set -- $(1); echo -DOPT_DEVICE_LOSS=$$1 -DOPT_PINNED=$$2 -DOPT_AUTOTUNE=$$3 -DOPT_FP16=$$4 \
                -DOPT_NHWC=$$5 -DOPT_CONV_GRAPH=$${6:-1} -DOPT_FUSED_BN=$${7:-1} -DOPT_CUDA_GRAPH=$${8:-1} \
                -DOPT_WGRAD_STREAM=$${9:-1} -DOPT_DDP_OVERLAP=$${10:-1})
variant_name = $(if $(filter train,$(1)),train,train-$(1))

.PHONY: FORCE all variants predict-variants bench-predict custom run test test-build unit-tests kernel-lab bench bench-scaling \
        bench-folder bench-tta profile fuzz fuzz-build sanitize sanitize-gpu data data-folder deps clean
all: bin/train

# ---- set-up: what a fresh Debian/Ubuntu machine with CUDA and cuDNN may lack -----------------------
# Where bin/train looks for Fashion-MNIST, in its order (find_fashion_mnist_dir): the package is
# wanted only when none of them holds the files.
FASHION_MNIST_PACKAGE_DIR ?= /usr/share/datasets/fashion-mnist
FASHION_MNIST_DIRS = $(FASHION_MNIST_DIR) data/fashion-mnist $(FASHION_MNIST_PACKAGE_DIR)
# Installs with apt-get what is missing (as root, or through passwordless sudo), saying what and why;
# where it cannot, it names the package and stops. The stamp keeps later builds from asking again.
APT_PACKAGES = $(if $(wildcard $(STB_INCLUDE)/stb_image.h),,libstb-dev) \
               $(if $(wildcard $(GTEST_SRC)/src/gtest-all.cc),,googletest) \
               $(if $(wildcard $(foreach d,$(FASHION_MNIST_DIRS),$(d)/train-images-idx3-ubyte $(d)/train-images-idx3-ubyte.gz)),,dataset-fashion-mnist) \
               $(if $(wildcard /usr/include/zlib.h),,zlib1g-dev) $(if $(wildcard /usr/include/jpeglib.h),,libjpeg-dev)
# Wanted but not required: without clang the fuzz targets are skipped (and say so).
APT_OPTIONAL = $(if $(shell command -v clang++ 2>/dev/null),,clang)
build/.deps-ok:
	@pkgs="$(strip $(APT_PACKAGES))"; opt="$(strip $(APT_OPTIONAL))"; \
	if [ "$$(id -u)" = 0 ]; then sudo=""; elif sudo -n true 2>/dev/null; then sudo="sudo -n"; else sudo=none; fi; \
	if [ -n "$$pkgs" ]; then \
	  echo "set-up: installing $$pkgs with apt-get (stb headers for PNG output, GoogleTest sources, Fashion-MNIST data, zlib headers, libjpeg-turbo for JPEG decoding)"; \
	  if [ "$$sudo" = none ]; then echo "error: missing $$pkgs and no root rights: run 'sudo apt-get install $$pkgs', then make again"; exit 1; fi; \
	  $$sudo apt-get install -y -q $$pkgs >/dev/null 2>&1 || { $$sudo apt-get update -q >/dev/null 2>&1; \
	    $$sudo apt-get install -y -q $$pkgs >/dev/null; } || \
	    { echo "error: apt-get could not install $$pkgs; install them by hand, then make again"; exit 1; }; \
	fi; \
	if [ -n "$$opt" ]; then \
	  echo "set-up: installing $$opt with apt-get (clang builds the fuzz targets)"; \
	  { [ "$$sudo" != none ] && $$sudo apt-get install -y -q $$opt >/dev/null 2>&1; } || \
	    echo "note: could not install $$opt; the fuzz targets will be skipped"; \
	fi
	@test -x $(NVCC) || { echo "error: nvcc not found under CUDA_HOME=$(CUDA_HOME): install the CUDA toolkit or set CUDA_HOME"; exit 1; }
	@test -n "$(CUDNN_INC)" || { echo "error: cudnn.h not found (looked in $(CUDA_HOME)/include and /usr/include): install cuDNN 9 or set CUDNN_INC and CUDNN_LIB"; exit 1; }
	@test -n "$(NCCL_INC)" -a -n "$(NCCL_LIB)" || { echo "error: NCCL not found (nccl.h and libnccl.so in $(CUDA_HOME)/include and lib64, /usr/include and /usr/lib/x86_64-linux-gnu): install NCCL (libnccl-dev) or set NCCL_INC and NCCL_LIB"; exit 1; }
	@mkdir -p build && touch $@

# cudnn-frontend, NVIDIA's header-only C++ graph API over cuDNN: every cuDNN graph is built through it
# (src/model/cudnn/). Pinned; its headers come from PyPI's wheel (the same in every wheel of a
# version), unpacked into build/deps/. CUDNN_FRONTEND_INC=<dir> uses headers found elsewhere (a
# machine without PyPI: carry build/deps/ there, as the GPU machine's runs do).
CUDNN_FRONTEND_VERSION := 1.32.0
CUDNN_FRONTEND_INC ?= build/deps/cudnn-frontend-$(CUDNN_FRONTEND_VERSION)/include
CUDNN_FRONTEND_STAMP := $(CUDNN_FRONTEND_INC)/cudnn_frontend.h
build/deps/cudnn-frontend-$(CUDNN_FRONTEND_VERSION)/include/cudnn_frontend.h:
	@echo "set-up: fetching cudnn-frontend $(CUDNN_FRONTEND_VERSION) (PyPI nvidia-cudnn-frontend) into build/deps/"
	@rm -rf build/deps/wheel && mkdir -p build/deps/wheel
	@python3 -m pip download -q --no-deps --only-binary=:all: -d build/deps/wheel \
	   nvidia-cudnn-frontend==$(CUDNN_FRONTEND_VERSION) >build/deps/wheel/pip.log 2>&1 || \
	 { tail -3 build/deps/wheel/pip.log; echo "error: could not fetch nvidia-cudnn-frontend==$(CUDNN_FRONTEND_VERSION) from PyPI; fetch it where PyPI is reachable and set CUDNN_FRONTEND_INC to its include/ directory"; exit 1; }
	@python3 -c 'import sys, zipfile, glob; z = zipfile.ZipFile(glob.glob("build/deps/wheel/*.whl")[0]); \
	  [z.extract(n, sys.argv[1]) for n in z.namelist() if n.startswith("include/")]' \
	  build/deps/cudnn-frontend-$(CUDNN_FRONTEND_VERSION)
	@rm -rf build/deps/wheel
	@test -f $@ || { echo "error: the nvidia-cudnn-frontend wheel held no include/cudnn_frontend.h"; exit 1; }
# Only the files of src/model/cudnn/ include it (slow to compile). The JSON library it carries is
# not needed (no plan is serialized).
FRONTEND_FLAGS := -isystem $(CUDNN_FRONTEND_INC) -DCUDNN_FRONTEND_SKIP_JSON_LIB
build/obj/model/cudnn/%.o build/sanitize/obj/model/cudnn/%.o: CXXFLAGS += $(FRONTEND_FLAGS)
FRONTEND_OBJ := $(patsubst src/%.cpp,build/obj/%.o,$(wildcard src/model/cudnn/*.cpp))
$(FRONTEND_OBJ) $(FRONTEND_OBJ:build/%=build/sanitize/%): | $(CUDNN_FRONTEND_STAMP)
# CUTLASS (PyPI nvidia-cutlass, pinned; its C++ headers only), for our sm_90 convs (kernels/conv1x1_*,
# conv3x3) and the kernel lab's (bench/kernel_lab/cutlass_*.cu), fetched as cudnn-frontend is. CUTLASS_INC=<dir> uses
# headers found elsewhere (the GPU machine: carry build/deps/ or a copy of them).
CUTLASS_VERSION := 4.2.0.0
CUTLASS_INC ?= build/deps/cutlass-$(CUTLASS_VERSION)/include
CUTLASS_STAMP := $(CUTLASS_INC)/cutlass/cutlass.h
build/deps/cutlass-$(CUTLASS_VERSION)/include/cutlass/cutlass.h:
	@echo "set-up: fetching CUTLASS $(CUTLASS_VERSION) (PyPI nvidia-cutlass) into build/deps/"
	@rm -rf build/deps/cutlass-wheel && mkdir -p build/deps/cutlass-wheel
	@python3 -m pip download -q --no-deps --only-binary=:all: -d build/deps/cutlass-wheel \
	   nvidia-cutlass==$(CUTLASS_VERSION) >build/deps/cutlass-wheel/pip.log 2>&1 || \
	 { tail -3 build/deps/cutlass-wheel/pip.log; \
	   echo "error: could not fetch nvidia-cutlass==$(CUTLASS_VERSION) from PyPI; fetch it where PyPI is reachable" \
	        "and set CUTLASS_INC to its cutlass_library/source/include/ directory"; exit 1; }
	@python3 -c 'import sys, zipfile, glob; z = zipfile.ZipFile(glob.glob("build/deps/cutlass-wheel/*.whl")[0]); \
	  [z.extract(n, "build/deps/cutlass-wheel/x") for n in z.namelist() if n.startswith(sys.argv[1])]' \
	  cutlass_library/source/include/
	@mkdir -p build/deps/cutlass-$(CUTLASS_VERSION) && \
	 mv build/deps/cutlass-wheel/x/cutlass_library/source/include build/deps/cutlass-$(CUTLASS_VERSION)/
	@rm -rf build/deps/cutlass-wheel
	@test -f $@ || { echo "error: the nvidia-cutlass wheel held no cutlass/cutlass.h"; exit 1; }
deps: build/.deps-ok $(CUDNN_FRONTEND_STAMP) $(CUTLASS_STAMP)

# ---- compile ------------------------------------------------------------------------------------
build/obj/%.o: src/%.cpp | build/.deps-ok
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) -MMD -MP -c $< -o $@

build/obj/kernels/%.o: kernels/%.cu build/cuda-arch | build/.deps-ok
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -MMD -MP -c $< -o $@

# Our 1x1 and 3x3 convs with BN sums (kernels/conv1x1_stats.h, conv1x1_dgrad*.h, conv3x3*.h) use
# CUTLASS's TMA, wgmma: compiled for the architecture-specific sm_90a alone where the build covers
# sm_90, else without the kernel (every shape refused: the network runs cuDNN's patterns). The kernel
# lab's CUTLASS builds are compiled the same way (SM90A_NVFLAGS).
SM90A_NVFLAGS = -std=c++20 -O3 -lineinfo -DNDEBUG --expt-relaxed-constexpr -gencode arch=compute_90a,code=sm_90a \
                $(INCLUDES) -isystem $(CUTLASS_INC)
RESIDENT_CONV_OBJ := build/obj/kernels/conv1x1_stats.o build/obj/kernels/conv1x1_dgrad.o build/obj/kernels/conv3x3.o \
                     build/obj/kernels/conv3x3_stride2.o
ifneq ($(filter 90,$(SASS_ARCHS)),)
$(RESIDENT_CONV_OBJ): NVFLAGS = $(SM90A_NVFLAGS) -DCONV1X1_WITH_CUTLASS
$(RESIDENT_CONV_OBJ): $(CUTLASS_STAMP)
endif

# The architectures built, rewritten only when they change: the kernels depend on it, and so does
# src/core/device.cpp, which receives the list and refuses at start a GPU the build holds no code for.
build/cuda-arch: FORCE
	@mkdir -p build
	@echo '$(GENCODE)' | cmp -s - $@ || echo '$(GENCODE)' > $@
ARCH_DEFINES := -DTRAINER_SASS_ARCHS='"$(SASS_ARCHS)"' -DTRAINER_PTX_ARCHS='"$(PTX_ARCH)"'
build/obj/core/device.o build/sanitize/obj/core/device.o: build/cuda-arch
build/obj/core/device.o build/sanitize/obj/core/device.o: CXXFLAGS += $(ARCH_DEFINES)

# Per-variant objects: build/<variant>/programs/train.o with that variant's defines.
# build/<variant>/defines holds the defines, rewritten only when they change, so that a changed
# `make custom` combination rebuilds its objects.
define VARIANT_RULES
build/$(1)/defines: FORCE
	@mkdir -p $$(dir $$@)
	@echo '$(call opt_defines,$(OPTS_$(1)))' | cmp -s - $$@ || echo '$(call opt_defines,$(OPTS_$(1)))' > $$@
build/$(1)/%.o: src/%.cpp build/$(1)/defines | build/.deps-ok
	@mkdir -p $$(dir $$@)
	$$(CXX) $$(CXXFLAGS) $(call opt_defines,$(OPTS_$(1))) -DVARIANT_NAME='"$(call variant_name,$(1))"' -MMD -MP -c $$< -o $$@
bin/$(call variant_name,$(1)): build/$(1)/programs/train.o $(COMMON_OBJ)
	@mkdir -p bin
	$$(CXX) $$^ -o $$@ $$(LDFLAGS) $$(LDLIBS)
endef
# The variants with defines of their own (make custom's NAME must be none of them).
FIXED_VARIANTS := $(LADDER) train fp32-nhwc ddp-naive
$(foreach v,$(FIXED_VARIANTS),$(eval $(call VARIANT_RULES,$(v))))

variants: $(foreach v,$(LADDER),bin/train-$(v))

# bin/predict's egress ladder (seed 001's GPU-to-CPU case study), cumulative: output WORKERS, a
# buffer POOL, ASYNC copies with events, an egress STREAM. Every rung runs the network as bin/train
# does (the training ladder's defines all on); only src/programs/predict.cpp is compiled per rung,
# into build/predict[-<rung>]/.
EGRESS_LADDER   := baseline workers pool async stream
EGRESS_baseline := 0 0 0 0
EGRESS_workers  := 1 0 0 0
EGRESS_pool     := 1 1 0 0
EGRESS_async    := 1 1 1 0
EGRESS_stream   := 1 1 1 1
EGRESS_predict  := 1 1 1 1
egress_defines = $(shell set -- $(1); echo -DOPT_EGRESS_WORKERS=$$1 -DOPT_EGRESS_POOL=$$2 -DOPT_EGRESS_ASYNC=$$3 \
                   -DOPT_EGRESS_STREAM=$$4)
predict_name = $(if $(filter predict,$(1)),predict,predict-$(1))
define PREDICT_RULES
build/$(call predict_name,$(1))/defines: FORCE
	@mkdir -p $$(dir $$@)
	@echo '$(call egress_defines,$(EGRESS_$(1)))' | cmp -s - $$@ || echo '$(call egress_defines,$(EGRESS_$(1)))' > $$@
build/$(call predict_name,$(1))/programs/predict.o: src/programs/predict.cpp build/$(call predict_name,$(1))/defines | build/.deps-ok
	@mkdir -p $$(dir $$@)
	$$(CXX) $$(CXXFLAGS) $(call opt_defines,$(OPTS_train)) $(call egress_defines,$(EGRESS_$(1))) \
	  -DVARIANT_NAME='"$(call predict_name,$(1))"' -MMD -MP -c $$< -o $$@
bin/$(call predict_name,$(1)): build/$(call predict_name,$(1))/programs/predict.o $(COMMON_OBJ)
	@mkdir -p bin
	$$(CXX) $$^ -o $$@ $$(LDFLAGS) $$(LDLIBS)
endef
$(foreach r,$(EGRESS_LADDER) predict,$(eval $(call PREDICT_RULES,$(r))))

predict-variants: $(foreach r,$(EGRESS_LADDER),bin/predict-$(r)) bin/predict

# Any other combination: make custom NAME=fp16-only FP16=1 NHWC=0 ... (the defines of the header's list)
NAME ?= custom
OPTS_$(NAME) ?= $(or $(DEVICE_LOSS),1) $(or $(PINNED),1) $(or $(AUTOTUNE),1) $(or $(FP16),1) $(or $(NHWC),1) \
                $(or $(CONV_GRAPH),1) $(or $(FUSED_BN),1) $(or $(CUDA_GRAPH),1) $(or $(WGRAD_STREAM),1)
# NAME names bin/train-NAME and build/NAME/: one word of letters, digits, '-', '_', '.', not starting with
# '-' or '.' (NAME=../x wrote objects outside the tree), and no fixed variant's (built with its own defines,
# dropping the ones given). Checked for make custom alone: NAME may come from the environment.
NAME_CHARS := a b c d e f g h i j k l m n o p q r s t u v w x y z A B C D E F G H I J K L M N O P Q R S T U V W X Y Z 0 1 2 3 4 5 6 7 8 9 - _ .
without = $(if $(2),$(call without,$(subst $(firstword $(2)),,$(1)),$(wordlist 2,$(words $(2)),$(2))),$(1))
name_ok := $(if $(or $(call without,$(NAME),$(NAME_CHARS)),$(word 2,$(NAME)),$(filter -% .%,$(NAME))),,$(NAME))
$(if $(filter custom,$(MAKECMDGOALS)),$(if $(name_ok),$(if $(filter $(NAME),$(FIXED_VARIANTS)),$(error make custom: NAME=$(NAME) is taken by bin/$(call variant_name,$(NAME)), which keeps its own defines; choose another NAME, e.g. NAME=my-$(NAME))),$(error make custom: NAME='$(NAME)' is not a name: one word of letters, digits, '-', '_' and '.', starting with a letter or digit (it names bin/train-NAME and build/NAME/))))
$(if $(filter $(NAME),$(FIXED_VARIANTS)),,$(if $(name_ok),$(eval $(call VARIANT_RULES,$(NAME)))))
custom: bin/train-$(NAME)

# ---- tests --------------------------------------------------------------------------------------
build/gtest/libgtest.a: | build/.deps-ok
	@mkdir -p build/gtest
	$(CXX) -std=c++17 -O1 -I$(GTEST_SRC)/include -I$(GTEST_SRC) -c $(GTEST_SRC)/src/gtest-all.cc -o build/gtest/gtest-all.o
	ar rcs $@ build/gtest/gtest-all.o

build/tests/%.o: tests/%.cpp | build/.deps-ok
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) -Itests -I$(GTEST_SRC)/include -MMD -MP -c $< -o $@

bin/unit_tests: $(TEST_OBJ) $(COMMON_OBJ) build/gtest/libgtest.a
	@mkdir -p bin
	$(CXX) $^ -o $@ $(LDFLAGS) $(LDLIBS)

unit-tests: bin/unit_tests

# What make test runs, built; bench/gpu_checks.sh builds it before running the suites apart.
test-build: bin/unit_tests bin/train bin/predict bin/kernel_lab bin/decode_rate fuzz-build

test: test-build
	@python3 tests/run_tests.py

# ---- the kernel lab (docs/kernel-lab.md): its main in src/programs/, its versions in
# bench/kernel_lab/*.cu, which use the CPU references and data helpers of tests/support. make test
# builds it so it keeps compiling.
LAB_OBJ := $(patsubst bench/kernel_lab/%.cu,build/kernel_lab/%.o,$(wildcard bench/kernel_lab/*.cu)) \
           build/tests/support/reference.o
build/kernel_lab/%.o: bench/kernel_lab/%.cu build/cuda-arch | build/.deps-ok
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -Ibench -Itests -MMD -MP -c $< -o $@
# The CUTLASS kernels need the architecture-specific sm_90a (wgmma, TMA): built for it alone where
# the build covers sm_90, else built without CUTLASS (each of its versions is then refused).
LAB_CUTLASS_OBJ := $(patsubst bench/kernel_lab/%.cu,build/kernel_lab/%.o,$(wildcard bench/kernel_lab/cutlass_*.cu))
ifneq ($(filter 90,$(SASS_ARCHS)),)
$(LAB_CUTLASS_OBJ): NVFLAGS = $(SM90A_NVFLAGS) -DLAB_WITH_CUTLASS
$(LAB_CUTLASS_OBJ): $(CUTLASS_STAMP)
endif
build/obj/programs/kernel_lab.o: CXXFLAGS += -Ibench -Itests
bin/kernel_lab: build/obj/programs/kernel_lab.o $(LAB_OBJ) $(COMMON_OBJ)
	@mkdir -p bin
	$(CXX) $^ -o $@ $(LDFLAGS) $(LDLIBS)
kernel-lab: bin/kernel_lab
	@if [ "$(RUN)" = 1 ]; then ./bin/kernel_lab $(LAB_ARGS); fi

# ---- bin/decode_rate: how fast this machine decodes an image folder, on the CPU alone (make
# bench-folder's decode table: bin/train looks for its GPU before it decodes). It links the CPU code
# of --cache-decoded's reader and nothing else, no CUDA library. make test builds it so it keeps compiling.
DECODE_RATE_OBJ := $(addprefix build/obj/,programs/decode_rate.o train/decode_progress.o core/flags.o \
                   core/file_io.o core/format.o core/host_memory.o core/parallel.o data/data_choice.o \
                   data/data_flags.o data/cifar10.o data/fashion_mnist.o data/synthetic.o data/image_folder.o \
                   data/image_check.o data/image_decode.o data/image_jpeg.o data/image_resize.o)
bin/decode_rate: $(DECODE_RATE_OBJ)
	@mkdir -p bin
	$(CXX) $^ -o $@ -ljpeg -lz -lpthread

# make sanitize: bin/unit_tests again, built with g++'s AddressSanitizer (+ LeakSanitizer) and
# UndefinedBehaviorSanitizer into build/sanitize/, and run; any report fails it. The .cu files are
# built by nvcc with the sanitizers on their host code only. GPU tests skip without a device, so a
# machine without one runs the CPU tests. protect_shadow_gap=0: the CUDA runtime maps memory where
# ASan would otherwise reserve its shadow gap. Full output: build/sanitize/unit_tests.log.
# -Wno-maybe-uninitialized: GCC 12 warns falsely inside <regex> when ASan instruments it.
SAN_FLAGS := -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer \
             -Wno-maybe-uninitialized
SAN_OBJ   := $(COMMON_OBJ:build/%=build/sanitize/%) $(TEST_OBJ:build/%=build/sanitize/%)
SAN_ENV   := ASAN_OPTIONS=protect_shadow_gap=0:detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1

build/sanitize/obj/%.o: src/%.cpp | build/.deps-ok
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) $(SAN_FLAGS) -MMD -MP -c $< -o $@

build/sanitize/obj/kernels/%.o: kernels/%.cu build/cuda-arch | build/.deps-ok
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) $(foreach f,-fsanitize=address -fsanitize=undefined -fno-omit-frame-pointer,-Xcompiler $(f)) \
	  -MMD -MP -c $< -o $@

build/sanitize/tests/%.o: tests/%.cpp | build/.deps-ok
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) $(SAN_FLAGS) -Itests -I$(GTEST_SRC)/include -MMD -MP -c $< -o $@

bin/unit_tests-sanitize: $(SAN_OBJ) build/gtest/libgtest.a
	@mkdir -p bin
	$(CXX) $(SAN_FLAGS) $^ -o $@ $(LDFLAGS) $(LDLIBS)

sanitize: bin/unit_tests-sanitize
	@echo "== bin/unit_tests-sanitize (ASan, LSan, UBSan); full output in build/sanitize/unit_tests.log"
	@log=build/sanitize/unit_tests.log; $(SAN_ENV) ./bin/unit_tests-sanitize --gtest_brief=1 >$$log 2>&1; rc=$$?; \
	reports=$$(grep -cE 'ERROR: [A-Za-z]+Sanitizer|runtime error:' $$log); \
	if [ $$rc -ne 0 ] || [ $$reports -ne 0 ]; then \
	  awk '/: Skipped$$/ { skip = 2 } skip { skip--; next } 1' $$log; \
	  echo "sanitize: FAILED (exit status $$rc, $$reports sanitizer report lines)"; exit 1; \
	fi; \
	grep -E '^\[  (PASSED|SKIPPED) +\]' $$log; echo "sanitize: passed, no sanitizer reports"

# make sanitize-gpu: compute-sanitizer's memcheck, synccheck and racecheck, side by side, over short
# training runs and the GPU unit tests (tests/sanitize_gpu.sh says which runs, why racecheck runs the
# fp32 builds and checks only our kernels, and how bin/racecheck_probe proves that it selects them).
bin/racecheck_probe: tests/racecheck_probe.cu | build/.deps-ok
	@mkdir -p bin
	$(NVCC) $(NVFLAGS) $< -o $@

sanitize-gpu: bin/train bin/train-baseline bin/train-fp32-nhwc bin/unit_tests bin/racecheck_probe
	@bash tests/sanitize_gpu.sh

# ---- fuzzing (clang + libFuzzer, CPU only): one target per reader -------------------------------------
# make fuzz runs each target for FUZZ_RUNS executions; make test runs a short smoke of each.
FUZZ_CXX   ?= $(shell command -v clang++ 2>/dev/null)
FUZZ_RUNS  ?= 1000000
FUZZ_SRC   := src/core/file_io.cpp src/core/format.cpp src/data/cifar10.cpp src/data/fashion_mnist.cpp \
              src/train/checkpoint.cpp src/model/autotune_cache.cpp src/train/options.cpp src/core/flags.cpp \
              src/data/data_flags.cpp src/predict/options.cpp src/model/fused_patterns.cpp src/data/image_decode.cpp \
              src/data/image_check.cpp src/data/image_jpeg.cpp src/data/image_resize.cpp src/core/late_notice.cpp
FUZZ_TARGETS := $(patsubst tests/fuzz/%.cpp,build/fuzz/%,$(wildcard tests/fuzz/fuzz_*.cpp))
# The readers are compiled once (instrumented, without libFuzzer's main) and linked into every
# target: compiled again for each of the 8 targets they took about 3 of make test's 18 minutes on
# CI's 2 cores, and now half a minute.
FUZZ_SAN   := -fsanitize=address,undefined -fno-sanitize-recover=undefined
FUZZ_BASE  := -std=c++20 -g -O1 -Iinclude -isystem $(STB_INCLUDE)
FUZZ_OBJ   := $(FUZZ_SRC:src/%.cpp=build/fuzz/obj/%.o)
build/fuzz/obj/%.o: src/%.cpp | build/.deps-ok
	@mkdir -p $(dir $@)
	$(FUZZ_CXX) $(FUZZ_BASE) -fsanitize=fuzzer-no-link $(FUZZ_SAN) -MMD -MP -c $< -o $@
# A static pattern rule: make keeps the objects it names (a plain pattern rule's would be deleted
# as intermediate files after each build).
$(FUZZ_TARGETS): build/fuzz/%: tests/fuzz/%.cpp $(FUZZ_OBJ) $(wildcard include/*.h include/*/*.h)
	@mkdir -p build/fuzz
	$(FUZZ_CXX) $(FUZZ_BASE) -fsanitize=fuzzer $(FUZZ_SAN) $< $(FUZZ_OBJ) -o $@ -ljpeg -lz
build/fuzz/corpus: tests/fuzz/make_corpus.py $(wildcard tests/fixtures/images/*)
	python3 $< $@
	@touch $@
ifeq ($(FUZZ_CXX),)
# clang may have been installed by the set-up step after this Makefile was read: look again.
fuzz-build: | build/.deps-ok
	@if command -v clang++ >/dev/null; then $(MAKE) --no-print-directory fuzz-build FUZZ_CXX=$$(command -v clang++); \
	 else echo "fuzz: clang++ not found, fuzz targets not built (apt-get install clang)"; fi
else
fuzz-build: $(FUZZ_TARGETS) build/fuzz/corpus
endif
# A target that crashes, leaks or trips a sanitizer fails `make fuzz`; its input is kept in
# build/fuzz/artifacts/ and its log in build/fuzz/logs/<target>.log (not beside the targets: make test runs every build/fuzz/fuzz_* file).
fuzz: fuzz-build
	@mkdir -p build/fuzz/artifacts build/fuzz/logs; for t in $(FUZZ_TARGETS); do n=$$(basename $$t); mkdir -p build/fuzz/work/$$n; \
	  echo "== $$n: $(FUZZ_RUNS) runs"; \
	  if ! $$t -runs=$(FUZZ_RUNS) -max_len=65536 -rss_limit_mb=4096 -print_final_stats=1 \
	       -artifact_prefix=build/fuzz/artifacts/$$n- build/fuzz/work/$$n build/fuzz/corpus/$${n#fuzz_} \
	       > build/fuzz/logs/$$n.log 2>&1; then \
	    grep -E "ERROR|SUMMARY" build/fuzz/logs/$$n.log | head -5; \
	    echo "fuzz: $$n FAILED (log build/fuzz/logs/$$n.log, input in build/fuzz/artifacts/)"; exit 1; fi; \
	  grep -E "stat::number_of_executed_units|Done" build/fuzz/logs/$$n.log; done

# ---- running ------------------------------------------------------------------------------------
# GPUS=N: N ranks on this machine's GPUs (bin/train --gpus N).
run: bin/train
	@bash data/prepare.sh --strict
	./bin/train $(if $(GPUS),--gpus $(GPUS)) $(ARGS)

data: build/.deps-ok
	@bash data/prepare.sh --strict

# Fashion-MNIST (and CIFAR-10 once `make data` fetched it) as PNG image folders for --data folder.
data-folder: build/.deps-ok
	@python3 data/make_folder.py

bench: variants
	@python3 bench/bench.py $(BENCH_ARGS)

# make bench-predict: images/s of every egress rung (batch 256, with --features); bench/bench_predict.py
# makes the checkpoint it predicts with by a short bin/train run.
bench-predict: predict-variants bin/train
	@python3 bench/bench_predict.py $(BENCH_PREDICT_ARGS)

# make profile PROFILE_ARGS="--program predict" profiles the egress ladder instead; GPUS=N profiles
# bin/train on N GPUs, one nsys report per rank, and how much of the all-reduce backward hides.
profile: $(if $(GPUS),bin/train,$(if $(findstring predict,$(PROFILE_ARGS)),predict-variants bin/train,variants))
	@$(if $(GPUS),python3 bench/profile_ranks.py --gpus $(GPUS),python3 bench/profile.py) $(PROFILE_ARGS)

# images/s and scaling efficiency per GPU count at the same per-GPU batch (bench/scaling.py --help).
# Two machines simulated on this one (NCCL over its socket transport, one GPU a rank):
#   make bench-scaling SCALING_ARGS="--gpus 1,2 --transport network --socket-threads 4 --socks-per-thread 4"
bench-scaling: bin/train bin/train-ddp-naive
	@python3 bench/scaling.py $(SCALING_ARGS)

# Time to 94% test accuracy from process start: bin/train and PyTorch's fastest rung with the same
# recipe, on 1 and 2 GPUs (DDP under torchrun for PyTorch), 3 seeds each (bench/time_to_accuracy.py --help).
TTA_ARGS ?= --gpus 1,2 --seeds 0,1,2 --pytorch resident-amp-cl-graphs bin/train -- --data fashion-mnist --epochs 15
bench-tta: bin/train
	@python3 bench/time_to_accuracy.py $(TTA_ARGS)

# Training from an image folder (make data-folder writes one), decoding every epoch, for several
# --workers, and how fast one core decodes (bench/folder_bench.py: the decode table from
# bin/decode_rate, which needs no GPU; FOLDER_BENCH_ARGS=--decode-only for that table alone).
FOLDER_DIR ?= data/fashion-mnist-png
bench-folder: bin/train bin/train-baseline bin/decode_rate
	@python3 bench/folder_bench.py --data-dir $(FOLDER_DIR) $(FOLDER_BENCH_ARGS)

# make run and make test build on every core unless a -j was given (make -j1 for a serial build): one
# nvcc at a time, `make run GPUS=4` spent 237 s building bin/train on a 64-core machine. Not beside
# clean, which a parallel make would run while the build goes on.
ifneq ($(filter run test,$(MAKECMDGOALS)),)
ifeq ($(filter clean,$(MAKECMDGOALS))$(filter -j%,$(MAKEFLAGS)),)
MAKEFLAGS += -j$(shell nproc)
endif
endif

clean:
	rm -rf build bin

-include $(shell find build -name '*.d' 2>/dev/null)
