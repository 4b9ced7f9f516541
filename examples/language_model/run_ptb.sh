#!/usr/bin/env bash
# Penn Treebank language modelling: fairseq's lstm_lm, attentive_lstm_lm (Salton et al. 2017),
# positional_attentive_lstm_lm (Dagan 2019), Dagan's LSTM baseline (baseline_lstm_lm, as the authors'
# code builds it) and transformer_lm_posattn variants, all trained with
# the same budget, evaluated by fairseq-eval-lm in a fresh process from the checkpoint, then a
# markdown table of valid / test perplexity.  See README.md in this folder.
#
#   PTB_DIR=/path/to/ptb bash examples/language_model/run_ptb.sh [--dry-run]
#
# Every fairseq command is printed before it runs; --dry-run only prints them.  A training that does not
# finish (killed, failed) is named in one line with its log and never evaluated; the recipe then exits 1
# after the table of what finished, and the same command resumes it.  One run per OUT (a lock); Ctrl-C or
# SIGTERM stops its trainings and evaluations with it.
# PTB_DIR holds ptb.{train,valid,test}.txt (or .txt.gz; the Mikolov version, <unk> and N already in).
# Device: the GPUs torch sees (all of them, the batch split over them), else the CPU; PRECISION=fp16,
# bf16 or amp for mixed precision (examples/lib/device.sh).
set -euo pipefail
DRY_RUN=0
if [[ "${1:-}" == "--dry-run" ]]; then DRY_RUN=1; shift; fi

# ---------------------------------------------------------------- settings (override by env) ----
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PTB_DIR=${PTB_DIR:-$REPO/../shared/data/ptb_lm}   # ../shared next to the repository
OUT=${OUT:-$REPO/ptb-lm-output}                  # everything written goes here
USER_DIR=${USER_DIR:-$REPO/fairseq_posattn}
MODELS=${MODELS:-"positional_attentive_lstm_lm tf_conv2d tf_vanilla tf_da tf_shaw16 tf_direct_both lstm_lm attentive_lstm_lm"}
PARALLEL=${PARALLEL:-2}                           # trainings at once
THREADS=${THREADS:-1}                             # OMP threads per training

# Data: sentence-level, as the paper (each sentence its own sample, end of sentence included).
BREAK_MODE=${BREAK_MODE:-eos}
TOKENS_PER_SAMPLE=${TOKENS_PER_SAMPLE:-35}        # the positional LSTM's normalizer N (block)
MAX_TARGET_POSITIONS=${MAX_TARGET_POSITIONS:-128} # >= longest PTB sentence + eos (83): no truncation

# Budget, the same for every model.
MAX_UPDATE=${MAX_UPDATE:-250}                     # 0: no limit (then STOP_TIME_HOURS or MAX_EPOCH)
MAX_EPOCH=${MAX_EPOCH:-0}                         # 0: no limit
STOP_TIME_HOURS=${STOP_TIME_HOURS:-0}             # fairseq's --stop-time-hours (training time, kept over resumes); 0: none
BATCH_SIZE=${BATCH_SIZE:-32}                      # samples per update, whatever the number of GPUs
OPTIMIZER=${OPTIMIZER:-adam}                      # adam: Adam + inverse-sqrt warm-up (LR, WARMUP);
                                                  # paper: the authors' SGD (LR, e.g. 30), no momentum, weight
                                                  # decay WEIGHT_DECAY, lr x 0.5 after LR_PATIENCE epochs without
                                                  # a lower valid loss, clip-norm 0.25 on the gradient of the
                                                  # loss per sentence (LOSS_AVG; needs VALIDATE=1)
LR=${LR:-0.001}
LR_PATIENCE=${LR_PATIENCE:-5}                     # OPTIMIZER=paper: --lr-patience (the authors' runs: 5; Salton's: 6)
LOSS_AVG=${LOSS_AVG-}                             # the gradient's normalisation: sentence (--sentence-avg: the loss
                                                  # summed over each sentence, averaged over the batch's sentences)
                                                  # or token (fairseq's: per target token); empty: sentence with
                                                  # OPTIMIZER=paper (under clip-norm 0.25 the authors' update for
                                                  # their summed loss), token with adam
WARMUP=${WARMUP:-100}
WEIGHT_DECAY=${WEIGHT_DECAY-}                     # --weight-decay; empty: 1.2e-6 with OPTIMIZER=paper (the
                                                  # authors'), none (fairseq's 0) with adam
PATIENCE=${PATIENCE:-0}                           # > 0: stop after that many validations without a lower
                                                  # valid loss (--patience; needs VALIDATE=1); 0: no early stop
ATTENTIVE_LM_INIT=${ATTENTIVE_LM_INIT-}           # attentive LSTMs' --attentive-lm-init (authors, uniform);
                                                  # empty: the architectures' default (authors)
POSITIONAL_ATTENTION_EPS=${POSITIONAL_ATTENTION_EPS-}  # Dagan's --positional-attention-eps; empty: default (1e-3)
DROPOUT=${DROPOUT-0.1}                            # empty: no --dropout (the LSTM LMs' own 0.5 / 0.2 / 0.5)
VALIDATE=${VALIDATE:-0}                           # 1: validate every epoch (learning curves), else none
SEED=${SEED:-1}
EVAL_CHECKPOINT=${EVAL_CHECKPOINT:-checkpoint_last.pt}   # or checkpoint_best.pt (needs VALIDATE=1)
EVAL_MAX_TOKENS=${EVAL_MAX_TOKENS:-4096}

# Sizes: tiny, for a CPU.  The papers' sizes (GPU):
#   LSTMs (Dagan 2019, as the authors' code runs it): LSTM_DIM=400 LSTM_LAYERS=2 DROPOUT= (empty: the
#     attentive LSTMs' own 0.5 in/out, 0.2 between layers), batch 32 sentences for the attentive and
#     positional LMs (BATCH_SIZE=32; 20 is their LSTM baseline's), SGD lr 30, weight decay 1.2e-6, x0.5
#     after 5 epochs without improvement (Salton's run: 6, LR_PATIENCE=6), clip 0.25 (OPTIMIZER=paper
#     VALIDATE=1 LR=30), up to 500 epochs with early stopping (MAX_UPDATE=0 MAX_EPOCH=500 PATIENCE=25;
#     the paper says 10),
#     scored from checkpoint_best.pt.  The authors cut training sentences at 35 tokens; here they are
#     whole (MAX_TARGET_POSITIONS).
#   Transformer: TF_DIM=512 TF_FFN=2048 TF_LAYERS=6 TF_HEADS=8 (or --arch transformer_lm_posattn_big).
LSTM_DIM=${LSTM_DIM:-128}
LSTM_LAYERS=${LSTM_LAYERS:-1}
TF_DIM=${TF_DIM:-128}
TF_FFN=${TF_FFN:-512}
TF_LAYERS=${TF_LAYERS:-2}
TF_HEADS=${TF_HEADS:-4}
# -------------------------------------------------------------------------------------------------

source "$REPO/examples/lib/device.sh"             # DEVICE_FLAGS (--cpu without a GPU), PRECISION_FLAGS, split_batch
source "$REPO/examples/lib/commands.sh"           # show, and the background jobs (examples/lib/workers.sh)
split_batch "$BATCH_SIZE" 1 samples

RAW=$OUT/raw
DATA=$OUT/data-bin
if (( ! DRY_RUN )); then
    lock_output_folder "$OUT"                     # one run per OUT: a second one stops here, naming the first
    stop_jobs_with_the_recipe                     # Ctrl-C / SIGTERM: the trainings and evaluations stop too
    mkdir -p "$RAW" "$OUT/logs" "$OUT/checkpoints"
fi

# 1. raw text (decompressed if needed; written under a temporary name: a copy cut short is never read as the split)
for split in train valid test; do
    if (( ! DRY_RUN )) && [ ! -s "$RAW/$split.txt" ]; then
        if [ -f "$PTB_DIR/ptb.$split.txt" ]; then cp "$PTB_DIR/ptb.$split.txt" "$RAW/$split.txt.part"
        elif [ -f "$PTB_DIR/ptb.$split.txt.gz" ]; then gunzip -c "$PTB_DIR/ptb.$split.txt.gz" > "$RAW/$split.txt.part"
        elif [ -f "$PTB_DIR/$split.txt" ]; then cp "$PTB_DIR/$split.txt" "$RAW/$split.txt.part"
        else echo "no ptb.$split.txt(.gz) or $split.txt in $PTB_DIR" >&2; exit 1; fi
        mv "$RAW/$split.txt.part" "$RAW/$split.txt"
    fi
done

# 2. binarize (language modelling: one dictionary, --only-source) into a temporary folder, renamed data-bin once
#    complete: a binarization cut short (it writes dict.txt first) never passes for prepared data
if [ ! -f "$DATA/dict.txt" ]; then
    preprocess=(fairseq-preprocess --only-source --task language_modeling --workers 2
                --trainpref "$RAW/train.txt" --validpref "$RAW/valid.txt" --testpref "$RAW/test.txt" --destdir "$DATA.tmp")
    show "${preprocess[@]}"
    if (( ! DRY_RUN )); then
        rm -rf "$DATA.tmp"
        "${preprocess[@]}" > "$OUT/logs/preprocess.log" 2>&1 || {
            echo "run_ptb.sh: error: fairseq-preprocess failed (see $OUT/logs/preprocess.log)" >&2; exit 1; }
        rm -rf "$DATA"
        mv "$DATA.tmp" "$DATA"
    fi
fi

# 3. model flags
model_flags() {
    local lstm="--decoder-embed-dim $LSTM_DIM --decoder-hidden-size $LSTM_DIM --decoder-out-embed-dim $LSTM_DIM --decoder-layers $LSTM_LAYERS --share-decoder-input-output-embed"
    local init="${ATTENTIVE_LM_INIT:+ --attentive-lm-init $ATTENTIVE_LM_INIT}"
    local eps="${POSITIONAL_ATTENTION_EPS:+ --positional-attention-eps $POSITIONAL_ATTENTION_EPS}"
    local tf="--arch transformer_lm_posattn --decoder-embed-dim $TF_DIM --decoder-input-dim $TF_DIM --decoder-output-dim $TF_DIM --decoder-ffn-embed-dim $TF_FFN --decoder-layers $TF_LAYERS --decoder-attention-heads $TF_HEADS --share-decoder-input-output-embed"
    case "$1" in
        lstm_lm)                       echo "--arch lstm_lm $lstm" ;;
        attentive_lstm_lm)             echo "--arch attentive_lstm_lm $lstm$init" ;;
        positional_attentive_lstm_lm)  echo "--arch positional_attentive_lstm_lm $lstm$init$eps" ;;
        baseline_lstm_lm)              echo "--arch baseline_lstm_lm $lstm$init" ;;  # Dagan's LSTM baseline
        tf_vanilla)                    echo "$tf" ;;
        tf_da)                         echo "$tf --decoder-distance-aware" ;;
        tf_shaw16)                     echo "$tf --decoder-relative-positions 16" ;;
        tf_direct_both)                echo "$tf --decoder-direct-position both" ;;  # t = --max-target-positions
        tf_conv2d)                     echo "$tf --decoder-conv-attention 2d" ;;
        *) echo "unknown model $1" >&2; return 1 ;;
    esac
}

case "$OPTIMIZER" in
    adam)  OPTIM_FLAGS=(--optimizer adam --adam-betas '(0.9, 0.98)' --clip-norm 1.0 --lr "$LR"
                        --lr-scheduler inverse_sqrt --warmup-updates "$WARMUP" --warmup-init-lr 1e-07) ;;
    paper) OPTIM_FLAGS=(--optimizer sgd --clip-norm 0.25 --lr "$LR" --weight-decay "${WEIGHT_DECAY:-1.2e-6}"
                        --lr-scheduler reduce_lr_on_plateau --lr-shrink 0.5 --lr-patience "$LR_PATIENCE") ;;
    *) echo "run_ptb.sh: OPTIMIZER must be adam or paper, got '$OPTIMIZER'" >&2; exit 2 ;;
esac
[ "$OPTIMIZER" = adam ] && [ -n "$WEIGHT_DECAY" ] && OPTIM_FLAGS+=(--weight-decay "$WEIGHT_DECAY")
[ -n "$LOSS_AVG" ] || { [ "$OPTIMIZER" = paper ] && LOSS_AVG=sentence || LOSS_AVG=token; }
case "$LOSS_AVG" in
    sentence) OPTIM_FLAGS+=(--sentence-avg) ;;
    token) ;;
    *) echo "run_ptb.sh: LOSS_AVG must be sentence or token, got '$LOSS_AVG'" >&2; exit 2 ;;
esac
STOP_FLAGS=(--max-update "$MAX_UPDATE" --max-epoch "$MAX_EPOCH" --stop-time-hours "$STOP_TIME_HOURS")
if [ "$VALIDATE" = 1 ]; then VALID_FLAGS=(); else VALID_FLAGS=(--disable-validation); fi
if [ "$PATIENCE" != 0 ]; then
    [ "$VALIDATE" = 1 ] || { echo "run_ptb.sh: PATIENCE needs VALIDATE=1" >&2; exit 2; }
    STOP_FLAGS+=(--patience "$PATIENCE")
fi
DROPOUT_FLAGS=()
[ -n "$DROPOUT" ] && DROPOUT_FLAGS=(--dropout "$DROPOUT")

COMMON_DATA=(--task language_modeling --user-dir "$USER_DIR" --sample-break-mode "$BREAK_MODE"
             --tokens-per-sample "$TOKENS_PER_SAMPLE" --max-target-positions "$MAX_TARGET_POSITIONS")

export OMP_NUM_THREADS=$THREADS MKL_NUM_THREADS=$THREADS
# train_and_eval NAME: train the model unless its training finished, then fairseq-eval-lm of valid and test;
# status 1, with a one-line error naming the model and the log, if the training does not finish (then nothing
# is evaluated) or an evaluation fails
train_and_eval() {
    local name=$1 ckdir="$OUT/checkpoints/$1" log="$OUT/logs/train.$1.log" start end status=0
    (( DRY_RUN )) || mkdir -p "$ckdir"
    start=$(date +%s) end=$(date +%s)
    # a finished training is not run again (fairseq-train would make one more update); an
    # interrupted or failed one resumes from its checkpoint_last.pt, and its old evaluations go
    if ! grep -q "done training" "$log" 2>/dev/null; then
        (( DRY_RUN )) || rm -f "$OUT/logs/eval.$name."*.log
        # shellcheck disable=SC2046,SC2206  # the model's flags are a word list
        local train=(fairseq-train "$DATA" "${COMMON_DATA[@]}" $(model_flags "$name") "${DROPOUT_FLAGS[@]}" "${OPTIM_FLAGS[@]}"
                     --batch-size "$SIZE_PER_DEVICE" --update-freq "$UPDATE_FREQ_PER_DEVICE" --required-batch-size-multiple 1
                     "${STOP_FLAGS[@]}" "${PRECISION_FLAGS[@]}"
                     "${VALID_FLAGS[@]}" --no-epoch-checkpoints --save-dir "$ckdir" --seed "$SEED" --num-workers 0
                     --log-format simple --log-interval 100 "${DEVICE_FLAGS[@]}")
        show "${train[@]}"
        if (( ! DRY_RUN )); then
            "${train[@]}" > "$log" 2>&1 || status=$?
            end=$(date +%s)
            echo "wall_seconds $((end - start))" >> "$log"
            grep -q "done training" "$log" || {
                echo "run_ptb.sh: error: the training of $name did not finish (fairseq-train: $(how_it_ended "$status");" \
                     "see $log): it is not evaluated; run the recipe again to resume it from its checkpoint_last.pt" >&2
                return 1; }
        fi
    fi
    # fresh processes, from the checkpoint; every target token incl. end of sentence is scored; each log is
    # written under a temporary name and renamed once the command has succeeded
    for subset in valid test; do
        local evaluate=(fairseq-eval-lm "$DATA" --user-dir "$USER_DIR" --path "$ckdir/$EVAL_CHECKPOINT" --gen-subset "$subset"
                        --sample-break-mode "$BREAK_MODE" --tokens-per-sample "$TOKENS_PER_SAMPLE"
                        --max-target-positions "$MAX_TARGET_POSITIONS" --max-tokens "$EVAL_MAX_TOKENS"
                        --num-workers 0 "${DEVICE_FLAGS[@]}")
        local eval_log="$OUT/logs/eval.$name.$subset.log"
        show "${evaluate[@]}"
        (( DRY_RUN )) && continue
        status=0
        "${evaluate[@]}" > "$eval_log.part" 2>&1 || status=$?
        if (( status )); then
            echo "run_ptb.sh: error: the evaluation of $name on $subset failed (fairseq-eval-lm: $(how_it_ended "$status");" \
                 "see $eval_log.part)" >&2
            return 1
        fi
        mv "$eval_log.part" "$eval_log"
    done
    (( DRY_RUN )) || echo "done $name ($((end - start)) s training)"
}

# 4. train + evaluate, PARALLEL at a time (--dry-run: print, in order)
FAILED_RUNS=0
for name in $MODELS; do
    model_flags "$name" > /dev/null
    if (( DRY_RUN )); then train_and_eval "$name"; continue; fi
    start_job "$PARALLEL" train_and_eval "$name"
done
(( DRY_RUN )) && exit 0
wait_jobs || FAILED_RUNS=$FAILED_JOBS

# 5. table (of what finished)
python "$REPO/examples/language_model/results_table.py" --logs "$OUT/logs" --models $MODELS \
    | tee "$OUT/results.md"
if (( FAILED_RUNS )); then
    echo "run_ptb.sh: error: $FAILED_RUNS of $(wc -w <<< "$MODELS") models did not finish (each named above with its" \
         "log; the table shows what finished): run the same command again to redo them" >&2
    exit 1
fi
