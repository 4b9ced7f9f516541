#!/usr/bin/env bash
# WikiText-2 / WikiText-103: the same steps as run_ptb.sh (preprocess --only-source, train every
# model with the same budget, fairseq-eval-lm in fresh processes, results table), on
# word-level WikiText (wiki.{train,valid,test}.tokens).
#
#   WIKITEXT_DIR=/path/to/wikitext-2 bash examples/language_model/run_wikitext.sh
#   WIKITEXT=103 WIKITEXT_DIR=/path/to/wikitext-103 bash examples/language_model/run_wikitext.sh
#   WIKITEXT=2 DOWNLOAD=1 bash examples/language_model/run_wikitext.sh   # only where the internet is reachable
#
# WikiText lines are paragraphs (often longer than any sensible position table), so this runs in
# block mode: the text is one stream cut into blocks of TOKENS_PER_SAMPLE tokens (each line's end
# is an end-of-sentence token and is scored like every other token).  Every setting of run_ptb.sh
# can be overridden the same way (MODELS, MAX_UPDATE, BATCH_SIZE, sizes, ...).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
WIKITEXT=${WIKITEXT:-2}                                   # 2 or 103
WIKITEXT_DIR=${WIKITEXT_DIR:-}                            # folder with wiki.{train,valid,test}.tokens
DOWNLOAD=${DOWNLOAD:-0}                                   # 1: fetch it (needs the internet; optional)
export OUT=${OUT:-$REPO/wikitext$WIKITEXT-lm-output}
export BREAK_MODE=${BREAK_MODE:-none}
export TOKENS_PER_SAMPLE=${TOKENS_PER_SAMPLE:-256}
export MAX_TARGET_POSITIONS=${MAX_TARGET_POSITIONS:-$TOKENS_PER_SAMPLE}
export BATCH_SIZE=${BATCH_SIZE:-16}
export EVAL_MAX_TOKENS=${EVAL_MAX_TOKENS:-$((TOKENS_PER_SAMPLE * 16))}
source "$REPO/examples/lib/device.sh"  # the device check, before the download and copies (run_ptb.sh's again)

download_wikitext() {
    # Optional: never needed when WIKITEXT_DIR is given.  The original Salesforce archive.
    local url="https://s3.amazonaws.com/research.metamind.io/wikitext/wikitext-$WIKITEXT-v1.zip"
    mkdir -p "$OUT/download"
    if ! (cd "$OUT/download" && { wget -q "$url" || curl -fsSLO "$url"; } && unzip -qo "wikitext-$WIKITEXT-v1.zip"); then
        echo "could not download $url: give WIKITEXT_DIR=/path/to/wikitext-$WIKITEXT instead" >&2
        exit 1
    fi
    WIKITEXT_DIR="$OUT/download/wikitext-$WIKITEXT"
}

if [ -z "$WIKITEXT_DIR" ]; then
    if [ "$DOWNLOAD" = 1 ]; then download_wikitext
    else echo "set WIKITEXT_DIR=/path/to/wikitext-$WIKITEXT (wiki.{train,valid,test}.tokens) or DOWNLOAD=1" >&2; exit 1; fi
fi

# run_ptb.sh takes {train,valid,test}.txt from its PTB_DIR
mkdir -p "$OUT/raw"
for split in train valid test; do
    src="$WIKITEXT_DIR/wiki.$split.tokens"
    [ -f "$src" ] || { echo "missing $src" >&2; exit 1; }
    # copied under a temporary name of this process's own and renamed once complete: a copy cut short is never
    # read as the split
    if [ ! -s "$OUT/raw/$split.txt" ]; then
        cp "$src" "$OUT/raw/$split.txt.part$$"
        mv "$OUT/raw/$split.txt.part$$" "$OUT/raw/$split.txt"
    fi
done
PTB_DIR="$OUT/raw" exec bash "$HERE/run_ptb.sh"
