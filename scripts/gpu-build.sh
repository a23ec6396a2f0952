#!/usr/bin/env bash
# Builds, on a machine without CUDA, what gpu-check.sh runs on a GPU machine:
# release, stripped, without the wgpu feature, gathered into one folder
# (at most 60 MiB). Usage: scripts/gpu-build.sh [FOLDER] (default target/gpu).
# With an NVRTC library on LD_LIBRARY_PATH (PyPI's nvidia-cuda-nvrtc-cu12
# installs one), the kernels' PTX is compiled now and embedded; otherwise
# the GPU machine needs NVRTC at run time. An NVRTC newer than the GPU
# machine's driver makes PTX that driver refuses: the backend then falls
# back to run-time NVRTC, so prefer an NVRTC no newer than the driver.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT="${1:-target/gpu}"
LIMIT_MIB=60
# The binaries gpu-check.sh runs, by the names they get in $OUT.
BINARIES="cistern conformance cuda cuda_sticky_fault"

mkdir -p "$OUT" target
rm -rf "${OUT:?}"/*

# Test executables, found from cargo's JSON messages.
cargo test --release --no-run -p cistern --no-default-features --features cuda \
    --test conformance --test cuda_sticky_fault --message-format=json >target/gpu-build-root.json
cargo test --release --no-run -p cistern-runtime --features cuda \
    --test cuda --message-format=json >target/gpu-build-runtime.json
cargo build --release -p cistern-cli --no-default-features --features cuda --bin cistern

# The executable of test target $1 in cargo's JSON messages $2.
executable_of() {
    python3 -c '
import json, sys
name, path = sys.argv[1], sys.argv[2]
for line in open(path):
    try:
        message = json.loads(line)
    except ValueError:
        continue
    if message.get("reason") == "compiler-artifact" and message.get("executable") \
            and message["target"]["name"] == name:
        print(message["executable"])
' "$1" "$2" | tail -1
}

cp "$(executable_of conformance target/gpu-build-root.json)" "$OUT/conformance"
cp "$(executable_of cuda target/gpu-build-runtime.json)" "$OUT/cuda"
cp "$(executable_of cuda_sticky_fault target/gpu-build-root.json)" "$OUT/cuda_sticky_fault"
cp target/release/cistern "$OUT/cistern"
for binary in $BINARIES; do
    strip "$OUT/$binary"
done
cp scripts/gpu-check.sh "$OUT/"
# What gpu-check.sh builds or runs there besides: the CUDA reference
# (built with the machine's nvcc from the kernels' own sources) and
# PyTorch's side of the figures.
mkdir -p "$OUT/src"
cp kernels/src/cuda/* benches/cuda/*.cu benches/cuda_pytorch.py "$OUT/src/"

size_mib=$(( $(du -sb "$OUT" | cut -f1) / 1048576 ))
echo "gpu-build: $OUT holds $BINARIES (${size_mib} MiB)"
if [ "$size_mib" -gt "$LIMIT_MIB" ]; then
    echo "gpu-build: over the ${LIMIT_MIB} MiB limit" >&2
    exit 1
fi
