# Printing the commands of the recipes that run them inline (language_model/run_ptb.sh,
# pos_tagging/run.sh, sentence_classification/run.sh): every fairseq command is printed before it
# runs, and with --dry-run (DRY_RUN=1) it is only printed. tests/test_hydra_configs.py reads these
# lines to check that the shipped fairseq-hydra-train configs train what the recipes train.
# Also the loop of the recipes that train variants x seeds (pos_tagging, sentence_classification).

# show CMD...: print CMD on one line, quoted as a shell reads it back
show() { printf '+'; printf ' %q' "$@"; printf '\n'; }

# for_each_run FUNC: FUNC VARIANT SEED for every variant of $VARIANTS and seed of $SEEDS, $PARALLEL at a
# time; a failed run is reported (its folder: $OUT/runs/VARIANT/seedSEED) and the others go on. With
# --dry-run one after the other, in order, so that the printed commands read as a script.
for_each_run() {
    local fn="$1" variant seed running=0
    for variant in $VARIANTS; do
        for seed in $SEEDS; do
            if (( DRY_RUN )); then "$fn" "$variant" "$seed"; continue; fi
            ( "$fn" "$variant" "$seed" || echo "FAILED $variant seed $seed (see $OUT/runs/$variant/seed$seed)" ) &
            running=$((running + 1))
            if (( running >= PARALLEL )); then wait -n; running=$((running - 1)); fi
        done
    done
    wait
}
