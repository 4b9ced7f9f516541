#!/usr/bin/env bash
# Quickstart: Multi30k en->de sample -> Moses + joint BPE -> spaCy parse of the English side ->
# fairseq-preprocess + structural side data -> two small transformer_posattn models (a sequential
# variant: direct positions + learnable temperature; a structural variant: Wang et al.'s structural
# positions) -> beam search on test -> sacreBLEU with signatures.
#
# Run from the repository root with the virtualenv's bin first on PATH (`make quickstart` does both):
#     PATH="$PWD/.venv/bin:$PATH" bash examples/quickstart/run.sh
# About 10 minutes on 2 idle CPU cores; everything goes to quickstart-output/ (rebuilt on every run).
# On a busy machine, OMP_NUM_THREADS=1 is faster than fighting for both cores. Where torch sees a GPU
# the models train there (on every GPU it sees, the batch split over them); PRECISION=fp16, bf16 or amp
# turns on mixed precision (examples/lib/device.sh).
set -euo pipefail

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
# name -> position flags; each model is trained with the same budget
declare -A VARIANTS=(
    [sequential]="--encoder-direct-position both --encoder-learnable-temperature"
    [structural]="--encoder-structural-positions both --encoder-structural-fusion nonlinear"
)
# Fixed training budget per model: about 4-5 minutes on 2 idle CPU cores (~3.5-4 updates/s).
MAX_UPDATE=${MAX_UPDATE:-1000}
TRAIN_FLAGS=(
    --optimizer adam --adam-betas "(0.9, 0.98)" --clip-norm 0.0
    --lr 1e-3 --lr-scheduler inverse_sqrt --warmup-updates 400 --warmup-init-lr 1e-7
    --criterion label_smoothed_cross_entropy --label-smoothing 0.1 --weight-decay 0.0001
    --max-update "$MAX_UPDATE" --seed 1
)
MAX_TOKENS=4096   # tokens per update, whatever the number of GPUs
SRC=en
TGT=de
BPE_MERGES=2000
RAW=data/multi30k_sample
OUT=quickstart-output
# -------------------------------------------------------------------------------------------------

cd "$(dirname "${BASH_SOURCE[0]}")/../.."
REPO_ROOT="$(pwd)"
USER_DIR="$REPO_ROOT/fairseq_posattn"
source examples/lib/device.sh  # DEVICE_FLAGS (--cpu without a GPU), PRECISION_FLAGS, split_batch
split_batch "$MAX_TOKENS" 1 tokens
TRAIN_FLAGS+=(--max-tokens "$SIZE_PER_DEVICE" --update-freq "$UPDATE_FREQ_PER_DEVICE" "${PRECISION_FLAGS[@]}")

for tool in fairseq-preprocess fairseq-train fairseq-generate posattn-prepare-translation posattn-parse \
    posattn-prepare-structure posattn-score; do
    command -v "$tool" >/dev/null || {
        echo "quickstart: '$tool' not on PATH: run 'make install', then PATH=\"\$PWD/.venv/bin:\$PATH\" bash $0" >&2
        exit 1
    }
done

PREPARED="$OUT/prepared"
DATA_BIN="$OUT/data-bin"
# Rebuilt from scratch: fairseq-preprocess refuses an existing dictionary and fairseq-train would
# resume from an old checkpoint_last.pt and stop at once.
rm -rf "$PREPARED" "$DATA_BIN" "$OUT"/checkpoints* "$OUT"/generate-* "$OUT"/test.detok.*
mkdir -p "$OUT"
start=$SECONDS
stamp() { echo "==> [$((SECONDS - start)) s] $*"; }

stamp "1/6 tokenize + joint BPE ($BPE_MERGES merges) -> $PREPARED"
posattn-prepare-translation \
    --raw-dir "$RAW" --out-dir "$PREPARED" --source-lang "$SRC" --target-lang "$TGT" \
    --bpe-merges "$BPE_MERGES" --splits train valid test

stamp "2/6 fairseq-preprocess -> $DATA_BIN"
fairseq-preprocess --source-lang "$SRC" --target-lang "$TGT" \
    --trainpref "$PREPARED/train.bpe" --validpref "$PREPARED/valid.bpe" --testpref "$PREPARED/test.bpe" \
    --destdir "$DATA_BIN" --joined-dictionary --workers 2 > "$OUT/preprocess.log"
tail -n 3 "$OUT/preprocess.log"

stamp "3/6 parse the tokenized English with spaCy, then structural side data next to $DATA_BIN"
for split in train valid test; do
    posattn-parse --backend spacy --input "$PREPARED/$split.tok.$SRC" --output "$PREPARED/$split.conllu" \
        2> "$OUT/parse-$split.log"
    posattn-prepare-structure --conllu "$PREPARED/$split.conllu" --bpe "$PREPARED/$split.bpe.$SRC" \
        --destdir "$DATA_BIN" --split "$split" --source-lang "$SRC" --target-lang "$TGT" 2>&1 | tail -n 1
done

declare -A BLEU
for name in sequential structural; do
    read -r -a position_flags <<< "${VARIANTS[$name]}"
    checkpoints="$OUT/checkpoints-$name"
    stamp "4/6 fairseq-train $name: $MAX_UPDATE updates (${VARIANTS[$name]}; log: $OUT/train-$name.log)"
    fairseq-train "$DATA_BIN" --user-dir "$USER_DIR" --task translation_structural \
        --source-lang "$SRC" --target-lang "$TGT" \
        "${SIZE_FLAGS[@]}" "${position_flags[@]}" "${TRAIN_FLAGS[@]}" \
        --save-dir "$checkpoints" --no-epoch-checkpoints \
        --log-format simple --log-interval 100 "${DEVICE_FLAGS[@]}" > "$OUT/train-$name.log" 2>&1 \
        || { tail -n 40 "$OUT/train-$name.log" >&2; exit 1; }
    grep -E "\| valid \|" "$OUT/train-$name.log" | tail -n 1

    stamp "5/6 fairseq-generate $name on test (beam 5) -> $OUT/generate-$name.txt"
    # --required-batch-size-multiple 1: otherwise fairseq-generate silently drops the last batch.
    fairseq-generate "$DATA_BIN" --user-dir "$USER_DIR" --task translation_structural \
        --source-lang "$SRC" --target-lang "$TGT" \
        --path "$checkpoints/checkpoint_best.pt" --gen-subset test \
        --beam 5 --remove-bpe --required-batch-size-multiple 1 --batch-size 64 "${DEVICE_FLAGS[@]}" \
        > "$OUT/generate-$name.txt" 2> "$OUT/generate-$name.log" \
        || { tail -n 40 "$OUT/generate-$name.log" >&2; exit 1; }

    stamp "6/6 sacreBLEU ($name, detokenized) against $RAW/test.$TGT"
    posattn-score "$OUT/generate-$name.txt" --ref "$RAW/test.$TGT" --target-lang "$TGT" \
        --write-detok "$OUT/test.detok-$name.$TGT" 2> "$OUT/score-$name.log" \
        || { cat "$OUT/score-$name.log" >&2; exit 1; }
done
stamp "done"
