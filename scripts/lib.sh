# Shared by the scripts in this folder: where the cache lives and how to make a Python venv.
# Sourced, not run.

# Everything downloaded or built for Tessera lives here, outside the repository.
TESSERA_CACHE_DIR="${TESSERA_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tessera}"
export TESSERA_CACHE_DIR

# make_venv DIR PACKAGE...: a virtualenv at DIR with the packages installed (once).
make_venv() {
    local dir="$1"; shift
    local stamp="$dir/.installed"
    local want="$*"
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
        return 0
    fi
    python3 -m venv "$dir" >&2
    "$dir/bin/pip" install --quiet --disable-pip-version-check "$@" >&2
    echo "$want" > "$stamp"
}

# cuda_toolkit: installs (once) the CUDA 13.0 compiler, headers and libraries from PyPI into
# the cache and exports what candle's and Tessera's build scripts look for. 13.0 and not
# newer: the PTX nvcc writes must not be newer than the GPU host's driver can load (driver
# 580 = CUDA 13.0), so every part is pinned, nvvm and crt included (pip would otherwise
# pick their newest releases).
cuda_toolkit() {
    local dir="$TESSERA_CACHE_DIR/cuda-13.0"
    local pins=("cuda-toolkit[nvcc,cudart,cccl,cublas,curand,nvrtc]==13.0.2"
        "nvidia-cuda-nvcc==13.0.88" "nvidia-nvvm==13.0.88" "nvidia-cuda-crt==13.0.88"
        "nvidia-cuda-nvrtc==13.0.88" "nvidia-nccl-cu13==2.28.3")
    if [ ! -f "$dir/.installed" ] || [ "$(cat "$dir/.installed")" != "${pins[*]}" ]; then
        echo "installing the CUDA 13.0 toolkit from PyPI into $dir (about 1.5 GB)..." >&2
        rm -rf "$dir"
        python3 -m pip install --quiet --disable-pip-version-check --target "$dir" "${pins[@]}" >&2
        echo "${pins[*]}" > "$dir/.installed"
    fi
    export CUDA_HOME="$dir/nvidia/cu13"
    export PATH="$CUDA_HOME/bin:$PATH"
    export CUDA_COMPUTE_CAP="${CUDA_COMPUTE_CAP:-90}"
    export NVCC_CCBIN="${NVCC_CCBIN:-g++}"
    export CUDAFORGE_THREADS="${CUDAFORGE_THREADS:-2}"
    CUDA_TOOLKIT_DIR="$dir"
}
