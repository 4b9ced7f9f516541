#!/usr/bin/env bash
# Part-of-speech tagging on one UD treebank (Dufter et al. 2020, section 3): prepare, train the
# paper's Table 2 variants with several seeds and the same budget, score the dev set (accuracy over
# all, OOV and ambiguous words) in a fresh process, tag it back to CoNLL-U, and write a results table
# and a learning-curve picture.  See README.md in this folder.
#
#   bash examples/pos_tagging/run.sh                                   # UD English-EWT from $EWT (default ../shared/data/ud_english_ewt)
#   bash examples/pos_tagging/run.sh TRAIN.conllu[.gz] DEV.conllu [TEST.conllu]
#   bash examples/pos_tagging/run.sh --dry-run [...]                   # print every command, run none
#
# A run whose training, scoring or tagging fails is named (FAILED ... with its folder) and the others go on;
# the tables are made once every run has finished (the recipe exits 1 until then: the same command resumes
# what failed).  One run per OUT (a lock); Ctrl-C or SIGTERM stops its trainings with it.
# Device: the GPUs torch sees (all of them, the batch split over them), else the CPU; PRECISION=fp16,
# bf16 or amp for mixed precision (examples/lib/device.sh).
set -euo pipefail
DRY_RUN=0
if [[ "${1:-}" == "--dry-run" ]]; then DRY_RUN=1; shift; fi

# ---------------------------------------------------------------- settings (override by env) ----
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
EWT=${EWT:-$REPO/../shared/data/ud_english_ewt}
TRAIN=${1:-$EWT/en_ewt-ud-train.conllu.gz}
DEV=${2:-$EWT/en_ewt-ud-dev.conllu}
TEST=${3:-}
OUT=${OUT:-$REPO/pos-tagging-output}
USER_DIR=${USER_DIR:-$REPO/fairseq_posattn}
VARIANTS=${VARIANTS:-"pe_add p_r temp conv conv2d"}   # names in variants.sh
SEEDS=${SEEDS:-"1 2 3"}
PARALLEL=${PARALLEL:-2}                 # trainings at once
THREADS=${THREADS:-1}                   # OMP threads per training
TAG_COLUMN=${TAG_COLUMN:-upos}
# Budget, the same for every run (the paper: RMSprop, early stopping with 3 epochs' patience).
MAX_UPDATE=${MAX_UPDATE:-500}           # 0: no limit (then PATIENCE or MAX_EPOCH stops)
MAX_TOKENS=${MAX_TOKENS:-2000}          # words per update, whatever the number of GPUs
VALIDATE_EVERY=${VALIDATE_EVERY:-50}    # updates between dev evaluations (the learning curves); 0: every epoch
PATIENCE=${PATIENCE:-0}                 # >0: stop after that many dev evaluations without a better accuracy
                                        # (the paper's early stopping: PATIENCE=3 with VALIDATE_EVERY=0)
MAX_EPOCH=${MAX_EPOCH:-0}               # 0: no limit
CHECKPOINT=${CHECKPOINT:-checkpoint_last.pt}   # scored and tagged; checkpoint_best.pt with early stopping
LR=${LR:-0.001}
# -------------------------------------------------------------------------------------------------

source "$REPO/examples/pos_tagging/variants.sh"
source "$REPO/examples/lib/device.sh"   # DEVICE_FLAGS (--cpu without a GPU), PRECISION_FLAGS, split_batch
source "$REPO/examples/lib/commands.sh" # show, for_each_run (examples/lib/workers.sh's jobs)
split_batch "$MAX_TOKENS" 1 words
for v in $VARIANTS; do
    [[ -n "${VARIANT_FLAGS[$v]:-}" ]] || { echo "run.sh: unknown variant '$v' (${!VARIANT_FLAGS[*]})" >&2; exit 2; }
done
for f in "$TRAIN" "$DEV"; do
    [[ -f "$f" ]] || { echo "run.sh: $f not found; pass TRAIN.conllu DEV.conllu [TEST.conllu]" >&2; exit 2; }
done

PATIENCE_FLAGS=()                       # fairseq's own default (-1) when off: the shipped configs leave it out
(( PATIENCE > 0 )) && PATIENCE_FLAGS=(--patience "$PATIENCE")
DATA=$OUT/data-bin
if (( ! DRY_RUN )); then
    lock_output_folder "$OUT"           # one run per OUT: a second one stops here, naming the first
    stop_jobs_with_the_recipe           # Ctrl-C / SIGTERM: the trainings stop too
    mkdir -p "$OUT/logs"
fi
export OMP_NUM_THREADS=$THREADS MKL_NUM_THREADS=$THREADS

# 1. vocabularies and binarized splits (t = 60 words, 20 characters, 50% of the words)
if [[ ! -f "$DATA/tagging.json" ]]; then
    prepare=(posattn-prepare-tagging --train "$TRAIN" --valid "$DEV" ${TEST:+--test "$TEST"}
             --tag-column "$TAG_COLUMN" --destdir "$DATA")
    show "${prepare[@]}"
    (( DRY_RUN )) || "${prepare[@]}" > "$OUT/logs/prepare.log" 2>&1 || { tail -n 5 "$OUT/logs/prepare.log" >&2; exit 1; }
fi

# 2. train, then score and tag from the last checkpoint in fresh processes; a training that runs first deletes
#    the scores of an earlier model (an interrupted training, a raised budget), which are made again
train_and_score() {
    local variant=$1 seed=$2 run="$OUT/runs/$1/seed$2" start status=0
    (( DRY_RUN )) || mkdir -p "$run"
    if ! grep -q "done training" "$run/train.log" 2>/dev/null; then
        (( DRY_RUN )) || rm -f "$run/validate.log" "$run/dev.pred.conllu" "$run/tag.log"
        start=$(date +%s)
        # shellcheck disable=SC2206  # the variant's flags are a word list
        local train=(fairseq-train "$DATA" --user-dir "$USER_DIR"
                     --task pos_tagging --criterion pos_tagging --arch san_tagger ${VARIANT_FLAGS[$variant]}
                     --optimizer rmsprop --lr "$LR" --max-tokens "$SIZE_PER_DEVICE" --update-freq "$UPDATE_FREQ_PER_DEVICE"
                     --max-update "$MAX_UPDATE" --max-epoch "$MAX_EPOCH" "${PATIENCE_FLAGS[@]}" "${PRECISION_FLAGS[@]}"
                     --validate-interval-updates "$VALIDATE_EVERY" --save-interval-updates "$VALIDATE_EVERY"
                     --keep-interval-updates 1 --no-epoch-checkpoints --save-dir "$run/checkpoints"
                     --best-checkpoint-metric accuracy --maximize-best-checkpoint-metric
                     --seed "$seed" --num-workers 0 --log-format simple --log-interval 50 "${DEVICE_FLAGS[@]}")
        show "${train[@]}"
        if (( ! DRY_RUN )); then
            "${train[@]}" > "$run/train.log" 2>&1 || status=$?
            if (( status )); then
                tail -n 20 "$run/train.log" >&2
                echo "run.sh: error: the training of $variant seed $seed did not finish (fairseq-train:" \
                     "$(how_it_ended "$status"); see $run/train.log): it is not scored" >&2
                return 1
            fi
            echo "wall_seconds $(( $(date +%s) - start ))" >> "$run/train.log"
        fi
    fi
    local subsets=valid
    [[ -n "$TEST" ]] && subsets=valid,test
    local validate=(fairseq-validate "$DATA" --user-dir "$USER_DIR" --task pos_tagging
                    --path "$run/checkpoints/$CHECKPOINT" --valid-subset "$subsets" --max-tokens 4000
                    --num-workers 0 "${DEVICE_FLAGS[@]}")
    local tag=(posattn-tag "$DATA" --path "$run/checkpoints/$CHECKPOINT"
               --input "$DEV" --output "$run/dev.pred.conllu" "${DEVICE_FLAGS[@]}")
    show "${validate[@]}"
    show "${tag[@]}"
    (( DRY_RUN )) && return 0
    "${validate[@]}" > "$run/validate.log" 2>&1 || { tail -n 20 "$run/validate.log" >&2; return 1; }
    "${tag[@]}" > "$run/tag.log" 2>&1 || { tail -n 5 "$run/tag.log" >&2; return 1; }
    echo "done ${VARIANT_NAME[$variant]} seed $seed"
}

# every variant and seed, PARALLEL at a time (--dry-run: printed in order)
failed=0
for_each_run train_and_score || failed=$FAILED_JOBS
(( DRY_RUN )) && exit 0
if (( failed )); then
    echo "run.sh: error: $failed of $(( $(wc -w <<< "$VARIANTS") * $(wc -w <<< "$SEEDS") )) runs failed (each named" \
         "above with its folder); the tables are made once every run has finished: run the same command again" >&2
    exit 1
fi

# 3. table (mean and sd over seeds) and learning curves (dev accuracy against updates)
table=() curves=()
for variant in $VARIANTS; do
    table+=(--variant "${VARIANT_NAME[$variant]}=$OUT/runs/$variant")
    for seed in $SEEDS; do curves+=(--run "${VARIANT_NAME[$variant]}=$OUT/runs/$variant/seed$seed/train.log"); done
done
python "$REPO/examples/pos_tagging/results_table.py" "${table[@]}" | tee "$OUT/results.md"
posattn-learning-curves "${curves[@]}" --metric accuracy --output "$OUT/learning_curves.png"
