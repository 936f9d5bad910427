# Sourced by scripts/test-gpu and scripts/bench-gpu on the GPU machine: unpacks the
# binaries scripts/build-gpu left in target/gpu/carry into $work and puts the CUDA and
# NCCL libraries on LD_LIBRARY_PATH (the folders of Python's nvidia-* packages, which
# torch ships; pip's NCCL wheel has only libnccl.so.2, the name the binaries ask for).
# Needs $root and $work.
carry="$root/target/gpu/carry"
for b in tessera tessera-gpu-check; do
    if [ ! -f "$carry/$b.xz" ]; then
        echo "error: $carry/$b.xz is missing: run scripts/build-gpu and carry target/gpu/carry" >&2
        exit 2
    fi
    xz -dc "$carry/$b.xz" > "$work/$b" && chmod +x "$work/$b"
done
site="$(python3 -c 'import site; print(site.getsitepackages()[0])')"
export LD_LIBRARY_PATH="$site/nvidia/cu13/lib:$site/nvidia/nccl/lib:/usr/local/nvidia/lib64:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# NCCL 2.30 when target/gpu/nccl was carried (scripts/build-nccl), ahead of the machine's own: the
# first that puts several ranks on one GPU. The binaries log the version they load.
nccl_xz="$root/target/gpu/nccl/libnccl.so.2.xz"
if [ -f "$nccl_xz" ]; then
    mkdir -p "$work/nccl"
    xz -dc "$nccl_xz" > "$work/nccl/libnccl.so.2"
    ln -sf libnccl.so.2 "$work/nccl/libnccl.so"
    export LD_LIBRARY_PATH="$work/nccl:$LD_LIBRARY_PATH"
fi
if ldd "$work/tessera" | grep -q "not found"; then
    echo "error: libraries not found:" >&2
    ldd "$work/tessera" | grep "not found" >&2
    exit 2
fi
commit="$(cat "$carry/COMMIT" 2>/dev/null || echo unknown)"
