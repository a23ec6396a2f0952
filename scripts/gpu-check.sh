#!/usr/bin/env bash
# Runs, on a machine with an NVIDIA GPU and no network, what gpu-build.sh
# gathered, and prints a short table. Usage: gpu-check.sh [FOLDER] (default:
# this script's folder). Each check has a time bound; together under 8 minutes.
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

# What the driver sees: a CUDA device listed, or the reason it is not.
check cistern 30 devices devices
# Presence, the NVRTC compile, the build-time PTX.
check cuda 60 cuda-probe --test-threads=1
# The conformance suite on every device present, CUDA included.
check conformance 150 conformance --test-threads=1
# A real trap, poison, invalidate, probe, new generation, in its own process.
check conformance 60 trap-recovery a_poisoned_device_recovers_and_only_fresh_handles_work
# The virtual range growing and shrinking on real device memory.
check conformance 60 virtual-range memory
# Load through the server on CUDA; its summary line is the figure.
check cistern 90 stress-cuda stress --device cuda:0 --seconds 60

echo
printf '%-16s %-12s %5s\n' check result time
for row in "${RESULTS[@]}"; do
    echo "$row"
done
grep -h "cuda" "$DIR/devices.log" | head -3
tail -1 "$DIR/stress-cuda.log"
exit "$FAILED"
