#!/usr/bin/env bash
# Multi30k English->German with structural position representations (Wang et al. 2019, Table 1):
# Moses + joint BPE -> spaCy dependency parse of the English side -> fairseq-preprocess -> structural
# side data -> one model per Table 1 row -> beam search on test_2016_flickr -> sacreBLEU table with
# paired bootstrap significance against the baseline (row 4).
#
#     bash examples/multi30k_en_de/run.sh [--dry-run] [MULTI30K_DIR]
#
# MULTI30K_DIR (or $MULTI30K_DIR) holds the raw gzipped Multi30k task-1 files train.{en,de}.gz,
# val.{en,de}.gz, test_2016_flickr.{en,de}.gz; default ../shared/data/multi30k next to the repository.
# Settings below can be overridden from the environment (PRESET=paper VARIANTS="4 5 6 7 9" ...); see
# README.md. Steps whose output exists are skipped: delete $OUT (or a step's output) to redo them.
# Device: the GPUs torch sees (all of them, the batch split over them), else the CPU; PRECISION=fp16,
# bf16 or amp for mixed precision (examples/lib/device.sh).
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
DRY_RUN=0
if [[ "${1:-}" == "--dry-run" ]]; then DRY_RUN=1; shift; fi

# ---- settings ------------------------------------------------------------------------------------
DATA="${1:-${MULTI30K_DIR:-$(dirname "$REPO_ROOT")/shared/data/multi30k}}"
OUT="${OUT:-$REPO_ROOT/multi30k-output}"
PREP_OUT="${PREP_OUT:-$OUT}"          # raw/, prepared/, data-bin/: one prepared copy can serve several OUTs
PRESET="${PRESET:-small}"            # small: 21 min on 2 idle CPU cores; paper: transformer_posattn_iwslt_de_en, GPU
VARIANTS="${VARIANTS:-4 5 6}"        # Table 1 rows (or sequential methods below) to train, the first is the baseline
STEPS="${STEPS:-prepare parse binarize structure train generate compare}"
FUSION="${FUSION:-nonlinear}"        # absolute structural + sequential: the paper's non-linear fusion (Eq. 7)
STRUCT_CLIP="${STRUCT_CLIP:-16}"     # r, relative structural clip (paper: 16)
SEQ_REL_CLIP="${SEQ_REL_CLIP:-16}"   # k, Shaw's relative sequential clip (rows 7-9)
BPE_MERGES="${BPE_MERGES:-5000}"
SEED="${SEED:-1}"
BEAM=5
GEN_SUBSETS="${GEN_SUBSETS:-test}"   # splits to translate: test (test_2016_flickr) and/or valid
UPDATE_FREQ="${UPDATE_FREQ:-1}"      # steps per update on ONE device: MAX_TOKENS x UPDATE_FREQ tokens per update
EXTRA_TRAIN_FLAGS="${EXTRA_TRAIN_FLAGS:-}"   # more fairseq-train flags (precision: PRECISION=fp16|bf16|amp)
case "$PRESET" in
    small)  # 3+3 layers, 128 dim: 1,500 updates of 2,048 tokens (5.5 epochs) per model, 3 models at once
        MODEL_FLAGS=(--arch transformer_posattn --encoder-layers 3 --decoder-layers 3
                     --encoder-embed-dim 128 --decoder-embed-dim 128
                     --encoder-ffn-embed-dim 512 --decoder-ffn-embed-dim 512
                     --encoder-attention-heads 4 --decoder-attention-heads 4 --dropout 0.1)
        MAX_UPDATE="${MAX_UPDATE:-1500}"; MAX_TOKENS="${MAX_TOKENS:-2048}"
        LR=1e-3; WARMUP=500
        JOBS="${JOBS:-3}"; THREADS="${THREADS:-1}"   # single-threaded models side by side beat one 2-thread model
        ;;
    paper)  # Transformer of fairseq's IWSLT preset (6+6 layers, 512 dim), long training: meant for a GPU
        MODEL_FLAGS=(--arch transformer_posattn_iwslt_de_en --dropout 0.3)
        MAX_UPDATE="${MAX_UPDATE:-30000}"; MAX_TOKENS="${MAX_TOKENS:-4096}"
        LR=5e-4; WARMUP=4000
        JOBS="${JOBS:-1}"; THREADS="${THREADS:-}"
        ;;
    *) echo "run.sh: PRESET must be small or paper, got '$PRESET'" >&2; exit 2 ;;
esac
TRAIN_FLAGS=("${MODEL_FLAGS[@]}" --optimizer adam --adam-betas "(0.9, 0.98)" --clip-norm 0.0 --weight-decay 0.0001
             --lr "$LR" --lr-scheduler inverse_sqrt --warmup-updates "$WARMUP" --warmup-init-lr 1e-07
             --criterion label_smoothed_cross_entropy --label-smoothing 0.1
             --max-update "$MAX_UPDATE" --seed "$SEED"
             --share-all-embeddings --max-source-positions 128 --max-target-positions 128
             --no-epoch-checkpoints --log-format simple --log-interval 100)
# --------------------------------------------------------------------------------------------------

# Table 1 rows offered, with their names (flags: examples/lib/structural_recipe.sh), and the
# sequential methods on the same recipe (no structure): DA-Transformer and Transformer-RPR on both
# sides, Dufter et al.'s SAN+P+R, +Conv2d and +Temp on the encoder
declare -A ROW_NAME=([1]="1:none" [2]="2:struct-abs" [3]="3:struct-rel" [4]="4:seq-abs"
                     [5]="5:seq-abs+struct-abs" [6]="6:seq-abs+struct-abs+rel" [7]="7:seq-abs+rel"
                     [8]="8:seq-abs+rel+struct-abs" [9]="9:seq-abs+rel+struct-abs+rel"
                     [da]="da:DA-Transformer" [rpr]="rpr:Transformer-RPR" [pr]="pr:SAN+P+R"
                     [conv2d]="conv2d:+Conv2d" [temp]="temp:+Temp")
declare -A EXTRA_ROW_FLAGS=(
    [da]="--encoder-distance-aware --decoder-distance-aware"
    [rpr]="--encoder-relative-positions $SEQ_REL_CLIP --decoder-relative-positions $SEQ_REL_CLIP"
    [pr]="--encoder-no-token-positional-embeddings --encoder-direct-position both"
    [conv2d]="--encoder-conv-attention 2d"
    [temp]="--encoder-learnable-temperature"
)
source "$REPO_ROOT/examples/lib/structural_recipe.sh"  # Table 1 row flags, run/want/stamp, shared steps

USER_DIR="$REPO_ROOT/fairseq_posattn"
RAW="$PREP_OUT/raw"; PREPARED="$PREP_OUT/prepared"; DATA_BIN="$PREP_OUT/data-bin"; LOGS="$OUT/logs"
SRC=en; TGT=de
SPLITS=(train valid test)
declare -A RAW_NAME=([train]=train [valid]=val [test]=test_2016_flickr)
[[ -n "$THREADS" ]] && export OMP_NUM_THREADS="$THREADS" MKL_NUM_THREADS="$THREADS"
if (( DRY_RUN )); then JOBS=1; fi
source "$REPO_ROOT/examples/lib/device.sh"  # DEVICE_FLAGS, PRECISION_FLAGS, split_batch
split_batch "$MAX_TOKENS" "$UPDATE_FREQ" tokens  # the same tokens per update on any number of GPUs
TRAIN_FLAGS+=(--max-tokens "$SIZE_PER_DEVICE" --update-freq "$UPDATE_FREQ_PER_DEVICE" "${PRECISION_FLAGS[@]}")

tag() { echo "row$1"; }

# one run per OUT (a second one stops here, naming the first); Ctrl-C / SIGTERM stops its jobs too
(( DRY_RUN )) || { lock_output_folder "$OUT"; stop_jobs_with_the_recipe; mkdir -p "$LOGS"; }

# 1. raw text: gunzip Multi30k into train/valid/test.{en,de}; Moses tokenization and joint BPE
if want prepare; then
    stamp "prepare: $DATA -> $PREPARED (Moses + $BPE_MERGES joint BPE merges)"
    if [[ -f "$PREPARED/test.bpe.$TGT" ]]; then echo "    (done already)"; else
        (( DRY_RUN )) || mkdir -p "$RAW"
        for split in "${SPLITS[@]}"; do
            for lang in $SRC $TGT; do
                src_file="$DATA/${RAW_NAME[$split]}.$lang.gz"
                (( DRY_RUN )) || [[ -f "$src_file" ]] || { echo "run.sh: no $src_file (pass the Multi30k folder)" >&2; exit 1; }
                run_to "$RAW/$split.$lang" "$LOGS/gunzip.log" gunzip -c "$src_file"
            done
        done
        run "$LOGS/prepare.log" posattn-prepare-translation --raw-dir "$RAW" --out-dir "$PREPARED" \
            --source-lang $SRC --target-lang $TGT --bpe-merges "$BPE_MERGES" --splits "${SPLITS[@]}"
    fi
fi

# 2. dependency parse of the tokenized English (the words BPE splits) with spaCy's English model
PARSER_ARGS=(--backend spacy --workers "$CORES")
if want parse; then parse_step; fi

# 3. fairseq-preprocess: joint dictionary, binarized train/valid/test
if want binarize; then binarize_step "$PREPARED/test.bpe"; fi

# 4. structural side data (tree depth per BPE piece + EOS) next to the binarized source
if want structure; then structure_step; fi

# 5. one model per Table 1 row (train_row), $JOBS at a time
if want train; then
    train_step
    (( DRY_RUN )) || for row in $VARIANTS; do
        echo "    $(tag "$row"): $(grep -E '\| valid \|' "$LOGS/train-$(tag "$row").log" | tail -n 1 | grep -oE 'loss [0-9.]+ .*ppl [0-9.]+')"
    done
fi

# 6. beam search on test_2016_flickr (and valid with GEN_SUBSETS="valid test"); --required-batch-size-multiple 1
#    or fairseq drops the last batch
generate_row() {
    local row="$1" subset log
    for subset in $GEN_SUBSETS; do
        log="$LOGS/generate-$(tag "$row").log"
        [[ "$subset" == test ]] || log="$LOGS/generate-$subset-$(tag "$row").log"
        run "$log" fairseq-generate "$DATA_BIN" --user-dir "$USER_DIR" \
            --task translation_structural --source-lang $SRC --target-lang $TGT \
            --path "$OUT/checkpoints/$(tag "$row")/checkpoint_best.pt" --gen-subset "$subset" \
            --beam $BEAM --max-len-a 1.5 --max-len-b 10 --remove-bpe \
            --batch-size 128 --required-batch-size-multiple 1 "${DEVICE_FLAGS[@]}" \
            --results-path "$OUT/generate/$(tag "$row")"
    done
}
if want generate; then
    stamp "generate: $GEN_SUBSETS, beam $BEAM"
    # shellcheck disable=SC2086
    in_parallel generate_row $VARIANTS
fi

# 7. sacreBLEU with signatures, bootstrap 95% CI and paired bootstrap p-values against the first row
if want compare; then
    stamp "compare: posattn-compare -> $OUT/results.md"
    systems=()
    for row in $VARIANTS; do systems+=("${ROW_NAME[$row]}=$OUT/generate/$(tag "$row")/generate-test.txt"); done
    run_to "$OUT/results.md" "$LOGS/compare.log" posattn-compare --ref "$RAW/test.$TGT" --target-lang $TGT \
        "${systems[@]}"
    # the paper's own comparison for rows 7-9: structural positions on top of relative sequential ones
    if [[ " $VARIANTS " == *" 7 "* && " $VARIANTS " == *" 9 "* ]]; then
        run_to "$OUT/results-rel.md" "$LOGS/compare-rel.log" posattn-compare --ref "$RAW/test.$TGT" \
            --target-lang $TGT "${ROW_NAME[7]}=$OUT/generate/row7/generate-test.txt" \
            "${ROW_NAME[9]}=$OUT/generate/row9/generate-test.txt"
    fi
    (( DRY_RUN )) || cat "$OUT/results.md" "$OUT"/results-rel.md 2>/dev/null || true
fi
stamp "done"
