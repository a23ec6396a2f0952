#!/usr/bin/env bash
# Runs, on a machine with an NVIDIA GPU and no network, what gpu-build.sh
# gathered, and prints a short table, then the benchmarks' key figures.
# Usage: gpu-check.sh [FOLDER] (default: this script's folder). Each check,
# step and search has a time bound; together under 8 minutes.
set -uo pipefail
DIR="${1:-$(dirname "${BASH_SOURCE[0]}")}"
export DIR
RESULTS=()
FAILED=0

# record LABEL STARTED STATUS: one row of the table.
record() {
    local verdict=ok
    if [ "$3" -ne 0 ]; then
        verdict="FAILED ($3)"
        FAILED=1
    fi
    RESULTS+=("$(printf '%-16s %-12s %4ss' "$1" "$verdict" $((SECONDS - $2)))")
}

# check BINARY SECONDS LABEL ARGUMENTS...: runs one binary, logs to LABEL.log.
check() {
    local binary="$1" seconds="$2" label="$3" started=$SECONDS
    shift 3
    timeout "$seconds" "$DIR/$binary" "$@" >"$DIR/$label.log" 2>&1
    record "$label" "$started" $?
}

# step SECONDS LABEL COMMAND...: as check, for a command that is not one of
# the gathered binaries (nvcc, python3); a missing tool is a failure too. A
# function of this script runs in a shell of its own under the bound.
step() {
    local seconds="$1" label="$2" started=$SECONDS
    shift 2
    timeout "$seconds" bash -c "$(declare -f "$1" 2>/dev/null)
\"\$@\"" step "$@" >"$DIR/$label.log" 2>&1
    record "$label" "$started" $?
}

# The machine: GPU, driver, toolkit, PyTorch, NCCL (for the record).
environment() {
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
    nvidia-smi | sed -n 3p
    nvcc --version | tail -2
    python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
    grep -m1 'model name' /proc/cpuinfo
    find / -xdev -name 'libnccl.so*' 2>/dev/null | head -3
}

# reference.cu built with nvcc against the cuBLAS found (headers and library).
build_reference() {
    local header library
    header=$(find /usr/local/cuda/include /usr/local /opt /usr/lib -maxdepth 9 -name cublas_v2.h 2>/dev/null | head -1)
    library=$(find /usr/local/cuda/lib64 /usr/local/cuda/targets /usr/local /opt /usr/lib -maxdepth 9 \
        -name 'libcublas.so*' 2>/dev/null | grep -v Lt | head -1)
    echo "cublas: $header $library"
    nvcc -O3 -arch=sm_90 --fmad=false -std=c++17 -I "$DIR/src" -I "$(dirname "$header")" \
        "$DIR/src/reference.cu" -L "$(dirname "$library")" -l:"$(basename "$library")" \
        -L /usr/local/cuda/lib64/stubs -lcuda \
        -Xlinker -rpath="$(dirname "$library")" -o "$DIR/reference"
}

# cudarc loads libcublas.so or .so.12 (built for CUDA 12.4), not CUDA 13's
# .so.13, and likewise NVRTC: a link by the first name to the first library
# found, and its folder (for libcublasLt, NVRTC's builtins), go first on
# LD_LIBRARY_PATH. None found: the GEMM benchmark prints its reference as
# null with the reason, and run-time NVRTC is absent (the build's PTX runs).
link_library() {
    local name="$1" found
    found=$(timeout 10 find /usr/local/cuda/lib64 /usr/local/cuda/targets /usr/lib/x86_64-linux-gnu \
        /usr/local /opt -maxdepth 8 -name "$name.so*" 2>/dev/null | grep -v -e builtins -e '\.alt\.' | head -1)
    [ -n "$found" ] || return 0
    mkdir -p "$DIR/lib"
    ln -sf "$found" "$DIR/lib/$name.so"
    export LD_LIBRARY_PATH="$DIR/lib:$(dirname "$found")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    echo "$name: $found"
}

# value LINE FIELD: FIELD's value in the JSON line LINE (empty if absent).
value() {
    sed -n "s/.*\"$2\":\([^,}]*\).*/\1/p" <<<"$1"
}

# first LABEL BENCH: the first JSON line of LABEL.log whose bench is BENCH.
first() {
    grep -m1 "\"bench\":\"$2\"" "$DIR/$1.log" 2>/dev/null
}

link_library libcublas
link_library libnvrtc
step 15 environment environment
# What the driver sees: a CUDA device listed, or the reason it is not.
check cistern 15 devices devices
# Presence, the NVRTC compile, the build-time PTX.
check cuda 25 cuda-probe --test-threads=1
# The conformance suite on every device present, CUDA included, but for
# the checks that trap a kernel: on the drivers measured a sticky fault
# leaves CUDA unusable for the rest of the process (docs/benchmarks.md, "On
# CUDA"), so each of those that needs no recovery runs in a process of its
# own below, and the recovery checks (which need a new context in the same
# process) are not run on CUDA.
TRAPPING="a_capture_begins_only_on_an_active_device_and_never_nests
a_fault_while_capturing_discards_the_capture
a_graph_from_before_an_invalidate_is_refused_as_stale
a_trap_during_replay_poisons_the_device
a_seeded_trap_rate_traps_the_same_launches_every_run
a_trap_inside_a_batch_poisons_and_no_later_launch_of_it_runs
a_trap_surfaces_at_the_owners_token_and_sync
the_nth_executed_launch_traps_and_poisons
a_late_invalidate_after_recovery_changes_nothing
a_mismatching_probe_leaves_the_device_unrecoverable
a_poisoned_device_recovers_and_only_fresh_handles_work
a_sticky_probe_failure_leaves_the_device_unrecoverable
concurrent_invalidates_advance_the_generation_exactly_once
the_poisoned_state_holds_under_load_from_other_clients
the_published_device_state_follows_poison_and_recovery
three_operation_local_probe_failures_leave_the_device_unrecoverable
two_operation_local_probe_failures_then_a_pass_recover
a_trapped_step_latches_the_store_and_nothing_of_it_is_readable"
SKIPS=()
for name in $TRAPPING; do
    SKIPS+=(--skip "$name")
done
check conformance 90 conformance --test-threads=1 "${SKIPS[@]}"
# A real trap: poisoned at the owner's token, everything after refused; in
# a batch; the nth launch; a store's step latched. One process each.
check conformance 10 trap-surfaces --exact a_trap_surfaces_at_the_owners_token_and_sync
check conformance 10 trap-in-batch --exact a_trap_inside_a_batch_poisons_and_no_later_launch_of_it_runs
check conformance 10 trap-nth --exact the_nth_executed_launch_traps_and_poisons
check conformance 10 trap-store --exact a_trapped_step_latches_the_store_and_nothing_of_it_is_readable
# Recovery after a real trap: unrecoverable, saying to restart the process.
check cuda_sticky_fault 15 trap-recovery --ignored --exact a_sticky_fault_on_cuda_is_unrecoverable_in_the_process_and_says_to_restart_it
# The virtual range growing and shrinking on real device memory.
check conformance 25 virtual-range memory
# Load through the server on CUDA with store steps; its summary line is the
# figure. (No injected traps: the first would end CUDA in the process.)
check cistern 30 stress-cuda stress --device cuda:0 --seconds 15 --store-weight 10 --json

# The bare references, built here with nvcc: cuLaunchKernel, idle sync,
# device copy, cuBLAS beside the GEMM kernels alone; then PyTorch's side.
step 35 reference-build build_reference
step 30 reference "$DIR/reference"
step 35 pytorch python3 "$DIR/src/cuda_pytorch.py"

# The benchmarks on cuda:0, each against its same-run reference
# (docs/benchmarks.md): Adam at 256M parameters (4 GiB, and 1 GiB more
# for the copy) against a device-to-device copy of the parameters...
check cistern 35 bench-optim bench optim --device cuda:0 --optimizer adam --params 268435456
# ...GEMM against cuBLAS called directly (4096³ and the default shapes)...
check cistern 40 bench-gemm bench gemm --device cuda:0 --shape 4096x4096x4096 --shape 4096x4096x4096,ta --shape 4096x4096x4096,tb --shape 512x512x512 --shape 1024x1024x1024 --shape 2048x2048x2048 --shape 256x1024x784 --shape 256x1024x1024 --shape 784x1024x256,ta --shape 1024x1024x256,ta --shape 256x784x1024,tb --shape 256x1024x1024,tb
# ...round trips and submits against a bare channel.
check cistern 35 bench-roundtrip bench roundtrip --device cuda:0

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

echo
echo "the machine"
cat "$DIR/environment.log"
echo
echo "references (reference.cu, PyTorch)"
grep -h '"bench"' "$DIR/reference.log" "$DIR/pytorch.log" 2>/dev/null | grep -v bare_gemm
grep -h '"bare_gemm"' "$DIR/reference.log" 2>/dev/null | sed 's/"bench":"bare_gemm",//'
exit "$FAILED"
