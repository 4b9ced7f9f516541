#!/usr/bin/env bash
# NIST Chinese->English with structural position representations (Wang et al. 2019, Tables 1 and 2):
# LDC training text -> Chinese word segmentation (stanza) -> cleaned pairs -> Moses + joint BPE ->
# stanza zh dependency parse of the segmented Chinese -> fairseq-preprocess + structural side data ->
# Transformer per variant -> beam search on MT02 (dev) and MT03-MT06 -> 4-reference BLEU tables with
# signatures and paired bootstrap significance against the baseline, one per test set.
#
#     bash examples/nist_zh_en/run.sh [--dry-run] [NIST_DIR]
#
# NIST_DIR (or $NIST_DIR) holds plain-text files you extract from your LDC copies (README.md):
# train.zh / train.en and, per evaluation set, mtXX.zh with its four references mtXX.en0 ... mtXX.en3.
# --dry-run prints every command without running any. Steps whose output exists are skipped.
# Device: the GPUs torch sees (all of them, the batch split over them), else the CPU; PRECISION=fp16,
# bf16 or amp for mixed precision (examples/lib/device.sh).
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
DRY_RUN=0
if [[ "${1:-}" == "--dry-run" ]]; then DRY_RUN=1; shift; fi

# ---- settings ------------------------------------------------------------------------------------
NIST_DIR="${1:-${NIST_DIR:-$REPO_ROOT/nist-raw}}"
OUT="${OUT:-$REPO_ROOT/nist-output}"
TRAIN="${TRAIN:-train}"                 # NIST_DIR/$TRAIN.zh and .en: the LDC training pairs (~1.25M)
DEV="${DEV:-mt02}"                      # validation set (fairseq's valid split)
TESTS="${TESTS:-mt03 mt04 mt05 mt06}"   # test sets (fairseq's test, test1, test2, test3 splits)
N_REFS="${N_REFS:-4}"                   # references per evaluation set: mtXX.en0 .. mtXX.en$((N_REFS - 1))
SEGMENTER="${SEGMENTER:-stanza}"        # stanza: segment with stanza's zh tokenizer; none: *.zh is segmented already
CLEAN_MAX_LEN="${CLEAN_MAX_LEN:-250}"   # drop training pairs longer than this (words, after segmentation)
CLEAN_RATIO="${CLEAN_RATIO:-2.5}"       # ... or whose word-count ratio exceeds this
BPE_MERGES="${BPE_MERGES:-32000}"       # Wang et al.: 32k merge operations
PARSER="${PARSER:-stanza}"              # stanza (zh, GPU when present) or spacy (SPACY_MODEL: a Chinese pipeline)
STANZA_DIR="${STANZA_DIR:-${STANZA_RESOURCES_DIR:-$HOME/stanza_resources}}"
SPACY_MODEL="${SPACY_MODEL:-zh_core_web_sm}"
PARSE_SHARDS="${PARSE_SHARDS:-8}"       # training parse in this many resumable shards
PARSE_SHARD_ID="${PARSE_SHARD_ID:-}"    # set (0-based) to parse only that shard, e.g. one cluster job each
PARSE_WORKERS="${PARSE_WORKERS:-1}"
ARCH="${ARCH:-transformer_posattn_wmt_en_de}"   # Transformer-Base (Table 1); Table 2: transformer_posattn_vaswani_wmt_en_de_big
VARIANTS="${VARIANTS:-4 6 7 9}"         # Table 2: Transformer, +Structural PE, +Rel. Seq. PE, +Structural PE
STEPS="${STEPS:-corpus segment prepare parse binarize structure train generate compare}"
MAX_UPDATE="${MAX_UPDATE:-100000}"
MAX_TOKENS="${MAX_TOKENS:-4096}"
UPDATE_FREQ="${UPDATE_FREQ:-8}"         # steps per update on ONE device: 4096 x 8 tokens = 8 GPUs x 4096
LR="${LR:-7e-4}"
DROPOUT="${DROPOUT:-0.1}"
FUSION="${FUSION:-nonlinear}"
STRUCT_CLIP="${STRUCT_CLIP:-16}"
SEQ_REL_CLIP="${SEQ_REL_CLIP:-16}"
BEAM=4; LENPEN=0.6
SEED="${SEED:-1}"
EXTRA_TRAIN_FLAGS="${EXTRA_TRAIN_FLAGS:-}"   # more fairseq-train flags (precision: PRECISION=fp16|bf16|amp)
# Joint BPE and one dictionary (what posattn-prepare-translation builds) but separate source embeddings:
# Chinese and English share few subwords, so only the decoder's input and output embeddings are tied.
TRAIN_FLAGS=(--arch "$ARCH" --share-decoder-input-output-embed --dropout "$DROPOUT"
             --optimizer adam --adam-betas "(0.9, 0.98)" --clip-norm 0.0 --weight-decay 0.0
             --lr "$LR" --lr-scheduler inverse_sqrt --warmup-updates 4000 --warmup-init-lr 1e-07
             --criterion label_smoothed_cross_entropy --label-smoothing 0.1 --max-update "$MAX_UPDATE"
             --seed "$SEED" --no-epoch-checkpoints --save-interval-updates 5000 --keep-interval-updates 1
             --log-format simple --log-interval 100)
# --------------------------------------------------------------------------------------------------

declare -A ROW_NAME=([4]="transformer" [5]="+struct-abs" [6]="+struct-pe" [7]="+rel-seq-pe"
                     [8]="+rel-seq-pe+struct-abs" [9]="+rel-seq-pe+struct-pe")
source "$REPO_ROOT/examples/lib/structural_recipe.sh"  # Table 1 row flags, run/want/stamp, shared steps
set_parser_args zh
[[ "$SEGMENTER" == stanza || "$SEGMENTER" == none ]] || { echo "run.sh: SEGMENTER must be stanza or none" >&2; exit 2; }

USER_DIR="$REPO_ROOT/fairseq_posattn"
RAW="$OUT/raw"; SEGMENTED="$OUT/segmented"; PREPARED="$OUT/prepared"; DATA_BIN="$OUT/data-bin"; LOGS="$OUT/logs"
SRC=zh; TGT=en
# evaluation sets under fairseq's split names: DEV -> valid, TESTS -> test, test1, test2, ...
declare -A SPLIT_OF=([$DEV]=valid)
EVAL_SETS=("$DEV"); k=0
for set in $TESTS; do
    if (( k == 0 )); then SPLIT_OF[$set]=test; else SPLIT_OF[$set]="test$k"; fi
    EVAL_SETS+=("$set"); k=$((k + 1))
done
SPLITS=(train); for set in "${EVAL_SETS[@]}"; do SPLITS+=("${SPLIT_OF[$set]}"); done
source "$REPO_ROOT/examples/lib/device.sh"  # DEVICE_FLAGS, PRECISION_FLAGS, split_batch
split_batch "$MAX_TOKENS" "$UPDATE_FREQ" tokens  # the same tokens per update on any number of GPUs
TRAIN_FLAGS+=(--max-tokens "$SIZE_PER_DEVICE" --update-freq "$UPDATE_FREQ_PER_DEVICE" "${PRECISION_FLAGS[@]}")

# segment IN OUT: Chinese words separated by spaces (stanza), or IN as it is (SEGMENTER=none)
segment() {
    if [[ "$SEGMENTER" == stanza ]]; then
        python "$REPO_ROOT/examples/nist_zh_en/segment_zh.py" --input "$1" --output "$2" --stanza-dir "$STANZA_DIR"
    else
        cp "$1" "$2"
    fi
}

# one run per OUT (a second one stops here, naming the first); Ctrl-C / SIGTERM stops its jobs too
(( DRY_RUN )) || { lock_output_folder "$OUT"; stop_jobs_with_the_recipe; mkdir -p "$LOGS"; }

# 1. raw splits under fairseq's names; an evaluation set's target side for binarizing is its first
#    reference, BLEU uses all N_REFS
if want corpus; then
    stamp "corpus: $NIST_DIR -> $RAW"
    (( DRY_RUN )) || mkdir -p "$RAW"
    for lang in $SRC $TGT; do
        need "$NIST_DIR/$TRAIN.$lang"
        [[ -f "$RAW/train.$lang" ]] || run "$LOGS/corpus.log" cp "$NIST_DIR/$TRAIN.$lang" "$RAW/train.$lang"
    done
    for set in "${EVAL_SETS[@]}"; do
        split="${SPLIT_OF[$set]}"
        need "$NIST_DIR/$set.$SRC"
        [[ -f "$RAW/$split.$SRC" ]] || run "$LOGS/corpus.log" cp "$NIST_DIR/$set.$SRC" "$RAW/$split.$SRC"
        for ((r = 0; r < N_REFS; r++)); do
            need "$NIST_DIR/$set.$TGT$r"
            [[ -f "$RAW/$split.$TGT$r" ]] || run "$LOGS/corpus.log" cp "$NIST_DIR/$set.$TGT$r" "$RAW/$split.$TGT$r"
        done
        [[ -f "$RAW/$split.$TGT" ]] || run "$LOGS/corpus.log" cp "$RAW/$split.${TGT}0" "$RAW/$split.$TGT"
    done
fi

# 2. Chinese word segmentation of every split; training pairs cleaned afterwards (word counts need words)
if want segment; then
    stamp "segment: $SEGMENTER -> $SEGMENTED"
    (( DRY_RUN )) || mkdir -p "$SEGMENTED"
    for split in "${SPLITS[@]}"; do
        target="$SEGMENTED/$split.$SRC"; [[ "$split" == train ]] && target="$SEGMENTED/train-all.$SRC"
        [[ -f "$target" || -f "$SEGMENTED/$split.$SRC" ]] || run "$LOGS/segment-$split.log" segment "$RAW/$split.$SRC" "$target"
        [[ "$split" == train || -f "$SEGMENTED/$split.$TGT" ]] || run "$LOGS/segment-$split.log" cp "$RAW/$split.$TGT" "$SEGMENTED/$split.$TGT"
    done
    if [[ ! -f "$SEGMENTED/train.$SRC" ]]; then
        run "$LOGS/clean.log" clean_pairs "$SEGMENTED/train-all.$SRC" "$RAW/train.$TGT" "$SEGMENTED/train.$SRC" "$SEGMENTED/train.$TGT"
        (( DRY_RUN )) || { cat "$LOGS/clean.log"; rm "$SEGMENTED/train-all.$SRC"; }
    fi
fi

# 3. Moses tokenization (the segmented Chinese keeps its words, loses attached punctuation) and joint BPE
if want prepare; then
    stamp "prepare: Moses + $BPE_MERGES joint BPE merges -> $PREPARED"
    if [[ -f "$PREPARED/${SPLITS[-1]}.bpe.$TGT" ]]; then echo "    (done already)"; else
        run "$LOGS/prepare.log" posattn-prepare-translation --raw-dir "$SEGMENTED" --out-dir "$PREPARED" \
            --source-lang $SRC --target-lang $TGT --bpe-merges "$BPE_MERGES" --splits "${SPLITS[@]}"
    fi
fi

# 4. dependency parse of the tokenized Chinese, pretokenized: the parse words are the Moses tokens
if want parse; then parse_step; fi

# 5. fairseq-preprocess: --testpref with several prefixes gives the splits test, test1, test2, ...
if want binarize; then
    test_prefixes=()
    for set in $TESTS; do test_prefixes+=("$PREPARED/${SPLIT_OF[$set]}.bpe"); done
    binarize_step "$(IFS=,; echo "${test_prefixes[*]}")"
fi

# 6. structural side data next to the binarized source, same split names
if want structure; then structure_step; fi

# 7. one model per variant, $JOBS at a time (default 1). An interrupted training resumes from
#    checkpoint_last.pt; a finished one is skipped (fairseq-train would make one more update)
if want train; then train_step; fi

# 8. every evaluation set with every model; --required-batch-size-multiple 1 keeps the last batch
if want generate; then
    for row in $VARIANTS; do
        for set in "${EVAL_SETS[@]}"; do
            split="${SPLIT_OF[$set]}"
            stamp "generate: ${ROW_NAME[$row]} on $set ($split)"
            run "$LOGS/generate-row$row-$split.log" fairseq-generate "$DATA_BIN" --user-dir "$USER_DIR" \
                --task translation_structural --source-lang $SRC --target-lang $TGT \
                --path "$OUT/checkpoints/row$row/checkpoint_best.pt" --gen-subset "$split" \
                --beam $BEAM --lenpen $LENPEN --remove-bpe --max-tokens 8000 \
                --required-batch-size-multiple 1 "${DEVICE_FLAGS[@]}" --results-path "$OUT/generate/row$row"
        done
    done
fi

# 9. per evaluation set: case-insensitive BLEU against all references (detokenized sacreBLEU and Moses-
#    tokenized BLEU, as NIST results are usually reported), signatures, paired bootstrap vs the baseline
if want compare; then
    (( DRY_RUN )) || : > "$OUT/results.md"
    for set in "${EVAL_SETS[@]}"; do
        split="${SPLIT_OF[$set]}"
        stamp "compare: $set -> $OUT/results-$set.md"
        refs=()
        for ((r = 0; r < N_REFS; r++)); do refs+=(--ref "$RAW/$split.$TGT$r"); done
        systems=()
        for row in $VARIANTS; do systems+=("${ROW_NAME[$row]}=$OUT/generate/row$row/generate-$split.txt"); done
        run_to "$OUT/results-$set.md" "$LOGS/compare-$set.log" posattn-compare "${refs[@]}" --target-lang $TGT \
            --lowercase --tokenized-bleu --no-compound-split "${systems[@]}"
        (( DRY_RUN )) || printf '## %s\n\n%s\n\n' "$set" "$(cat "$OUT/results-$set.md")" >> "$OUT/results.md"
    done
    (( DRY_RUN )) || cat "$OUT/results.md"
fi
stamp "done"
