# Sourced by `scripts/test-docker cuda` once the Debian, Python and Rust stand-ins exist:
# builds docker/Dockerfile.cuda with podman and checks its image without a GPU.
#
# Stand-ins for NVIDIA's base images, from the CUDA 13.0 wheels on PyPI that
# scripts/build-gpu uses (scripts/lib.sh, cuda_toolkit), laid out as NVIDIA's images lay
# them out:
#   - CUDA_DEVEL_IMAGE:   Debian with gcc/g++ and the toolkit at /usr/local/cuda (nvcc,
#                         headers, lib64 with unversioned links, NCCL, and the driver stub
#                         lib64/stubs/libcuda.so that scripts/build-gpu makes);
#   - CUDA_RUNTIME_IMAGE: Debian with the runtime libraries (cudart, cuBLAS, cuRAND,
#                         NVRTC, NCCL) in /usr/local/cuda/lib64, known to ldconfig.
# The image's binary is checked as far as a machine without a GPU can: it links every
# library but the driver's libcuda.so.1 (which the NVIDIA container toolkit mounts), and
# with the stub in its place it prints its version. It is copied out, compressed, to
# target/docker-cuda/tessera.xz, which scripts/test-gpu serves on a GPU machine.
#
# The first build compiles the CUDA kernels and the server in release mode (about half
# an hour on 2 cores); the Dockerfile's cache mounts keep later builds incremental.

cuda_toolkit
cuda_links="$CUDA_TOOLKIT_DIR/link"
[ -f "$cuda_links/libcuda.so" ] || fail "no driver stub in $cuda_links: run scripts/build-gpu once first"
cuda_lib="$CUDA_TOOLKIT_DIR/nvidia/cu13/lib"
nccl_dir="$CUDA_TOOLKIT_DIR/nvidia/nccl"
cuda_hash="$(cat "$CUDA_TOOLKIT_DIR/.installed" "$cuda_links/libcuda.symbols" | recipe_hash)"

devel_file="FROM $debian_ref
COPY ca/ /usr/local/share/ca-certificates/
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates gcc g++ libc6-dev make && rm -rf /var/lib/apt/lists/*
COPY cu13/ /usr/local/cuda-13.0/
COPY nccl/include/ /usr/local/cuda-13.0/include/
COPY nccl/lib/ /usr/local/cuda-13.0/lib/
COPY stubs/ /usr/local/cuda-13.0/lib/stubs/
RUN ln -s cuda-13.0 /usr/local/cuda && ln -s lib /usr/local/cuda-13.0/lib64 \\
    && cd /usr/local/cuda-13.0/lib && for l in libcublas.so.13 libcublasLt.so.13 libcudart.so.13 libcurand.so.10 libnvrtc.so.13 libnccl.so.2; do ln -s \$l \${l%%.so.*}.so; done \\
    && echo /usr/local/cuda/lib64 > /etc/ld.so.conf.d/cuda.conf && ldconfig
ENV PATH=/usr/local/cuda/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin CUDA_HOME=/usr/local/cuda NVCC_CCBIN=g++"
devel_ref="localhost/tessera-base/cuda-devel:13.0-$(printf '%s %s %s' "$devel_file" "$ca_hash" "$cuda_hash" | recipe_hash)"
build_cuda_devel() {
    local ctx="$work/cuda-devel-ctx"
    mkdir -p "$ctx/nccl" "$ctx/stubs"
    cp -r "$ca_dir" "$ctx/ca"
    cp -a "$CUDA_TOOLKIT_DIR/nvidia/cu13" "$ctx/cu13"
    cp -a "$nccl_dir/include" "$nccl_dir/lib" "$ctx/nccl/"
    cp "$cuda_links/libcuda.so" "$ctx/stubs/libcuda.so"
    printf '%s\n' "$devel_file" > "$ctx/Containerfile"
    podman build --isolation chroot --pull=never -t "$1" "$ctx"
    rm -rf "$ctx"
}
ensure_base "$devel_ref" build_cuda_devel

runtime_libs=(libcublas.so.13 libcublasLt.so.13 libcudart.so.13 libcurand.so.10 libnvrtc.so.13
    libnvrtc-builtins.so.13.0)
runtime_file="FROM $debian_ref
COPY lib/ /usr/local/cuda-13.0/lib64/
RUN ln -s cuda-13.0 /usr/local/cuda && echo /usr/local/cuda/lib64 > /etc/ld.so.conf.d/cuda.conf && ldconfig
ENV PATH=/usr/local/nvidia/bin:/usr/local/cuda/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LD_LIBRARY_PATH=/usr/local/nvidia/lib:/usr/local/nvidia/lib64"
runtime_ref="localhost/tessera-base/cuda-runtime:13.0-$(printf '%s %s' "$runtime_file" "$cuda_hash" | recipe_hash)"
build_cuda_runtime() {
    local ctx="$work/cuda-runtime-ctx" l
    mkdir -p "$ctx/lib"
    for l in "${runtime_libs[@]}"; do cp "$cuda_lib/$l" "$ctx/lib/"; done
    cp "$nccl_dir/lib/libnccl.so.2" "$ctx/lib/"
    printf '%s\n' "$runtime_file" > "$ctx/Containerfile"
    podman build --isolation chroot --pull=never -t "$1" "$ctx"
    rm -rf "$ctx"
}
ensure_base "$runtime_ref" build_cuda_runtime

say "podman build -f docker/Dockerfile.cuda (base images: the stand-ins above)"
build_log="$work/build.log"
build_started=$SECONDS
previous="$(podman image inspect --format '{{.Id}}' "$image" 2>/dev/null || true)"
if ! podman build --isolation chroot --pull=never --format docker \
    --build-arg CUDA_DEVEL_IMAGE="$devel_ref" \
    --build-arg CUDA_RUNTIME_IMAGE="$runtime_ref" \
    --build-arg RUST_IMAGE="$rust_ref" \
    --build-arg PYTHON_IMAGE="$python_ref" \
    -f "$root/docker/Dockerfile.cuda" -t "$image" "$root" >"$build_log" 2>&1; then
    tail -n 60 "$build_log" >&2
    fail "podman build -f docker/Dockerfile.cuda"
fi
say "built $image in $((SECONDS - build_started))s"
now="$(podman image inspect --format '{{.Id}}' "$image")"
if [ -n "$previous" ] && [ "$previous" != "$now" ]; then
    podman rmi "$previous" >/dev/null 2>&1 || true
fi

user="$(podman image inspect --format '{{.Config.User}}' "$image")"
entry="$(podman image inspect --format '{{json .Config.Entrypoint}}' "$image")"
health="$(podman image inspect --format '{{json .Config.Healthcheck.Test}}' "$image")"
echo "entrypoint: $entry, user: $user, healthcheck: ${health:0:40}..."
[ "$entry" = '["/usr/local/bin/tessera"]' ] || fail "the image's entrypoint is $entry"
[ "$user" = "10001:10001" ] || fail "the image's user is '$user', not 10001:10001"
case "$health" in '["CMD",'*) ;; *) fail "the image has no HEALTHCHECK CMD (got $health)" ;; esac

rootfs="$(podman image mount "$image")"
mounted=1
bin="$rootfs/usr/local/bin/tessera"
[ -x "$bin" ] || fail "no executable /usr/local/bin/tessera in the image"
for leftover in /usr/local/cargo /usr/local/rustup /src /usr/local/cuda/bin/nvcc /usr/bin/gcc; do
    [ ! -e "$rootfs$leftover" ] || fail "the runtime image holds $leftover"
done

# In the image, as its user: which libraries the binary cannot find (only the driver's may
# be missing), then its version with the driver stub in the driver's place.
in_image() {
    unshare --mount --propagation private -- bash -c '
        set -e
        root="$1" stub="$2"; shift 2
        mount -t tmpfs tmpfs "$root/tmp"
        mkdir "$root/tmp/driver" && cp "$stub" "$root/tmp/driver/libcuda.so.1"
        exec chroot --userspec=10001:10001 "$root" "$@"
    ' in-image "$rootfs" "$cuda_links/libcuda.so" "$@"
}
# (The loader stops at the first library it cannot find, so the list is made with the
# stub in place: the stub must be the only library taken from outside the image.)
libs="$(in_image /usr/bin/env -i LD_LIBRARY_PATH=/tmp/driver /lib64/ld-linux-x86-64.so.2 \
    --list /usr/local/bin/tessera)" || fail "the binary's libraries cannot all be loaded: $libs"
echo "$libs" | sed 's/^/    /'
from_outside="$(echo "$libs" | awk '$3 ~ /^\/tmp\/driver\// {print $1}' | tr '\n' ' ')"
[ "$from_outside" = "libcuda.so.1 " ] || fail "libraries from outside the image: '$from_outside' (only libcuda.so.1 may be)"
! echo "$libs" | grep -q 'not found' || fail "libraries not found: $libs"
echo "ok: the binary finds every library in the image but the driver's libcuda.so.1"
version="$(in_image /usr/bin/env -i LD_LIBRARY_PATH=/tmp/driver /usr/local/bin/tessera --version)" \
    || fail "tessera --version failed in the image"
case "$version" in tessera*) echo "ok: $version" ;; *) fail "tessera --version printed: $version" ;; esac

# Compressed, as scripts/build-gpu leaves its binaries, for scripts/test-gpu to serve.
out="$root/target/docker-cuda"
mkdir -p "$out"
strip -o "$work/tessera" "$bin"
xz -T0 -6 -c "$work/tessera" > "$out/tessera.xz"
git -C "$root" rev-parse HEAD > "$out/COMMIT"
echo "ok: $out/tessera.xz ($(du -m "$out/tessera.xz" | cut -f1) MB) for scripts/test-gpu"
image_bytes="$(podman image inspect --format '{{.Size}}' "$image")"
say "docker/Dockerfile.cuda builds; its image ($((image_bytes / 1000000)) MB) holds a binary that links and runs"
