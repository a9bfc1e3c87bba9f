#!/usr/bin/env bash
# The GPU checks of issue 6 (and issue 3's transfer on GPU memory), for a machine lent by
# the device tool: its python3 already has torch, triton and transformers and no network.
# Tandem is installed beside them (no dependencies fetched); logs go to $OUT.
#
#   bash bench/gpu_session.sh tests      # make test-gpu's tests: kernels, parity, CUDA graphs
#   bash bench/gpu_session.sh kernels    # bench/kernels.py + bench/kernel_resources.py
#   bash bench/gpu_session.sh step       # bench/decode_step.py (Llama-3-8B shaped, bf16)
#   bash bench/gpu_session.sh transfer   # bench/transfer.py --device cuda --skip-ttft;
#                                        # carry .whl with the cp312 nixl, nixl-cu13, msgspec
#
# Each stage fits one call (10 minutes); one call may run several: `... tests kernels`.
set -uo pipefail
OUT=${OUT:-/tmp/tandem-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
unset TRITON_INTERPRET

if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 1
fi
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile \
    --target /tmp/site . || exit 1
export PYTHONPATH=/tmp/site

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/device.txt"
git rev-parse HEAD 2>/dev/null | tee -a "$OUT/device.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" \
    | tee -a "$OUT/device.txt"

status=0
run() {  # run LOG COMMAND...: output to the screen and $OUT/LOG; a failure fails the script
    local log=$1
    shift
    "$@" 2>&1 | tee -a "$OUT/$log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
}
for stage in "$@"; do
    case "$stage" in
        tests) run tests.log python3 -m pytest -q -m gpu tests/kernels tests/engine ;;
        kernels)
            run kernels.log python3 -P bench/kernels.py
            run resources.log python3 -P bench/kernel_resources.py --arch 90
            ;;
        step) run decode_step.log python3 -P bench/decode_step.py ;;
        transfer) run transfer.log python3 -P bench/transfer.py --device cuda --skip-ttft ;;
        *)
            echo "unknown stage $stage (tests, kernels, step, transfer)" >&2
            exit 2
            ;;
    esac
done
exit $status
