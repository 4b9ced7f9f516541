#!/usr/bin/env bash
# Train short, test long: every causal position method trained on blocks of L_TRAIN tokens and
# evaluated by fairseq-eval-lm at L_TRAIN x 1, 2, 4, 8, 16, with non-overlapping windows
# (--context-window 0) and a sliding window, the way Press et al. (2022, ALiBi) measure length
# extrapolation; then a markdown table, a JSON record and a PNG of perplexity against evaluation
# length.  See README.md in this folder.
#
#   bash examples/length_extrapolation/run.sh [--dry-run]          # PTB from ../shared/data/ptb_lm
#   DATA_DIR=/path/to/wikitext-103 PRESET=wikitext103 bash examples/length_extrapolation/run.sh   # a GPU
#
# Every fairseq command is printed before it runs; --dry-run only prints them.  Resumable: a finished
# training (its log says "done training" under this MAX_UPDATE) is not run again, an interrupted or failed
# one resumes from its checkpoint_last.pt and is never evaluated; a finished evaluation (scored, or refused
# by the model) is not redone: an evaluation writes its log under a temporary name and renames it when the
# command has ended, a failed one to eval.*.failed.log, which the next run redoes.  A failed training or
# evaluation is named in one line with its log, and the recipe exits 1.  One run per OUT (a lock);
# Ctrl-C or SIGTERM stops its trainings and evaluations with it.
# Device: the GPUs torch sees, else the CPU (examples/lib/device.sh); PRECISION=bf16 etc. for training.
set -euo pipefail
DRY_RUN=0
if [[ "${1:-}" == "--dry-run" ]]; then DRY_RUN=1; shift; fi

# ---------------------------------------------------------------- settings (override by env) ----
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
PRESET=${PRESET:-ptb}                             # ptb (tiny CPU models) or wikitext103 (a GPU; set DATA_DIR)
if [ "$PRESET" = wikitext103 ]; then              # defaults of the GPU preset (each still overridable)
    L_TRAIN=${L_TRAIN:-512}; TF_DIM=${TF_DIM:-512}; TF_FFN=${TF_FFN:-2048}; TF_LAYERS=${TF_LAYERS:-6}
    TF_HEADS=${TF_HEADS:-8}; LSTM_DIM=${LSTM_DIM:-512}; LSTM_LAYERS=${LSTM_LAYERS:-2}; BATCH_SIZE=${BATCH_SIZE:-16}
    MAX_UPDATE=${MAX_UPDATE:-50000}; LSTM_MAX_UPDATE=${LSTM_MAX_UPDATE:-$MAX_UPDATE}; LR=${LR:-0.0005}
    WARMUP=${WARMUP:-4000}; PARALLEL=${PARALLEL:-1}
    THREADS=${THREADS:-4}
    [ -n "${DATA_DIR:-}" ] || { echo "run.sh: PRESET=wikitext103 needs DATA_DIR=/path/to/wikitext-103 (wiki.{train,valid,test}.tokens)" >&2; exit 2; }
elif [ "$PRESET" != ptb ]; then
    echo "run.sh: PRESET must be ptb or wikitext103, got '$PRESET'" >&2; exit 2
fi
PTB_DIR=${PTB_DIR:-$REPO/../shared/data/ptb_lm}   # ../shared next to the repository
DATA_DIR=${DATA_DIR:-$PTB_DIR}                    # {ptb.,}{train,valid,test}.txt(.gz) or wiki.{train,valid,test}.tokens
MAX_LINES=${MAX_LINES:-0}                         # > 0: only the first MAX_LINES lines of each split (smoke runs)
OUT=${OUT:-$REPO/length-extrapolation-output}     # everything written goes here
DATA_OUT=${DATA_OUT:-$OUT}                        # where raw/ and data-bin/ lie (made there if missing): one
                                                  # prepared folder can serve several OUTs
STEPS=${STEPS:-prepare train table}               # prepare (raw text, binarize), train (each training and its
                                                  # evaluations), table (results.md/json, the PNG)
USER_DIR=${USER_DIR:-$REPO/fairseq_posattn}
PYTHON=${PYTHON:-python}                          # the Python of the project: lists the methods, reads how
                                                  # evaluations ended, makes the table
METHODS=${METHODS:-all}                           # names or "all" (extrapolation.py methods: every causal
                                                  # variant of the registry, sinusoidal, none, learned, the LSTM LMs)
SEEDS=${SEEDS:-1}                                 # several: the PNG draws their range as a band
PARALLEL=${PARALLEL:-2}                           # trainings (each followed by its evaluations) at once
THREADS=${THREADS:-1}                             # OMP threads per command

L_TRAIN=${L_TRAIN:-64}                            # training block length (--tokens-per-sample), = t of the model
MULTIPLIERS=${MULTIPLIERS:-1 2 4 8 16}            # evaluation lengths L = L_TRAIN x these
MODES=${MODES:-nonoverlapping sliding}            # --context-window 0, and --context-window L - stride
SLIDE_STRIDE=${SLIDE_STRIDE:-L/2}                 # the stride: tokens scored per sliding window, each read after
                                                  # up to L - stride earlier ones; a number of tokens (below
                                                  # L_TRAIN) or L/k. 1 = ALiBi's --context-window L-1: N windows
                                                  # of L tokens for N tokens (L/2: twice the non-overlapping cost)
SUBSET=${SUBSET:-valid}                           # split evaluated
EVAL_TOKENS=${EVAL_TOKENS:-8192}                  # tokens the model reads per evaluation batch (>= one window);
                                                  # fairseq-eval-lm holds their log-probabilities over the whole
                                                  # vocabulary (WikiText-103: 267k words, 8.7 GB at 8192)

# Training budget, the same for every method of a family (Adam with inverse-sqrt warm-up, as run_ptb.sh).
MAX_UPDATE=${MAX_UPDATE:-500}
LSTM_MAX_UPDATE=${LSTM_MAX_UPDATE:-2000}          # the LSTM LMs: after 500 updates they are still at the unigram level
BATCH_SIZE=${BATCH_SIZE:-32}                      # blocks of L_TRAIN tokens per update
LR=${LR:-0.001}
WARMUP=${WARMUP:-100}
DROPOUT=${DROPOUT:-0.1}
# Sizes: tiny, for a CPU (run_ptb.sh's transformer defaults).
TF_DIM=${TF_DIM:-128}
TF_FFN=${TF_FFN:-512}
TF_LAYERS=${TF_LAYERS:-2}
TF_HEADS=${TF_HEADS:-4}
LSTM_DIM=${LSTM_DIM:-128}
LSTM_LAYERS=${LSTM_LAYERS:-1}
# -------------------------------------------------------------------------------------------------

source "$REPO/examples/lib/device.sh"             # DEVICE_FLAGS (--cpu without a GPU), PRECISION_FLAGS, split_batch
source "$REPO/examples/lib/commands.sh"           # show, and the background jobs (examples/lib/workers.sh)
for value in L_TRAIN MAX_UPDATE LSTM_MAX_UPDATE BATCH_SIZE EVAL_TOKENS; do
    [[ "${!value}" =~ ^[0-9]+$ ]] && (( ${!value} > 0 )) || { echo "run.sh: $value must be a positive number, got '${!value}'" >&2; exit 2; }
done
# stride L: the sliding window's scored tokens per window at evaluation length L
if [[ "$SLIDE_STRIDE" =~ ^L/([0-9]+)$ ]] && (( BASH_REMATCH[1] >= 2 )); then
    stride() { echo $(( $1 / ${SLIDE_STRIDE#L/} > 0 ? $1 / ${SLIDE_STRIDE#L/} : 1 )); }
elif [[ "$SLIDE_STRIDE" =~ ^[0-9]+$ ]] && (( SLIDE_STRIDE >= 1 && SLIDE_STRIDE < L_TRAIN )); then
    stride() { echo "$SLIDE_STRIDE"; }
else
    echo "run.sh: SLIDE_STRIDE must be a number of tokens from 1 to L_TRAIN - 1 ($((L_TRAIN - 1))) or L/k with k >= 2, got '$SLIDE_STRIDE'" >&2; exit 2
fi
for step in $STEPS; do
    [[ "$step" == prepare || "$step" == train || "$step" == table ]] || { echo "run.sh: STEPS are prepare, train and table, got '$step'" >&2; exit 2; }
done
has_step() { [[ " $STEPS " == *" $1 "* ]]; }
for mode in $MODES; do
    [[ "$mode" == nonoverlapping || "$mode" == sliding ]] || { echo "run.sh: MODES are nonoverlapping and sliding, got '$mode'" >&2; exit 2; }
done
LENGTHS=()
for m in $MULTIPLIERS; do LENGTHS+=($((L_TRAIN * m))); done
split_batch "$BATCH_SIZE" 1 blocks

# the environment: $PYTHON lists the methods, reads how evaluations ended and makes the table; fairseq's tools
# run everything else
missing=""
"$PYTHON" -c "import importlib.util as u, sys; sys.exit(not (u.find_spec('fairseq_posattn') and u.find_spec('fairseq')))" \
    2>/dev/null || missing="$PYTHON cannot import fairseq_posattn"
if (( ! DRY_RUN )) && [ -z "$missing" ]; then
    for tool in fairseq-preprocess fairseq-train fairseq-eval-lm; do
        command -v "$tool" > /dev/null || { missing="'$tool' is not on PATH"; break; }
    done
fi
[ -z "$missing" ] || { echo "run.sh: error: $missing: run 'make install' in $REPO, then PATH=\"$REPO/.venv/bin:\$PATH\" bash $0 (or set PYTHON to the Python of an environment with fairseq_posattn)" >&2; exit 1; }

RAW=$DATA_OUT/raw
DATA=$DATA_OUT/data-bin
if (( ! DRY_RUN )); then
    lock_output_folder "$OUT"                     # one run per OUT: a second one stops here, naming the first
    stop_jobs_with_the_recipe                     # Ctrl-C / SIGTERM: the trainings and evaluations stop too
    mkdir -p "$RAW" "$DATA_OUT/logs" "$OUT/logs" "$OUT/checkpoints"
fi

# 1. raw text (decompressed, the first MAX_LINES lines if asked)
first_lines() { if (( MAX_LINES > 0 )); then sed -n "1,${MAX_LINES}p"; else cat; fi; }  # reads all: no SIGPIPE
for split in train valid test; do
    if has_step prepare && (( ! DRY_RUN )) && [ ! -s "$RAW/$split.txt" ]; then
        src=""
        for candidate in "ptb.$split.txt" "ptb.$split.txt.gz" "$split.txt" "$split.txt.gz" "wiki.$split.tokens"; do
            if [ -f "$DATA_DIR/$candidate" ]; then src="$DATA_DIR/$candidate"; break; fi
        done
        [ -n "$src" ] || { echo "no ptb.$split.txt(.gz), $split.txt(.gz) or wiki.$split.tokens in $DATA_DIR" >&2; exit 1; }
        # shellcheck disable=SC2002
        if [[ "$src" == *.gz ]]; then gunzip -c "$src" | first_lines > "$RAW/$split.txt.part"
        else cat "$src" | first_lines > "$RAW/$split.txt.part"; fi
        mv "$RAW/$split.txt.part" "$RAW/$split.txt"
    fi
done

# 2. binarize (one dictionary, --only-source) into a temporary folder, renamed data-bin once complete: a
#    binarization cut short (it writes dict.txt first) never passes for prepared data
if has_step prepare && [ ! -f "$DATA/dict.txt" ]; then
    preprocess=(fairseq-preprocess --only-source --task language_modeling --workers 2
                --trainpref "$RAW/train.txt" --validpref "$RAW/valid.txt" --testpref "$RAW/test.txt" --destdir "$DATA.tmp")
    show "${preprocess[@]}"
    if (( ! DRY_RUN )); then
        rm -rf "$DATA.tmp"
        "${preprocess[@]}" > "$DATA_OUT/logs/preprocess.log" 2>&1 || {
            echo "run.sh: error: fairseq-preprocess failed (see $DATA_OUT/logs/preprocess.log)" >&2; exit 1; }
        rm -rf "$DATA"
        mv "$DATA.tmp" "$DATA"
    fi
fi
has_step train || has_step table || exit 0
if (( ! DRY_RUN )) && has_step train && [ ! -f "$DATA/dict.txt" ]; then
    echo "run.sh: no binarized data in $DATA: run the prepare step (STEPS=prepare) for DATA_OUT=$DATA_OUT first" >&2; exit 1
fi

# 3. the methods and their flags, from the position registry (extrapolation.py methods)
declare -A FAMILY FLAGS EXTENSION
NAMES=()
# shellcheck disable=SC2086
listing=$("$PYTHON" "$HERE/extrapolation.py" methods $METHODS)
while IFS=$'\t' read -r name family extension flags; do
    NAMES+=("$name"); FAMILY[$name]=$family; FLAGS[$name]=$flags; EXTENSION[$name]=$extension
done <<< "$listing"
echo "==> methods: ${NAMES[*]}"

TF_SIZES=(--arch transformer_lm_posattn --decoder-embed-dim "$TF_DIM" --decoder-input-dim "$TF_DIM"
          --decoder-output-dim "$TF_DIM" --decoder-ffn-embed-dim "$TF_FFN" --decoder-layers "$TF_LAYERS"
          --decoder-attention-heads "$TF_HEADS" --share-decoder-input-output-embed)
LSTM_SIZES=(--decoder-embed-dim "$LSTM_DIM" --decoder-hidden-size "$LSTM_DIM" --decoder-out-embed-dim "$LSTM_DIM"
            --decoder-layers "$LSTM_LAYERS" --share-decoder-input-output-embed)
OPTIM_FLAGS=(--optimizer adam --adam-betas '(0.9, 0.98)' --clip-norm 1.0 --lr "$LR" --lr-scheduler inverse_sqrt
             --warmup-updates "$WARMUP" --warmup-init-lr 1e-07)

export OMP_NUM_THREADS=$THREADS MKL_NUM_THREADS=$THREADS
now_ms() { echo $(( $(date +%s%N) / 1000000 )); }
seconds_since() { local ms=$(( $(now_ms) - $1 )); printf '%d.%03d' $((ms / 1000)) $((ms % 1000)); }

# outcome LOG: how the evaluation of LOG ended: ok (scored), refused (the model refused the length) or failed
outcome() { "$PYTHON" "$HERE/extrapolation.py" outcome "$1"; }

# evaluate NAME SEED MODE L: one fairseq-eval-lm in a fresh process, written to its log's temporary name
# (with wall_seconds and exit_status appended) and renamed when the command has ended: to its log when it
# scored the split or the model refused the length (finished: not redone), else to eval.*.failed.log (the
# next run redoes it) with a one-line error; status 1 then
evaluate() {
    local name=$1 seed=$2 mode=$3 length=$4 ckdir="$OUT/checkpoints/$1/seed$2"
    local log="$OUT/logs/eval.$name.seed$seed.$mode.L$length.log" window batch start status=0
    local failed_log="${log%.log}.failed.log"
    if [ -f "$log" ]; then
        [ "$(outcome "$log")" = failed ] || return 0
        (( DRY_RUN )) || mv "$log" "$failed_log"   # a log of a failed evaluation under the finished name: redone
    fi
    if [ "$mode" = sliding ]; then
        window=$((length - $(stride "$length")))
        batch=(--batch-size $(( EVAL_TOKENS / length > 0 ? EVAL_TOKENS / length : 1 )) --max-tokens "$EVAL_TOKENS")
    else
        window=0
        batch=(--max-tokens $(( EVAL_TOKENS / length > 0 ? EVAL_TOKENS / length * length : length )))
    fi
    # --model-overrides raises the model's position limit to L; tokens_per_sample stays the checkpoint's
    # (the positional LSTM's normalizer N is that value: ALiBi's override of it would change the model)
    local overrides="{'max_target_positions': $length}"  # a zero-shot context extension's options too past L_TRAIN
    [ "${EXTENSION[$name]}" = none ] || overrides=$("$PYTHON" "$HERE/extrapolation.py" overrides "$name" "$length" "$L_TRAIN")
    local cmd=(fairseq-eval-lm "$DATA" --user-dir "$USER_DIR" --path "$ckdir/checkpoint_last.pt" --gen-subset "$SUBSET"
               --sample-break-mode none --tokens-per-sample "$length" --context-window "$window" "${batch[@]}"
               --model-overrides "$overrides" --num-workers 0 "${DEVICE_FLAGS[@]}")
    show "${cmd[@]}"
    (( DRY_RUN )) && return 0
    start=$(now_ms)
    "${cmd[@]}" > "$log.part" 2>&1 || status=$?
    { echo "wall_seconds $(seconds_since "$start")"; echo "exit_status $status"; } >> "$log.part"
    if [ "$(outcome "$log.part")" = failed ]; then
        mv "$log.part" "$failed_log"
        echo "run.sh: error: the evaluation of $name seed $seed ($mode, L=$length) failed ($(how_it_ended "$status");" \
             "see $failed_log): run the recipe again to redo it" >&2
        return 1
    fi
    rm -f "$failed_log"
    mv "$log.part" "$log"
}

# trained LOG UPDATES: the training of LOG finished under the budget UPDATES (fairseq's own "done training",
# and its configuration's max_update)
trained() { grep -q "done training" "$1" 2> /dev/null && grep -qF "'max_update': $2," "$1"; }

# train NAME SEED: fairseq-train of one model unless it finished under this budget (fairseq-train would make
# one more update); an interrupted or failed one resumes from its checkpoint_last.pt. A training that runs
# first deletes its model's evaluations (made again). Status 1, with a one-line error naming the run and its
# log, when the training does not finish (killed, failed, or cut short)
train() {
    local name=$1 seed=$2 ckdir="$OUT/checkpoints/$1/seed$2" log="$OUT/logs/train.$1.seed$2.log" start status=0
    local sizes=("${TF_SIZES[@]}") updates=$MAX_UPDATE
    [ "${FAMILY[$name]}" = lstm ] && sizes=("${LSTM_SIZES[@]}") updates=$LSTM_MAX_UPDATE
    trained "$log" "$updates" && return 0
    (( DRY_RUN )) || { mkdir -p "$ckdir"; rm -f "$OUT/logs/eval.$name.seed$seed."*.log; }
    # shellcheck disable=SC2206  # the method's flags are a word list
    local method=(${FLAGS[$name]})
    local command=(fairseq-train "$DATA" --task language_modeling --user-dir "$USER_DIR"
                   --sample-break-mode none --tokens-per-sample "$L_TRAIN" "${sizes[@]}" "${method[@]}"
                   --dropout "$DROPOUT" "${OPTIM_FLAGS[@]}" --batch-size "$SIZE_PER_DEVICE"
                   --update-freq "$UPDATE_FREQ_PER_DEVICE" --required-batch-size-multiple 1
                   --max-update "$updates" --max-epoch 0 --disable-validation --no-epoch-checkpoints
                   --save-dir "$ckdir" --seed "$seed" --num-workers 0 --log-format simple --log-interval 100
                   "${PRECISION_FLAGS[@]}" "${DEVICE_FLAGS[@]}")
    show "${command[@]}"
    (( DRY_RUN )) && return 0
    start=$(now_ms)
    "${command[@]}" > "$log" 2>&1 || status=$?
    echo "wall_seconds $(seconds_since "$start")" >> "$log"
    trained "$log" "$updates" && return 0
    echo "run.sh: error: the training of $name seed $seed did not finish (fairseq-train:" \
         "$(how_it_ended "$status"); see $log): its model is not evaluated; run the recipe again to resume it" \
         "from its checkpoint_last.pt" >&2
    return 1
}

# train_and_evaluate NAME SEED: the training, then every evaluation (each one's failure is named; status 1
# if the training or an evaluation failed)
train_and_evaluate() {
    local name=$1 seed=$2 failures=0 mode length
    train "$name" "$seed" || return 1
    for mode in $MODES; do
        for length in "${LENGTHS[@]}"; do evaluate "$name" "$seed" "$mode" "$length" || failures=$((failures + 1)); done
    done
    (( DRY_RUN || failures )) || echo "done $name seed $seed"
    (( failures == 0 ))
}

# 4. train + evaluate, PARALLEL at a time (--dry-run: print, in order)
FAILED_RUNS=0
if has_step train; then
    for name in "${NAMES[@]}"; do
        for seed in $SEEDS; do
            if (( DRY_RUN )); then train_and_evaluate "$name" "$seed"; continue; fi
            start_job "$PARALLEL" train_and_evaluate "$name" "$seed"
        done
    done
    (( DRY_RUN )) || wait_jobs || FAILED_RUNS=$FAILED_JOBS
fi

# 5. table, JSON and PNG (of what finished)
if has_step table; then
    table=("$PYTHON" "$HERE/extrapolation.py" table --out "$OUT" --methods "${NAMES[*]}" --seeds "$SEEDS"
           --lengths "${LENGTHS[*]}" --modes "$MODES" --train-length "$L_TRAIN" --stride "$SLIDE_STRIDE")
    show "${table[@]}"
    (( DRY_RUN )) && exit 0
    "${table[@]}"
    echo "==> $OUT/results.md, $OUT/results.json, $OUT/perplexity.png"
fi
if (( FAILED_RUNS )); then
    echo "run.sh: error: $FAILED_RUNS of $(( ${#NAMES[@]} * $(wc -w <<< "$SEEDS") )) runs did not finish (each named" \
         "above with its log; the table shows what finished): run the same command again to redo them" >&2
    exit 1
fi
