# Device, precision and per-device batch of the recipes' fairseq commands; sourced by every recipe before it
# does any work.
#
# Reads from the environment (all optional):
#   PRECISION  fp32 (default), fp16, bf16 or amp: fairseq-train's --fp16 / --bf16 / --amp. fp16 and amp
#              need a GPU (fairseq's loss scaler); bf16 also runs on a CPU.
#   GPUS       how many GPUs train together (default: the CUDA devices torch sees here times NODES, 0 without
#              CUDA; fairseq-train uses all of them). 0 trains on the CPU.
#   NODES      over how many nodes they are (default 1): when you launch several nodes yourself, run the recipe
#              on each with NODES and GPUS = all the GPUs of all of them, so that the batch is split over all.
# GPUS must be what fairseq-train will use, NODES x the devices torch sees here: otherwise it would train on
# other devices than the recipe prints, with another batch per update, and the recipe stops at once, in one line.
# Sets:
#   DEVICE_FLAGS        (--cpu) without a GPU, () with one
#   PRECISION_FLAGS     fairseq-train's precision flag, () for fp32
#   DEVICES             GPUS, or 1 on a CPU
#   CUDA_DEVICES_SEEN   what torch sees here (probed once, where GPUS asks for GPUs or is not given; exported, so
#                       that the recipes this one starts do not import torch again)
# and defines split_batch, which keeps a recipe's batch per update whatever the number of devices.

RECIPE="${0##*/}"
NODES="${NODES:-1}"
[[ "$NODES" =~ ^[1-9][0-9]*$ ]] || { echo "$RECIPE: NODES must be a number of nodes, got '$NODES'" >&2; exit 2; }
[[ -z "${GPUS:-}" || "$GPUS" =~ ^[0-9]+$ ]] || {
    echo "$RECIPE: GPUS must be a number of GPUs, got '$GPUS'" >&2; exit 2; }
if [[ "${GPUS:-}" != 0 && -z "${CUDA_DEVICES_SEEN:-}" ]]; then
    CUDA_DEVICES_SEEN=$(python -c "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)" 2>/dev/null || echo 0)
    export CUDA_DEVICES_SEEN
fi
GPUS="${GPUS:-$(( NODES * CUDA_DEVICES_SEEN ))}"
if (( GPUS > 0 && GPUS != NODES * CUDA_DEVICES_SEEN )); then
    if (( CUDA_DEVICES_SEEN == 0 )); then
        echo "$RECIPE: GPUS=$GPUS, but torch sees no CUDA device here: fairseq-train would train on the CPU, with" \
             "another batch per update than the recipe prints. Run on the CPU with GPUS=0 (or without GPUS), or" \
             "where torch sees the GPUs" >&2
    else
        echo "$RECIPE: GPUS=$GPUS on NODES=$NODES node(s), but torch sees $CUDA_DEVICES_SEEN CUDA device(s) here," \
             "all of which fairseq-train uses: it would train on $(( NODES * CUDA_DEVICES_SEEN )), with another" \
             "batch per update than the recipe prints. Give GPUS=$(( NODES * CUDA_DEVICES_SEEN )), choose the GPUs" \
             "with CUDA_VISIBLE_DEVICES, or give NODES when the run spans several nodes (GPUS = NODES x the GPUs" \
             "of each)" >&2
    fi
    exit 2
fi
PRECISION="${PRECISION:-fp32}"
if (( GPUS > 0 )); then DEVICE_FLAGS=(); DEVICES=$GPUS; else DEVICE_FLAGS=(--cpu); DEVICES=1; fi
case "$PRECISION" in
    fp32) PRECISION_FLAGS=() ;;
    bf16) PRECISION_FLAGS=(--bf16) ;;
    fp16|amp)
        (( GPUS > 0 )) || { echo "$RECIPE: PRECISION=$PRECISION needs a GPU (fairseq's loss scaler is CUDA's); on a CPU use PRECISION=fp32 or bf16" >&2; exit 2; }
        PRECISION_FLAGS=("--$PRECISION") ;;
    *) echo "$RECIPE: PRECISION must be fp32, fp16, bf16 or amp, got '$PRECISION'" >&2; exit 2 ;;
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
