#!/usr/bin/env bash
# Quickstart: Multi30k en->de sample -> Moses + joint BPE -> fairseq-preprocess, with a spaCy parse of
# the English side alongside -> structural side data -> two small transformer_posattn models trained
# side by side: the baseline (no position option: fairseq's transformer, sinusoidal positions) and
# Wang et al.'s structural positions -> beam search on test -> one sacreBLEU table (signature,
# bootstrap 95% interval, paired bootstrap p-value of the structural model against the baseline).
#
# Run from the repository root with the virtualenv's bin first on PATH (`make quickstart` does both):
#     PATH="$PWD/.venv/bin:$PATH" bash examples/quickstart/run.sh [--dry-run]
# About 6 minutes on 2 idle CPU cores (8 with a bare machine's `make install`); everything goes to
# quickstart-output/ in the repository, or to the folder OUT names (rebuilt on every run).
# Every command is printed before it runs; --dry-run only prints them. The same two models as
# fairseq-hydra-train configs: fairseq_posattn/configs/quickstart/ (docs/hydra_configs.md).
# Without a GPU the two models train at once, each on half the cores. Where torch sees a GPU they train
# there one after the other (on every GPU it sees, the batch split over them); PRECISION=fp16, bf16 or
# amp turns on mixed precision (examples/lib/device.sh). One run per output folder (a second one stops at
# once, naming the first); Ctrl-C or SIGTERM stops its parses and trainings with it.
set -euo pipefail
DRY_RUN=0
if [[ "${1:-}" == "--dry-run" ]]; then DRY_RUN=1; fi

# ---- settings: change the models here -----------------------------------------------------------
SIZE_FLAGS=(
    --arch transformer_posattn
    --encoder-layers 2 --decoder-layers 2
    --encoder-embed-dim 128 --decoder-embed-dim 128
    --encoder-ffn-embed-dim 256 --decoder-ffn-embed-dim 256
    --encoder-attention-heads 4 --decoder-attention-heads 4
    --max-source-positions 128 --max-target-positions 128
    --share-all-embeddings --dropout 0.3
)
# name -> position flags (Wang et al. 2019, Table 1 rows 4 and 6); both get the same budget
declare -A VARIANTS=(
    [baseline]=""
    [structural]="--encoder-structural-positions both --encoder-structural-fusion nonlinear"
)
# Fixed budget per model: 600 updates of ~2,500 target tokens (26 epochs of the 3,000 pairs), a short
# warm-up to a high peak learning rate; about 5.5 minutes for both models on 2 idle CPU cores.
MAX_UPDATE=${MAX_UPDATE:-600}
TRAIN_FLAGS=(
    --optimizer adam --adam-betas "(0.9, 0.98)" --clip-norm 0.0
    --lr 2e-3 --lr-scheduler inverse_sqrt --warmup-updates 200 --warmup-init-lr 1e-7
    --criterion label_smoothed_cross_entropy --label-smoothing 0.1 --weight-decay 0.0001
    --max-update "$MAX_UPDATE" --seed 1
)
MAX_TOKENS=4096   # tokens per update, whatever the number of GPUs
SRC=en
TGT=de
BPE_MERGES=2000
RAW=data/multi30k_sample
OUT=${OUT:+$(realpath -m "$OUT")}  # a folder of your choice, from where you are, or by default:
OUT=${OUT:-quickstart-output}       # relative to the repository root
# -------------------------------------------------------------------------------------------------

cd "$(dirname "${BASH_SOURCE[0]}")/../.."
REPO_ROOT="$(pwd)"
USER_DIR="$REPO_ROOT/fairseq_posattn"
source examples/lib/device.sh  # DEVICE_FLAGS (--cpu without a GPU), PRECISION_FLAGS, split_batch, GPUS
source examples/lib/workers.sh # lock_output_folder, stop_jobs_with_the_recipe
split_batch "$MAX_TOKENS" 1 tokens
TRAIN_FLAGS+=(--max-tokens "$SIZE_PER_DEVICE" --update-freq "$UPDATE_FREQ_PER_DEVICE" "${PRECISION_FLAGS[@]}")
if (( GPUS == 0 )); then  # two jobs at a time (parses, trainings, beam searches), each on half the cores
    THREADS=$(( $(nproc) / 2 > 1 ? $(nproc) / 2 : 1 ))
    export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$THREADS}" MKL_NUM_THREADS="${MKL_NUM_THREADS:-$THREADS}"
fi

for tool in fairseq-preprocess fairseq-train fairseq-generate posattn-prepare-translation posattn-parse \
    posattn-prepare-structure posattn-compare; do
    command -v "$tool" >/dev/null || {
        echo "quickstart: '$tool' not on PATH: run 'make install', then PATH=\"\$PWD/.venv/bin:\$PATH\" bash $0" >&2
        exit 1
    }
done

# run LOG CMD...: print CMD, then (unless --dry-run) run it with its output in LOG, shown if it fails
run() {
    local log="$1"; shift
    printf '+%s\n' "$(printf ' %q' "$@")"  # one write: jobs side by side do not interleave
    (( DRY_RUN )) && return 0
    "$@" > "$log" 2>&1 || { tail -n 30 "$log" >&2; echo "quickstart: failed, see $log" >&2; return 1; }
}
# run_to FILE LOG CMD...: the same with stdout in FILE and stderr in LOG
run_to() {
    local file="$1" log="$2"; shift 2
    printf '+%s > %q\n' "$(printf ' %q' "$@")" "$file"
    (( DRY_RUN )) && return 0
    "$@" > "$file" 2> "$log" || { tail -n 30 "$log" >&2; echo "quickstart: failed, see $log" >&2; return 1; }
}
# wait_all PID...: wait for every background job; fail if any failed
wait_all() {
    local pid failed=0
    for pid in "$@"; do wait "$pid" || failed=1; done
    return "$failed"
}

PREPARED="$OUT/prepared"
DATA_BIN="$OUT/data-bin"
LOGS="$OUT/logs"
if (( ! DRY_RUN )); then
    lock_output_folder "$OUT"
    stop_jobs_with_the_recipe
    # Rebuilt from scratch: fairseq-preprocess refuses an existing dictionary and fairseq-train would
    # resume from an old checkpoint_last.pt and stop at once.
    rm -rf "$PREPARED" "$DATA_BIN" "$LOGS" "$OUT"/checkpoints-* "$OUT"/generate-* "$OUT"/bleu.md
    mkdir -p "$LOGS"
fi
start=$SECONDS
stamp() { echo "==> [$((SECONDS - start)) s] $*"; }

stamp "1/5 tokenize + joint BPE ($BPE_MERGES merges) -> $PREPARED"
run "$LOGS/prepare.log" posattn-prepare-translation \
    --raw-dir "$RAW" --out-dir "$PREPARED" --source-lang "$SRC" --target-lang "$TGT" \
    --bpe-merges "$BPE_MERGES" --splits train valid test

stamp "2/5 fairseq-preprocess -> $DATA_BIN, and the spaCy dependency parse of the tokenized English alongside"
pids=()
for split in train valid test; do
    run "$LOGS/parse-$split.log" posattn-parse --backend spacy \
        --input "$PREPARED/$split.tok.$SRC" --output "$PREPARED/$split.conllu" & pids+=($!)
done
run "$LOGS/preprocess.log" fairseq-preprocess --source-lang "$SRC" --target-lang "$TGT" \
    --trainpref "$PREPARED/train.bpe" --validpref "$PREPARED/valid.bpe" --testpref "$PREPARED/test.bpe" \
    --destdir "$DATA_BIN" --joined-dictionary --workers 1 & pids+=($!)
wait_all "${pids[@]}"

stamp "3/5 structural side data (tree depth and positions of each BPE piece's word) next to $DATA_BIN"
pids=()
for split in train valid test; do
    run "$LOGS/structure-$split.log" posattn-prepare-structure --conllu "$PREPARED/$split.conllu" \
        --bpe "$PREPARED/$split.bpe.$SRC" --destdir "$DATA_BIN" --split "$split" \
        --source-lang "$SRC" --target-lang "$TGT" & pids+=($!)
done
wait_all "${pids[@]}"

# train NAME: one model, checkpoints in $OUT/checkpoints-NAME
train() {
    local position_flags
    read -r -a position_flags <<< "${VARIANTS[$1]}"
    run "$LOGS/train-$1.log" fairseq-train "$DATA_BIN" --user-dir "$USER_DIR" --task translation_structural \
        --source-lang "$SRC" --target-lang "$TGT" "${SIZE_FLAGS[@]}" "${position_flags[@]}" "${TRAIN_FLAGS[@]}" \
        --save-dir "$OUT/checkpoints-$1" --no-epoch-checkpoints --log-format simple --log-interval 100 \
        "${DEVICE_FLAGS[@]}"
}
# generate NAME: beam search on test with the best checkpoint (by validation loss)
# (--required-batch-size-multiple 1: otherwise fairseq-generate silently drops the last batch)
generate() {
    run_to "$OUT/generate-$1.txt" "$LOGS/generate-$1.log" fairseq-generate "$DATA_BIN" --user-dir "$USER_DIR" \
        --task translation_structural --source-lang "$SRC" --target-lang "$TGT" \
        --path "$OUT/checkpoints-$1/checkpoint_best.pt" --gen-subset test \
        --beam 5 --remove-bpe --required-batch-size-multiple 1 --batch-size 64 "${DEVICE_FLAGS[@]}"
}
# each FUNC: FUNC baseline and FUNC structural, at once without a GPU, one after the other with one
each() {
    local fn="$1" name
    if (( GPUS > 0 )); then
        for name in baseline structural; do "$fn" "$name"; done
    else
        pids=()
        for name in baseline structural; do "$fn" "$name" & pids+=($!); done
        wait_all "${pids[@]}"
    fi
}

stamp "4/5 fairseq-train baseline and structural: $MAX_UPDATE updates each (logs: $LOGS/train-*.log)"
each train
if (( ! DRY_RUN )); then
    for name in baseline structural; do
        echo "    $name: $(grep -E '\| valid \|' "$LOGS/train-$name.log" | tail -n 1 | grep -oE 'loss [0-9.]+ .*ppl [0-9.]+')"
    done
fi

stamp "5/5 fairseq-generate on test (beam 5), then sacreBLEU of both (detokenized) against $RAW/test.$TGT"
each generate
run_to "$OUT/bleu.md" "$LOGS/compare.log" posattn-compare --ref "$RAW/test.$TGT" --target-lang "$TGT" \
    baseline="$OUT/generate-baseline.txt" structural="$OUT/generate-structural.txt"
(( DRY_RUN )) || cat "$OUT/bleu.md"
stamp "done: one seed on 3,000 sentence pairs, a demonstration of the pipeline, not evidence for either model"
