# Shared steps of the structural-position recipes (multi30k_en_de, wmt14_en_de, nist_zh_en).
# Sourced by each run.sh after its settings; it reads DRY_RUN, STEPS, JOBS (trainings at once, default
# 1), CORES (fairseq-preprocess workers, default all), FUSION, STRUCT_CLIP,
# SEQ_REL_CLIP, VARIANTS, ROW_NAME, OUT, LOGS, PREPARED, DATA_BIN, SPLITS, SRC, TGT, USER_DIR,
# TRAIN_FLAGS, DEVICE_FLAGS, EXTRA_TRAIN_FLAGS and MAX_UPDATE; the parse step PARSER_ARGS (or PARSER,
# STANZA_DIR, SPACY_MODEL, PARSE_WORKERS through set_parser_args), PARSE_SHARDS and PARSE_SHARD_ID;
# clean_pairs CLEAN_MAX_LEN and CLEAN_RATIO. Each recipe takes examples/lib/workers.sh's lock on OUT and
# stops its jobs with it (Ctrl-C, SIGTERM) before it writes anything.

source "$(dirname "${BASH_SOURCE[0]}")/workers.sh"  # lock_output_folder, stop_jobs_with_the_recipe, start_job

# Encoder flags of Wang et al.'s Table 1 rows. Rows 1-3 drop the encoder's sequential positions only
# (--encoder-no-token-positional-embeddings); the decoder keeps its own, as in the paper.
STRUCT_ABS="--encoder-structural-fusion $FUSION"
STRUCT_REL="--encoder-structural-clip $STRUCT_CLIP"
declare -A ROW_FLAGS=(
    [1]="--encoder-no-token-positional-embeddings"
    [2]="--encoder-no-token-positional-embeddings --encoder-structural-positions absolute"
    [3]="--encoder-no-token-positional-embeddings --encoder-structural-positions relative $STRUCT_REL"
    [4]="--encoder-structural-positions none"
    [5]="--encoder-structural-positions absolute $STRUCT_ABS"
    [6]="--encoder-structural-positions both $STRUCT_ABS $STRUCT_REL"
    [7]="--encoder-relative-positions $SEQ_REL_CLIP"
    [8]="--encoder-relative-positions $SEQ_REL_CLIP --encoder-structural-positions absolute $STRUCT_ABS"
    [9]="--encoder-relative-positions $SEQ_REL_CLIP --encoder-structural-positions both $STRUCT_ABS $STRUCT_REL"
)
# systems a recipe offers beside Table 1's rows (multi30k_en_de: the sequential methods), declared
# by the recipe as the associative array EXTRA_ROW_FLAGS before it sources this file
if declare -p EXTRA_ROW_FLAGS &> /dev/null; then
    for row in "${!EXTRA_ROW_FLAGS[@]}"; do ROW_FLAGS[$row]="${EXTRA_ROW_FLAGS[$row]}"; done
fi
# the rows a recipe offers are the keys of its ROW_NAME
for row in $VARIANTS; do
    [[ -n "${ROW_NAME[$row]:-}" ]] || {
        echo "run.sh: VARIANTS takes $(printf '%s ' "${!ROW_NAME[@]}" | tr ' ' '\n' | sort -n | xargs), got '$row'" >&2
        exit 2
    }
done

JOBS="${JOBS:-1}"
CORES="${CORES:-$(nproc)}"   # before a recipe sets OMP_NUM_THREADS, which nproc obeys

# run LOG CMD...: print CMD; unless --dry-run, run it with stdout and stderr in LOG (tail shown on failure)
run() {
    local log="$1"; shift
    printf '+'; printf ' %q' "$@"; printf '\n'
    (( DRY_RUN )) && return 0
    "$@" > "$log" 2>&1 || { tail -n 30 "$log" >&2; echo "run.sh: failed, see $log" >&2; exit 1; }
}
# run_to FILE LOG CMD...: the same with stdout in FILE
run_to() {
    local file="$1" log="$2"; shift 2
    printf '+'; printf ' %q' "$@"; printf ' > %q\n' "$file"
    (( DRY_RUN )) && return 0
    "$@" > "$file" 2> "$log" || { tail -n 30 "$log" >&2; echo "run.sh: failed, see $log" >&2; exit 1; }
}
# in_parallel FUNC ARG...: FUNC ARG for every ARG, at most $JOBS at a time (workers.sh's jobs); fails if any failed
in_parallel() {
    local fn="$1" arg; shift
    for arg in "$@"; do start_job "$JOBS" "$fn" "$arg"; done
    wait_jobs
}
want() { [[ " $STEPS " == *" $1 "* ]]; }
start=$SECONDS
stamp() { echo "==> [$((SECONDS - start)) s] $*"; }

# need FILE: stop with a message naming FILE unless it exists (or --dry-run)
need() { (( DRY_RUN )) || [[ -f "$1" ]] || { echo "run.sh: missing $1 (see README.md for the layout)" >&2; exit 1; }; }
# clean_pairs SRC TGT OUT_SRC OUT_TGT: keep pairs with both sides non-empty, at most $CLEAN_MAX_LEN words
# and a word-count ratio (longer / shorter side) of at most $CLEAN_RATIO; a pair with a tab inside is
# dropped (paste joins on tabs). The corpus step of wmt14_en_de and nist_zh_en
clean_pairs() {
    paste "$1" "$2" | awk -F'\t' -v max="$CLEAN_MAX_LEN" -v ratio="$CLEAN_RATIO" \
        -v out_src="$3" -v out_tgt="$4" '
        NF == 2 {
            n = split($1, a, " "); m = split($2, b, " ")
            if (n >= 1 && m >= 1 && n <= max && m <= max && n <= ratio * m && m <= ratio * n) {
                print $1 > out_src; print $2 > out_tgt; kept++
            }
        }
        END { printf "kept %d of %d pairs\n", kept, NR }'
}

# set_parser_args LANG: PARSER_ARGS, posattn-parse's options for $PARSER (stanza or spacy) on language
# LANG (reads STANZA_DIR, SPACY_MODEL, PARSE_WORKERS)
set_parser_args() {
    case "$PARSER" in
        stanza) PARSER_ARGS=(--backend stanza --lang "$1" --stanza-dir "$STANZA_DIR" --workers "$PARSE_WORKERS") ;;
        spacy)  PARSER_ARGS=(--backend spacy --model "$SPACY_MODEL" --workers "$PARSE_WORKERS") ;;
        *) echo "run.sh: PARSER must be stanza or spacy, got '$PARSER'" >&2; exit 2 ;;
    esac
}

# parse_step: the dependency parse of every split's tokenized source ($PREPARED/SPLIT.tok.$SRC ->
# SPLIT.conllu) by posattn-parse "${PARSER_ARGS[@]}"; a parsed split is skipped. The training split in
# ${PARSE_SHARDS:-1} resumable shards: a finished shard is never redone; with PARSE_SHARD_ID (0-based)
# only that shard is parsed and the recipe stops there (one cluster job per shard), and a later run
# without it merges them
parse_step() {
    local shards="${PARSE_SHARDS:-1}" shard_id="${PARSE_SHARD_ID:-}" split shard_args
    stamp "parse: ${PARSER_ARGS[1]} on $PREPARED/*.tok.$SRC$( (( shards > 1 )) && echo " ($shards training shards)")"
    for split in "${SPLITS[@]}"; do
        [[ -f "$PREPARED/$split.conllu" ]] && continue
        shard_args=()
        if [[ "$split" == train ]] && { (( shards > 1 )) || [[ -n "$shard_id" ]]; }; then
            shard_args=(--num-shards "$shards")
            [[ -n "$shard_id" ]] && shard_args+=(--shard-id "$shard_id")
        fi
        run "$LOGS/parse-$split.log" posattn-parse "${PARSER_ARGS[@]}" "${shard_args[@]}" \
            --input "$PREPARED/$split.tok.$SRC" --output "$PREPARED/$split.conllu"
    done
    if [[ -n "$shard_id" ]]; then stamp "parsed training shard $shard_id only"; exit 0; fi
}

# binarize_step TEST_PREFIXES: fairseq-preprocess of $PREPARED/{train,valid}.bpe and TEST_PREFIXES
# (comma-separated: the splits test, test1, ...) into $DATA_BIN, one dictionary for both languages;
# skipped when $DATA_BIN has it. Binarized into $DATA_BIN.tmp and renamed once complete: a binarization cut
# short (it writes the dictionary first) never passes for binarized data
binarize_step() {
    stamp "binarize: fairseq-preprocess -> $DATA_BIN"
    if [[ -f "$DATA_BIN/dict.$SRC.txt" ]]; then echo "    (done already)"; return 0; fi
    (( DRY_RUN )) || rm -rf "$DATA_BIN.tmp"
    run "$LOGS/preprocess.log" fairseq-preprocess --source-lang $SRC --target-lang $TGT \
        --trainpref "$PREPARED/train.bpe" --validpref "$PREPARED/valid.bpe" --testpref "$1" \
        --destdir "$DATA_BIN.tmp" --joined-dictionary --workers "$CORES"
    (( DRY_RUN )) || { rm -rf "$DATA_BIN"; mv "$DATA_BIN.tmp" "$DATA_BIN"; }
}

# structure_step: the side data (tree depth and DFS times per BPE piece + EOS) of every split,
# next to the binarized source; a split that has it already is skipped
structure_step() {
    stamp "structure: side data -> $DATA_BIN/*.structure.{bin,idx}"
    for split in "${SPLITS[@]}"; do
        [[ -f "$DATA_BIN/$split.$SRC-$TGT.$SRC.structure.idx" ]] && continue
        run "$LOGS/structure-$split.log" posattn-prepare-structure --conllu "$PREPARED/$split.conllu" \
            --bpe "$PREPARED/$split.bpe.$SRC" --destdir "$DATA_BIN" --split "$split" \
            --source-lang $SRC --target-lang $TGT
    done
}

# train_row ROW: one model for Table 1 row ROW in $OUT/checkpoints/rowROW. An interrupted training
# resumes from checkpoint_last.pt; a finished one is skipped (fairseq-train would make one more
# update and overwrite its checkpoints)
train_row() {
    local row="$1" save_dir="$OUT/checkpoints/row$1"
    if [[ -f "$save_dir/trained-updates" && "$(< "$save_dir/trained-updates")" == "$MAX_UPDATE" ]]; then
        echo "    row$row: trained already ($MAX_UPDATE updates)"; return 0
    fi
    # shellcheck disable=SC2086  # ROW_FLAGS and EXTRA_TRAIN_FLAGS are word lists
    run "$LOGS/train-row$row.log" fairseq-train "$DATA_BIN" --user-dir "$USER_DIR" \
        --task translation_structural --source-lang $SRC --target-lang $TGT \
        "${TRAIN_FLAGS[@]}" ${ROW_FLAGS[$row]} "${DEVICE_FLAGS[@]}" $EXTRA_TRAIN_FLAGS \
        --save-dir "$save_dir"
    (( DRY_RUN )) || echo "$MAX_UPDATE" > "$save_dir/trained-updates"
}

# train_step: train_row for every row of $VARIANTS, $JOBS at a time
train_step() {
    stamp "train: rows $VARIANTS, $MAX_UPDATE updates each, $JOBS at a time (logs: $LOGS/train-row*.log)"
    # shellcheck disable=SC2086  # VARIANTS is a word list
    in_parallel train_row $VARIANTS
}
