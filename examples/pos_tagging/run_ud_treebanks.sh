#!/usr/bin/env bash
# The 47 UD v2.2 treebanks of Dufter et al. (2020, Table 2c/2d): run.sh on each, then the macro mean
# over treebanks of each variant's all-word accuracy (test set where the treebank has one).
#
#   bash examples/pos_tagging/run_ud_treebanks.sh /path/to/ud-treebanks-v2.2
#
# UD_ROOT holds the UD_<Language>-<Name> folders of the release (CoNLL 2018 shared task data).
# Every setting of run.sh (VARIANTS, SEEDS, MAX_UPDATE, ...) applies to each treebank; a finished
# treebank is skipped on a re-run.  TREEBANKS limits the loop, e.g. TREEBANKS="English-GUM Dutch-Alpino".
# A treebank whose run.sh fails is named, the others go on, the table holds those that finished, and the
# script exits 1.  One run per OUT_ROOT (a lock); Ctrl-C or SIGTERM stops the treebank's run.sh with it.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
UD_ROOT=${1:?usage: run_ud_treebanks.sh UD_ROOT (the folder of UD_* treebank folders)}
OUT_ROOT=${OUT_ROOT:-$REPO/pos-tagging-ud-output}
VARIANTS=${VARIANTS:-"pe_add p_r temp conv conv2d"}
export VARIANTS
source "$REPO/examples/pos_tagging/variants.sh"
source "$REPO/examples/lib/device.sh"  # GPUS checked against the devices torch sees, once for every treebank
source "$REPO/examples/lib/workers.sh" # lock_output_folder, stop_jobs_with_the_recipe
export GPUS
# Dufter et al.'s list (Table 2d), written as UD folder names without the UD_ prefix
PAPER_TREEBANKS="Afrikaans-AfriBooms Ancient_Greek-PROIEL Ancient_Greek-Perseus Arabic-PADT Basque-BDT
Bulgarian-BTB Chinese-GSD Croatian-SET Czech-CAC Czech-FicTree Danish-DDT Dutch-Alpino Dutch-LassySmall
English-GUM English-LinES Estonian-EDT Finnish-FTB Finnish-TDT French-GSD French-Sequoia French-Spoken
German-GSD Gothic-PROIEL Greek-GDT Hebrew-HTB Hindi-HDTB Hungarian-Szeged Korean-Kaist Latin-ITTB
Latin-PROIEL Norwegian-Bokmaal Norwegian-Nynorsk Old_Church_Slavonic-PROIEL Old_French-SRCMF
Persian-Seraji Polish-LFG Polish-SZ Portuguese-Bosque Serbian-SET Slovak-SNK Slovenian-SSJ
Spanish-AnCora Swedish-LinES Swedish-Talbanken Ukrainian-IU Urdu-UDTB Vietnamese-VTB"
TREEBANKS=${TREEBANKS:-$PAPER_TREEBANKS}

one_file() {  # one_file DIR SPLIT: the treebank's *-ud-SPLIT.conllu, or nothing
    local found=("$1"/*-ud-"$2".conllu)
    [[ -f "${found[0]}" ]] && echo "${found[0]}"
}

has_treebank() {  # has_treebank NAME: UD_ROOT/UD_NAME holds a training and a dev file
    [[ -n "$(one_file "$UD_ROOT/UD_$1" train)" && -n "$(one_file "$UD_ROOT/UD_$1" dev)" ]]
}
found=0
for treebank in $TREEBANKS; do has_treebank "$treebank" && { found=1; break; }; done
if (( ! found )); then
    echo "run_ud_treebanks.sh: error: no treebank in $UD_ROOT: none of the $(wc -w <<< "$TREEBANKS") treebanks" \
         "of TREEBANKS has a folder UD_<name> there with *-ud-train.conllu and *-ud-dev.conllu. Give the folder" \
         "that holds the UD_* folders of the UD v2.2 release (ud-treebanks-v2.2), or set TREEBANKS to treebanks" \
         "it holds" >&2
    exit 1
fi

lock_output_folder "$OUT_ROOT"
stop_jobs_with_the_recipe  # run.sh runs as a job: Ctrl-C or SIGTERM stops it (and its trainings) first
done_list=() failed_list=()
for treebank in $TREEBANKS; do
    dir="$UD_ROOT/UD_$treebank"
    train=$(one_file "$dir" train || true) dev=$(one_file "$dir" dev || true) test=$(one_file "$dir" test || true)
    if [[ -z "$train" || -z "$dev" ]]; then
        echo "skip $treebank: no *-ud-train.conllu and *-ud-dev.conllu in $dir" >&2
        continue
    fi
    echo "== $treebank"
    status=0
    OUT="$OUT_ROOT/$treebank" bash "$REPO/examples/pos_tagging/run.sh" "$train" "$dev" $test > /dev/null &
    wait $! || status=$?
    if (( status )); then failed_list+=("$treebank"); else done_list+=("$treebank"); fi
done
if (( ${#done_list[@]} == 0 )); then
    echo "run_ud_treebanks.sh: error: no treebank finished (${failed_list[*]} failed, each named above)" >&2; exit 1
fi

table=()
for variant in $VARIANTS; do table+=(--variant "${VARIANT_NAME[$variant]}=runs/$variant"); done
python "$REPO/examples/pos_tagging/results_table.py" --treebank-root "$OUT_ROOT" --treebanks "${done_list[@]}" \
    "${table[@]}" | tee "$OUT_ROOT/results.md"
if (( ${#failed_list[@]} )); then
    echo "run_ud_treebanks.sh: error: ${#failed_list[@]} treebank(s) did not finish: ${failed_list[*]} (each named" \
         "above; the table holds the others): run the same command again to carry on" >&2
    exit 1
fi
