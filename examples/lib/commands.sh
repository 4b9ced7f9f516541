# Printing the commands of the recipes that run them inline (language_model/run_ptb.sh,
# pos_tagging/run.sh, sentence_classification/run.sh): every fairseq command is printed before it
# runs, and with --dry-run (DRY_RUN=1) it is only printed. tests/test_hydra_configs.py reads these
# lines to check that the shipped fairseq-hydra-train configs train what the recipes train.
# Also the loop of the recipes that train variants x seeds (pos_tagging, sentence_classification), on the
# background jobs of examples/lib/workers.sh (sourced here).

source "$(dirname "${BASH_SOURCE[0]}")/workers.sh"

# show CMD...: print CMD on one line, quoted as a shell reads it back
show() { printf '+'; printf ' %q' "$@"; printf '\n'; }

# for_each_run FUNC: FUNC VARIANT SEED for every variant of $VARIANTS and seed of $SEEDS, $PARALLEL at a
# time; a failed run is reported (its folder: $OUT/runs/VARIANT/seedSEED), the others go on, and the status
# is 1 (FAILED_JOBS: how many failed). With --dry-run one after the other, in order, so that the printed
# commands read as a script.
for_each_run() {
    local fn="$1" variant seed
    for variant in $VARIANTS; do
        for seed in $SEEDS; do
            if (( DRY_RUN )); then "$fn" "$variant" "$seed"; continue; fi
            start_job "$PARALLEL" named_run "$fn" "$variant" "$seed"
        done
    done
    (( DRY_RUN )) || wait_jobs
}

# named_run FUNC VARIANT SEED: FUNC VARIANT SEED, named with its folder if it fails
named_run() {
    "$1" "$2" "$3" || { echo "FAILED $2 seed $3 (see $OUT/runs/$2/seed$3)"; return 1; }
}
