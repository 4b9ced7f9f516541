# Printing the commands of the recipes that run them inline (language_model/run_ptb.sh,
# pos_tagging/run.sh, sentence_classification/run.sh): every fairseq command is printed before it
# runs, and with --dry-run (DRY_RUN=1) it is only printed. tests/test_hydra_configs.py reads these
# lines to check that the shipped fairseq-hydra-train configs train what the recipes train.

# show CMD...: print CMD on one line, quoted as a shell reads it back
show() { printf '+'; printf ' %q' "$@"; printf '\n'; }
