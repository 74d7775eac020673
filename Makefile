# make                  -> builds train_gpt and test_gpt for the backend found (cuda if nvcc and a GPU, else cpu)
# make BACKEND=cpu|cuda|emu -> forces one;  PRECISION=FP32 -> fp32 CUDA build;  CUDA_ARCH=90 -> sm_90 (Hopper)
# make BUILD_DIR=build/cuda BACKEND=cuda  -> puts the binaries elsewhere (CI builds both backends)
# make NO_MPI=1         -> one process, no Open MPI and no NCCL needed (llmc/mpi_single.h): one GPU or the CPU
# make COMM_HOST_CHUNK=1000 -> MPI calls of at most 1000 elements (the matrix tests the pieces of large counts)
# make NCCL_HOME=DIR    -> the NCCL in DIR/include, DIR/lib (not the CUDA folder's), e.g. PyTorch's wheel's
# make USE_CUDNN=1      -> CUDA build with --attention cudnn (cuDNN's fused attention; llm.c's names): cuDNN from
#                          CUDA_HOME, the frontend's headers from CUDNN_FRONTEND_PATH (default: .venv's, make setup)
# make setup            -> scripts/setup.sh: installs what is missing (apt packages; PyPI ones into .venv)
# make train            -> setup, build, tinyshakespeare in GPT-2 tokens, a small model trained (samples printed),
#                          its loss curve (scripts/train_tinyshakespeare.sh; TS_TEXT=... for another text file)
# make test             -> setup, every build CI checks (CUDA compile + link when nvcc is there, cpu, cpu NO_MPI=1),
#                          then scripts/test_matrix.sh; .ci/run runs this, then test-emu
# make BACKEND=emu      -> the CUDA build as host code on an emulated device (llmc/emu/; no GPU, the toolkit's headers
#                          only); CHECKED=1 -> with AddressSanitizer and UBSan
# make test-emu         -> setup, then scripts/test_emu.sh: the emulated builds' rows against PyTorch

# setup, train and test install what is missing before they build: the checks below must not stop
# them first (their recipes run make again, which checks)
SETUP_GOALS := setup train test test-emu clean
ifneq ($(MAKECMDGOALS),)
  ifeq ($(filter-out $(SETUP_GOALS),$(MAKECMDGOALS)),)
    SKIP_CHECKS := 1
  endif
endif

HAVE_NVCC := $(shell command -v nvcc 2>/dev/null || test -x /usr/local/cuda/bin/nvcc && echo /usr/local/cuda/bin/nvcc)
HAVE_GPU := $(shell nvidia-smi -L 2>/dev/null | grep -q GPU && echo 1)
ifeq ($(BACKEND),)
  ifneq ($(and $(HAVE_NVCC),$(HAVE_GPU)),)
    BACKEND := cuda
  else
    BACKEND := cpu
  endif
endif

comma := ,
BUILD_DIR ?= .
PRECISION ?= BF16
CUDA_ARCH ?= 90
CUDA_HOME ?= /usr/local/cuda
NVCC ?= $(CUDA_HOME)/bin/nvcc

ifeq ($(NO_MPI),1)
  MPI_CFLAGS := -DNO_MPI
  MPI_LDFLAGS :=
  NCCL_LIB :=
else
  MPICXX := $(shell command -v mpicxx 2>/dev/null)
  ifeq ($(MPICXX)$(SKIP_CHECKS),)
    $(error Open MPI not found (mpicxx): make setup (or apt-get install libopenmpi-dev openmpi-bin), or build one process with NO_MPI=1)
  endif
  MPI_CFLAGS := $(if $(MPICXX),$(shell mpicxx --showme:compile)) -DOMPI_SKIP_MPICXX -DMPICH_SKIP_MPICXX
  MPI_LDFLAGS := $(if $(MPICXX),$(shell mpicxx --showme:link))
  # NCCL_HOME: an NCCL outside the CUDA folder (include/nccl.h, lib/libnccl.so.2), e.g. PyTorch's pip wheel's
  NCCL_LIB := $(if $(NCCL_HOME),-L$(NCCL_HOME)/lib -l:libnccl.so.2 -Wl$(comma)-rpath$(comma)$(NCCL_HOME)/lib,-lnccl)
endif

HEADERS := $(wildcard llmc/*.h llmc/emu/*.h)
TARGETS := $(BUILD_DIR)/train_gpt $(BUILD_DIR)/test_gpt

CHUNK_CFLAGS := $(if $(COMM_HOST_CHUNK),-DCOMM_HOST_CHUNK=$(COMM_HOST_CHUNK))
CONFIG := $(BACKEND) $(PRECISION) nompi=$(NO_MPI) sm_$(CUDA_ARCH) chunk=$(COMM_HOST_CHUNK) cudnn=$(USE_CUDNN) checked=$(CHECKED)
STAMP := $(BUILD_DIR)/.build-config

ifeq ($(BACKEND),cpu)
  CXX := g++
  # -fno-math-errno -fno-trapping-math: no errno to set, no floating-point traps to keep, so loops that take
  # a square root (AdamW) or choose between values (exp_poly's clamp) vectorize. The same IEEE results.
  CXXFLAGS := -O3 -march=native -fno-math-errno -fno-trapping-math -fopenmp -Wall -Wextra -Wno-unused-function -Wno-missing-field-initializers -x c++ $(MPI_CFLAGS) $(CHUNK_CFLAGS)
  # OpenBLAS built for OpenMP shares our thread pool; the pthread build's idle threads fight the
  # OpenMP threads for the cores (measured: ~2x slower on 2 cores). Use it when installed.
  OPENBLAS_OMP := /usr/lib/x86_64-linux-gnu/openblas-openmp
  ifneq ($(wildcard $(OPENBLAS_OMP)/libopenblas.so.0),)
    LDLIBS := -L$(OPENBLAS_OMP) -l:libopenblas.so.0 -Wl,-rpath,$(OPENBLAS_OMP) -lm $(MPI_LDFLAGS)
  else
    LDLIBS := -lopenblas -lm $(MPI_LDFLAGS)
  endif
  ifeq ($(wildcard /usr/include/x86_64-linux-gnu/cblas.h /usr/include/cblas.h /usr/include/openblas/cblas.h)$(SKIP_CHECKS),)
    $(error OpenBLAS not found (cblas.h): make setup (or apt-get install libopenblas-dev))
  endif
  CXXFLAGS += $(if $(wildcard /usr/include/openblas/cblas.h),-I/usr/include/openblas)
  COMPILE = $(CXX) $(CXXFLAGS) $< -o $@ $(LDLIBS)
else ifeq ($(BACKEND),cuda)
  ifeq ($(wildcard $(NVCC))$(SKIP_CHECKS),)
    $(error BACKEND=cuda but nvcc not found at $(NVCC); set CUDA_HOME)
  endif
  ifeq ($(NO_MPI)$(wildcard $(CUDA_HOME)/include/nccl.h)$(wildcard /usr/include/nccl.h)$(wildcard $(NCCL_HOME)/include/nccl.h)$(SKIP_CHECKS),)
    $(error NCCL not found (nccl.h in $(CUDA_HOME)/include, /usr/include or NCCL_HOME=DIR/include); or build one process with NO_MPI=1)
  endif
  # fast math (approximate expf and division, flush to zero) in the bf16 build only: the fp32 build is the
  # GPU's precise twin of the CPU loops
  # (nvcc takes the host compiler's -pthread and -Wl,X only as -Xcompiler / -Xlinker: an Open MPI 5 mpicxx prints both)
  nvcc_host = $(patsubst -pthread,-Xcompiler=-pthread,$(patsubst -Wl$(comma)%,-Xlinker=%,$(1)))
  NVCCFLAGS := -O3 $(if $(filter FP32,$(PRECISION)),,--use_fast_math) -std=c++17 -arch=sm_$(CUDA_ARCH) -Xcompiler -fopenmp,-Wall,-Wno-unused-function \
               -DUSE_CUDA $(call nvcc_host,$(MPI_CFLAGS)) $(CHUNK_CFLAGS) -I$(CUDA_HOME)/include $(if $(NCCL_HOME),-I$(NCCL_HOME)/include) $(if $(filter FP32,$(PRECISION)),-DENABLE_FP32)
  LDLIBS := -L$(CUDA_HOME)/lib64 -lcublasLt -lcublas $(call nvcc_host,$(NCCL_LIB) -lgomp $(MPI_LDFLAGS))
  ifeq ($(USE_CUDNN),1)
    CUDNN_FRONTEND_PATH ?= $(firstword $(patsubst %/cudnn_frontend.h,%,$(wildcard .venv/lib/python3*/site-packages/include/cudnn_frontend.h)))
    ifeq ($(wildcard $(CUDNN_FRONTEND_PATH)/cudnn_frontend.h)$(SKIP_CHECKS),)
      $(error USE_CUDNN=1: cudnn_frontend.h not found (CUDNN_FRONTEND_PATH='$(CUDNN_FRONTEND_PATH)'): make setup installs it into .venv)
    endif
    ifeq ($(wildcard $(CUDA_HOME)/include/cudnn.h /usr/include/cudnn.h /usr/include/x86_64-linux-gnu/cudnn.h)$(SKIP_CHECKS),)
      $(error USE_CUDNN=1: cudnn.h not found (cuDNN: in CUDA_HOME/include or /usr/include))
    endif
    # (-isystem: the frontend's own headers warn; nvrtc: its runtime-compiled engines)
    NVCCFLAGS += -DUSE_CUDNN -isystem $(CUDNN_FRONTEND_PATH)
    LDLIBS += -lcudnn -lnvrtc
  endif
  COMPILE = $(NVCC) $(NVCCFLAGS) $< -o $@ $(LDLIBS)
else ifeq ($(BACKEND),emu)
  # The CUDA code paths compiled by g++ as host code, run on an emulated device (llmc/emu/): no GPU, no CUDA
  # libraries, only the toolkit's headers. CHECKED=1: under AddressSanitizer and UBSan.
  ifeq ($(wildcard $(CUDA_HOME)/include/cuda_runtime.h)$(SKIP_CHECKS),)
    $(error BACKEND=emu needs the CUDA toolkit's headers ($(CUDA_HOME)/include/cuda_runtime.h); set CUDA_HOME)
  endif
  CXX := g++
  EMU_OPT := $(if $(filter 1,$(CHECKED)),-O2 -g -fsanitize=address$(comma)undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined,-O2 -g)
  CXXFLAGS := $(EMU_OPT) -std=c++17 -fopenmp -Wall -Wextra -Wno-unused-function -Wno-missing-field-initializers -Wno-unknown-pragmas -x c++ \
              -DUSE_CUDA -DMPI_THREAD_LEVEL=MPI_THREAD_MULTIPLE -I$(CUDA_HOME)/include $(if $(filter FP32,$(PRECISION)),-DENABLE_FP32) $(MPI_CFLAGS) $(CHUNK_CFLAGS)
  LDLIBS := -lpthread $(MPI_LDFLAGS)
  COMPILE = $(CXX) $(CXXFLAGS) $< -o $@ $(LDLIBS)
else
  $(error BACKEND must be cpu, cuda or emu, got '$(BACKEND)')
endif

# the build configuration, in a file that changes when it does: switching BACKEND, PRECISION, NO_MPI,
# CUDA_ARCH or the compiler's flags rebuilds the binaries instead of keeping ones built another way
BUILD_CONFIG := $(CONFIG) $(COMPILE)
$(shell mkdir -p $(BUILD_DIR) && (echo '$(BUILD_CONFIG)' | cmp -s - $(STAMP) || echo '$(BUILD_CONFIG)' > $(STAMP)))

all: $(TARGETS)

$(BUILD_DIR)/train_gpt: train_gpt.cu $(HEADERS) $(STAMP) | $(BUILD_DIR)
	$(COMPILE)

$(BUILD_DIR)/test_gpt: test_gpt.cu train_gpt.cu $(HEADERS) $(wildcard test/*.h) $(STAMP) | $(BUILD_DIR)
	$(COMPILE)

$(BUILD_DIR):
	mkdir -p $@

clean:
	rm -f train_gpt test_gpt .build-config
	rm -rf build

# ----------------------------------------------------------------------------
# the README's two commands: make train (from a fresh machine to a trained model), make test

JOBS ?= $(shell nproc 2>/dev/null || echo 2)
TS_TEXT ?= ../shared/data/tinyshakespeare.txt

setup:
	@bash scripts/setup.sh

# Without Open MPI (not installable here) it builds the single-process binary instead.
train:
	@bash scripts/setup.sh || echo "make train: going on with what is there (see above)"
	@if command -v mpicxx >/dev/null 2>&1 || [ "$(NO_MPI)" = 1 ]; then $(MAKE) --no-print-directory -j$(JOBS) all; \
	else echo "make train: no Open MPI, so a single-process build (NO_MPI=1)"; $(MAKE) --no-print-directory -j$(JOBS) all NO_MPI=1; fi
	@bash scripts/train_tinyshakespeare.sh $(BUILD_DIR) $(TS_TEXT)

# What CI checks: the CUDA builds compile and link (no GPU needed), the CPU builds run the matrix.
test:
	@bash scripts/setup.sh
	@echo "== $$(nproc) cores; $$(/usr/bin/python3 -c 'import torch, numpy; print("torch", torch.__version__, "numpy", numpy.__version__)' 2>&1 | tail -n 1)"
	@if [ -n "$(HAVE_NVCC)" ]; then \
	    echo "== CUDA build (compile and link only)"; \
	    $(MAKE) --no-print-directory BACKEND=cuda BUILD_DIR=build/cuda -j$(JOBS) && \
	    $(MAKE) --no-print-directory BACKEND=cuda BUILD_DIR=build/cuda-fp32 PRECISION=FP32 -j$(JOBS) && \
	    $(MAKE) --no-print-directory BACKEND=cuda BUILD_DIR=build/cuda-nompi NO_MPI=1 -j$(JOBS) && \
	    if [ -f $(CUDA_HOME)/include/cudnn.h ]; then $(MAKE) --no-print-directory BACKEND=cuda BUILD_DIR=build/cuda-cudnn USE_CUDNN=1 -j$(JOBS); \
	    else echo "== no cudnn.h in $(CUDA_HOME)/include: the USE_CUDNN=1 build skipped"; fi && \
	    if [ -f dev/cuda/Makefile ]; then PATH="$(CUDA_HOME)/bin:$$PATH" $(MAKE) --no-print-directory -C dev/cuda -j$(JOBS); fi; \
	else echo "== nvcc not found: CUDA build skipped"; fi
	@echo "== CPU build, and the single-process build without MPI that the matrix also runs"
	@$(MAKE) --no-print-directory BACKEND=cpu -j$(JOBS)
	@$(MAKE) --no-print-directory BACKEND=cpu BUILD_DIR=build/cpu-nompi NO_MPI=1 -j$(JOBS)
	@echo "== tests: bash scripts/test_matrix.sh"
	@bash scripts/test_matrix.sh

# The CUDA program on the emulated device (no GPU): its own target, beside make test.
test-emu:
	@bash scripts/setup.sh
	@bash scripts/test_emu.sh

.PHONY: all clean setup train test test-emu
