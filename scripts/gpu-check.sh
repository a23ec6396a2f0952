#!/usr/bin/env bash
# Runs, on a machine with an NVIDIA GPU and no network, what gpu-build.sh
# gathered, and prints a short table, then the benchmarks' key figures.
# Usage: gpu-check.sh [FOLDER] (default: this script's folder). Each check
# and search has a time bound; together under 8 minutes.
set -uo pipefail
DIR="${1:-$(dirname "${BASH_SOURCE[0]}")}"
RESULTS=()
FAILED=0

# check BINARY SECONDS LABEL ARGUMENTS...: runs one binary, logs to LABEL.log.
check() {
    local binary="$1" seconds="$2" label="$3"
    shift 3
    local started=$SECONDS status verdict=ok
    timeout "$seconds" "$DIR/$binary" "$@" >"$DIR/$label.log" 2>&1
    status=$?
    if [ "$status" -ne 0 ]; then
        verdict="FAILED ($status)"
        FAILED=1
    fi
    RESULTS+=("$(printf '%-16s %-12s %4ss' "$label" "$verdict" $((SECONDS - started)))")
}

# cudarc loads libcublas.so or .so.12 (built for CUDA 12.4), not CUDA 13's
# .so.13: a link by the first name to the first cuBLAS found, and its
# folder (for libcublasLt), go first on LD_LIBRARY_PATH. No cuBLAS: the
# GEMM benchmark prints its reference as null, with the reason.
link_cublas() {
    local found
    found=$(timeout 10 find /usr/local/cuda/lib64 /usr/local/cuda/targets /usr/lib/x86_64-linux-gnu \
        /usr/local /opt -maxdepth 8 -name 'libcublas.so*' 2>/dev/null | head -1)
    [ -n "$found" ] || return 0
    mkdir -p "$DIR/lib"
    ln -sf "$found" "$DIR/lib/libcublas.so"
    export LD_LIBRARY_PATH="$DIR/lib:$(dirname "$found")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    echo "cuBLAS: $found"
}

# value LINE FIELD: FIELD's value in the JSON line LINE (empty if absent).
value() {
    sed -n "s/.*\"$2\":\([^,}]*\).*/\1/p" <<<"$1"
}

# first LABEL BENCH: the first JSON line of LABEL.log whose bench is BENCH.
first() {
    grep -m1 "\"bench\":\"$2\"" "$DIR/$1.log" 2>/dev/null
}

# What the driver sees: a CUDA device listed, or the reason it is not.
check cistern 20 devices devices
# Presence, the NVRTC compile, the build-time PTX.
check cuda 45 cuda-probe --test-threads=1
# The conformance suite on every device present, CUDA included.
check conformance 145 conformance --test-threads=1
# A real trap, poison, invalidate, probe, new generation, in its own process.
check conformance 30 trap-recovery a_poisoned_device_recovers_and_only_fresh_handles_work
# The virtual range growing and shrinking on real device memory.
check conformance 40 virtual-range memory
# Load through the server on CUDA; its summary line is the figure.
check cistern 40 stress-cuda stress --device cuda:0 --seconds 20

# The benchmarks on cuda:0, each against its same-run reference
# (docs/benchmarks.md): Adam at 256M parameters (4 GiB, and 1 GiB more
# for the copy) against a device-to-device copy of the parameters...
link_cublas
check cistern 50 bench-optim bench optim --device cuda:0 --optimizer adam --params 268435456
# ...GEMM against cuBLAS called directly...
check cistern 30 bench-gemm bench gemm --device cuda:0
# ...round trips and submits against a bare channel.
check cistern 60 bench-roundtrip bench roundtrip --device cuda:0

echo
printf '%-16s %-12s %5s\n' check result time
for row in "${RESULTS[@]}"; do
    echo "$row"
done
grep -h "cuda" "$DIR/devices.log" | head -3
tail -1 "$DIR/stress-cuda.log"

echo
echo "figures on cuda:0 (the JSON lines are in bench-*.log)"
if line=$(first bench-optim optim); then
    printf 'adam %s params: %s GB/s, copy %s GB/s, vs_copy %s (target >= 0.85), %s ms/step\n' \
        "$(value "$line" params)" "$(value "$line" gb_per_s)" "$(value "$line" copy_gb_per_s)" \
        "$(value "$line" vs_copy)" "$(value "$line" ms_per_step)"
fi
grep '"bench":"gemm"' "$DIR/bench-gemm.log" 2>/dev/null | while read -r line; do
    printf 'gemm %sx%sx%s ta=%s tb=%s: %s GFLOP/s, %s %s, vs_direct %s\n' \
        "$(value "$line" m)" "$(value "$line" n)" "$(value "$line" k)" \
        "$(value "$line" transpose_a)" "$(value "$line" transpose_b)" "$(value "$line" gflops)" \
        "$(value "$line" reference)" "$(value "$line" direct_gflops)" "$(value "$line" vs_direct)"
done
if line=$(first bench-gemm gemm) && [ "$(value "$line" direct_gflops)" = null ]; then
    echo "gemm reference absent: $(value "$line" reference_absent)"
fi
if line=$(first bench-roundtrip roundtrip); then
    printf 'round trip p50 %s ns, p99 %s ns, p50_vs_channel %s\n' \
        "$(value "$line" p50_ns)" "$(value "$line" p99_ns)" "$(value "$line" p50_vs_channel)"
fi
if line=$(first bench-roundtrip submit); then
    printf 'submit %s commands/s, vs_channel_one_way %s\n' \
        "$(value "$line" commands_per_s)" "$(value "$line" vs_channel_one_way)"
fi
if line=$(first bench-roundtrip submit_bound); then
    printf 'submit_bound %s commands/s\n' "$(value "$line" commands_per_s)"
fi
if line=$(first bench-roundtrip replay); then
    printf 'replay %s ns/launch, direct %s, vs_direct %s\n' \
        "$(value "$line" ns_per_launch)" "$(value "$line" direct_ns_per_launch)" "$(value "$line" vs_direct)"
fi
exit "$FAILED"
