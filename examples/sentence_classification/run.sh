#!/usr/bin/env bash
# SST-2 sentence classification with position-aware encoders (Wu et al. 2021, DA-Transformer, Table 4):
# vanilla Transformer (sinusoidal PE), Transformer-RPR (Shaw et al. 2018) and DA-Transformer, each with
# several seeds and the same budget, through fairseq's own --task/--criterion sentence_prediction;
# every best checkpoint re-scored by fairseq-validate in a fresh process; a table of the best and final
# dev accuracy (mean and sd over seeds) and the dev-accuracy learning curves.  See README.md here.
#
#   bash examples/sentence_classification/run.sh              # ../shared/data/sst2
#   bash examples/sentence_classification/run.sh DIR          # DIR/stsa.binary.{train,dev}, e.g. data/sst2_sample
#   bash examples/sentence_classification/run.sh --dry-run [DIR]   # print every command, run none
#
# A run whose training or re-scoring fails is named (FAILED ... with its folder) and the others go on; the
# table and curves are made once every run has finished (the recipe exits 1 until then: the same command
# resumes what failed).  One run per OUT (a lock); Ctrl-C or SIGTERM stops its trainings with it.
# Device: the GPUs torch sees (all of them, the batch split over them), else the CPU; PRECISION=fp16,
# bf16 or amp for mixed precision (examples/lib/device.sh).
set -euo pipefail
DRY_RUN=0
if [[ "${1:-}" == "--dry-run" ]]; then DRY_RUN=1; shift; fi

# ---------------------------------------------------------------- settings (override by env) ----
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
SST2=${1:-${SST2:-$REPO/../shared/data/sst2}}
OUT=${OUT:-$REPO/sentence-classification-output}
USER_DIR=${USER_DIR:-$REPO/fairseq_posattn}
VARIANTS=${VARIANTS:-"vanilla shaw da"}   # of: vanilla shaw da nopos
SEEDS=${SEEDS:-"1 2 3"}
PARALLEL=${PARALLEL:-2}                   # trainings at once
THREADS=${THREADS:-1}                     # OMP threads per training
ARCH=${ARCH:-transformer_posattn_classifier_wu2021}   # Wu et al.: 1 layer, 16 heads x 16 dimensions
MODEL_FLAGS=${MODEL_FLAGS:-}              # extra model flags for every variant (e.g. sizes)
WORD_THRESHOLD=${WORD_THRESHOLD:-2}       # words seen fewer times in training become <unk>
MAX_POSITIONS=${MAX_POSITIONS:-128}       # t (SST-2's longest dev/train sentence: 53 words + EOS)
SHAW_CLIP=${SHAW_CLIP:-16}                # k of Transformer-RPR
# Budget, the same for every run: Adam, lr 1e-3 (Wu et al.), batches of 32 sentences.
MAX_UPDATE=${MAX_UPDATE:-434}             # 2 epochs of SST-2's 6,920 training sentences (217 batches each)
BATCH_SIZE=${BATCH_SIZE:-32}             # sentences per update, whatever the number of GPUs
VALIDATE_EVERY=${VALIDATE_EVERY:-50}      # updates between dev evaluations (the learning curves)
LR=${LR:-1e-3}
# -------------------------------------------------------------------------------------------------

declare -A VARIANT_FLAGS=(
    [vanilla]=""
    [shaw]="--encoder-relative-positions $SHAW_CLIP --no-token-positional-embeddings"
    [da]="--encoder-distance-aware --no-token-positional-embeddings"
    [nopos]="--no-token-positional-embeddings"
)
declare -A VARIANT_NAME=([vanilla]="Transformer" [shaw]="Transformer-RPR" [da]="DA-Transformer"
                         [nopos]="no positions")
for v in $VARIANTS; do
    [[ -n "${VARIANT_NAME[$v]:-}" ]] || { echo "run.sh: unknown variant '$v' (${!VARIANT_NAME[*]})" >&2; exit 2; }
done
for split in train dev; do
    [[ -f "$SST2/stsa.binary.$split" ]] || { echo "run.sh: $SST2/stsa.binary.$split not found" >&2; exit 2; }
done

source "$REPO/examples/lib/device.sh"      # DEVICE_FLAGS (--cpu without a GPU), PRECISION_FLAGS, split_batch
source "$REPO/examples/lib/commands.sh"    # show, for_each_run (examples/lib/workers.sh's jobs)
split_batch "$BATCH_SIZE" 1 sentences

DATA=$OUT/data-bin
if (( ! DRY_RUN )); then
    lock_output_folder "$OUT"              # one run per OUT: a second one stops here, naming the first
    stop_jobs_with_the_recipe              # Ctrl-C / SIGTERM: the trainings stop too
    mkdir -p "$OUT/logs"
fi
export OMP_NUM_THREADS=$THREADS MKL_NUM_THREADS=$THREADS

# 1. label / sentence files, then fairseq's binarized input0/ and label/ folders, made in data-bin.tmp and
#    renamed data-bin once both are complete (a binarization cut short never passes for prepared data)
if [[ ! -f "$DATA/label/dict.txt" ]]; then
    split=(posattn-prepare-classification --train "$SST2/stsa.binary.train" --valid "$SST2/stsa.binary.dev"
           --labels 0 1 --destdir "$OUT/text")
    binarize_sentences=(fairseq-preprocess --only-source --trainpref "$OUT/text/train.input0"
                        --validpref "$OUT/text/valid.input0" --thresholdsrc "$WORD_THRESHOLD"
                        --destdir "$DATA.tmp/input0" --workers 1)
    binarize_labels=(fairseq-preprocess --only-source --trainpref "$OUT/text/train.label"
                     --validpref "$OUT/text/valid.label" --destdir "$DATA.tmp/label" --workers 1)
    show "${split[@]}"
    show "${binarize_sentences[@]}"
    show "${binarize_labels[@]}"
    if (( ! DRY_RUN )); then
        rm -rf "$DATA.tmp"
        "${split[@]}" > "$OUT/logs/split.log" 2>&1 || { tail -n 3 "$OUT/logs/split.log" >&2; exit 1; }
        "${binarize_sentences[@]}" > "$OUT/logs/preprocess.log" 2>&1
        "${binarize_labels[@]}" >> "$OUT/logs/preprocess.log" 2>&1
        rm -rf "$DATA"
        mv "$DATA.tmp" "$DATA"
    fi
fi

# 2. train, then re-score the best checkpoint in a fresh process
#    (--required-batch-size-multiple 1: fairseq would otherwise drop the last dev batch)
TASK_FLAGS=(--user-dir "$USER_DIR" --task sentence_prediction --num-classes 2 --max-positions "$MAX_POSITIONS"
            --criterion sentence_prediction --required-batch-size-multiple 1 --num-workers 0 "${DEVICE_FLAGS[@]}")
#    a training that runs first deletes the re-score of an earlier model, which is made again
train_and_score() {
    local variant=$1 seed=$2 run="$OUT/runs/$1/seed$2" status=0
    (( DRY_RUN )) || mkdir -p "$run"
    if ! grep -q "done training" "$run/train.log" 2>/dev/null; then
        (( DRY_RUN )) || rm -f "$run/validate.log"
        # shellcheck disable=SC2206  # the variant's flags and MODEL_FLAGS are word lists
        local train=(fairseq-train "$DATA" "${TASK_FLAGS[@]}" --arch "$ARCH" ${VARIANT_FLAGS[$variant]} $MODEL_FLAGS
                     --optimizer adam --lr "$LR" --batch-size "$SIZE_PER_DEVICE" --update-freq "$UPDATE_FREQ_PER_DEVICE"
                     --max-update "$MAX_UPDATE" "${PRECISION_FLAGS[@]}"
                     --validate-interval-updates "$VALIDATE_EVERY" --save-interval-updates "$VALIDATE_EVERY"
                     --keep-interval-updates 1 --no-epoch-checkpoints --no-last-checkpoints --no-save-optimizer-state
                     --best-checkpoint-metric accuracy --maximize-best-checkpoint-metric --save-dir "$run/checkpoints"
                     --seed "$seed" --log-format simple --log-interval 50)
        show "${train[@]}"
        if (( ! DRY_RUN )); then
            "${train[@]}" > "$run/train.log" 2>&1 || status=$?
            if (( status )); then
                tail -n 20 "$run/train.log" >&2
                echo "run.sh: error: the training of $variant seed $seed did not finish (fairseq-train:" \
                     "$(how_it_ended "$status"); see $run/train.log): it is not scored" >&2
                return 1
            fi
        fi
    fi
    local validate=(fairseq-validate "$DATA" "${TASK_FLAGS[@]}" --path "$run/checkpoints/checkpoint_best.pt" --batch-size 128)
    show "${validate[@]}"
    (( DRY_RUN )) && return 0
    "${validate[@]}" > "$run/validate.log" 2>&1 || { tail -n 20 "$run/validate.log" >&2; return 1; }
    local logged rescored
    logged=$(grep -o "best_accuracy [0-9.]*" "$run/train.log" | tail -n 1 | cut -d' ' -f2)
    rescored=$(grep "valid on 'valid' subset" "$run/validate.log" | grep -o "| accuracy [0-9.]*" | cut -d' ' -f3)
    [[ "$logged" == "$rescored" ]] || echo "WARNING $variant seed $seed: best dev accuracy $logged in training," \
        "$rescored from the reloaded checkpoint" >&2
    echo "done ${VARIANT_NAME[$variant]} seed $seed: best dev accuracy $rescored"
}

start=$(date +%s)
failed=0
for_each_run train_and_score || failed=$FAILED_JOBS
(( DRY_RUN )) && exit 0
echo "trainings and re-scoring: $(( $(date +%s) - start )) s wall"
if (( failed )); then
    echo "run.sh: error: $failed of $(( $(wc -w <<< "$VARIANTS") * $(wc -w <<< "$SEEDS") )) runs failed (each named" \
         "above with its folder); the table and curves are made once every run has finished: run the same command" \
         "again" >&2
    exit 1
fi

# 3. table (best and final dev accuracy, mean ± sd over seeds) and learning curves
curves=()
for variant in $VARIANTS; do
    for seed in $SEEDS; do curves+=(--run "${VARIANT_NAME[$variant]}=$OUT/runs/$variant/seed$seed/train.log"); done
done
posattn-learning-curves "${curves[@]}" --metric accuracy --output "$OUT/learning_curves.png" \
    --title "SST-2 dev accuracy ($ARCH, seeds: $SEEDS)" --table "$OUT/results.md"
