# Device, precision and per-device batch of the recipes' fairseq commands; sourced by every recipe.
#
# Reads from the environment (both optional):
#   PRECISION  fp32 (default), fp16, bf16 or amp: fairseq-train's --fp16 / --bf16 / --amp. fp16 and amp
#              need a GPU (fairseq's loss scaler); bf16 also runs on a CPU.
#   GPUS       how many GPUs train together (default: the CUDA devices torch sees here, 0 without CUDA;
#              fairseq-train uses all of them). Set it to the total over the nodes when you launch
#              several nodes yourself, so that the batch is split over all of them.
# Sets:
#   DEVICE_FLAGS     (--cpu) without a GPU, () with one
#   PRECISION_FLAGS  fairseq-train's precision flag, () for fp32
#   DEVICES          GPUS, or 1 on a CPU
# and defines split_batch, which keeps a recipe's batch per update whatever the number of devices.

GPUS="${GPUS:-$(python -c "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)" 2>/dev/null || echo 0)}"
PRECISION="${PRECISION:-fp32}"
[[ "$GPUS" =~ ^[0-9]+$ ]] || { echo "run.sh: GPUS must be a number of GPUs, got '$GPUS'" >&2; exit 2; }
if (( GPUS > 0 )); then DEVICE_FLAGS=(); DEVICES=$GPUS; else DEVICE_FLAGS=(--cpu); DEVICES=1; fi
case "$PRECISION" in
    fp32) PRECISION_FLAGS=() ;;
    bf16) PRECISION_FLAGS=(--bf16) ;;
    fp16|amp)
        (( GPUS > 0 )) || { echo "run.sh: PRECISION=$PRECISION needs a GPU (fairseq's loss scaler is CUDA's); on a CPU use PRECISION=fp32 or bf16" >&2; exit 2; }
        PRECISION_FLAGS=("--$PRECISION") ;;
    *) echo "run.sh: PRECISION must be fp32, fp16, bf16 or amp, got '$PRECISION'" >&2; exit 2 ;;
esac

# split_batch SIZE UPDATE_FREQ UNIT: the recipe's batch per update, SIZE x UPDATE_FREQ UNITs (SIZE: its
# --max-tokens or --batch-size; UPDATE_FREQ: the steps it accumulates on ONE device), split over the
# DEVICES: each device accumulates ceil(UPDATE_FREQ / DEVICES) steps of SIZE_PER_DEVICE =
# floor(SIZE x UPDATE_FREQ / (steps x DEVICES)) UNITs, so that
#     SIZE_PER_DEVICE x UPDATE_FREQ_PER_DEVICE x DEVICES = SIZE x UPDATE_FREQ
# exactly where DEVICES divides UPDATE_FREQ (8 GPUs with UPDATE_FREQ=8: 1 step of SIZE each), within
# rounding otherwise. On a CPU, or one GPU, nothing changes. Sets SIZE_PER_DEVICE and
# UPDATE_FREQ_PER_DEVICE and prints the split.
split_batch() {
    local size="$1" freq="$2" unit="$3" total
    total=$(( size * freq ))
    UPDATE_FREQ_PER_DEVICE=$(( (freq + DEVICES - 1) / DEVICES ))
    SIZE_PER_DEVICE=$(( total / (UPDATE_FREQ_PER_DEVICE * DEVICES) ))
    local where="CPU"
    if (( GPUS == 1 )); then where="1 GPU"; elif (( GPUS > 1 )); then where="$GPUS GPUs"; fi
    echo "==> device: $where, ${PRECISION}; per update: $DEVICES x $SIZE_PER_DEVICE $unit x update-freq" \
         "$UPDATE_FREQ_PER_DEVICE = $(( DEVICES * SIZE_PER_DEVICE * UPDATE_FREQ_PER_DEVICE )) $unit" \
         "(the recipe's $size x $freq = $total)"
}
