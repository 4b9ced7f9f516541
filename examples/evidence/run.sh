#!/usr/bin/env bash
# The evidence runs: Multi30k translation, PTB language models, UD English-EWT tagging, SST-2
# classification and length extrapolation on PTB, several seeds each, the same budget per task, then docs/results.md regenerated
# from their logs (examples/evidence/results.py).  See the top of docs/results.md.
#
#   nohup bash examples/evidence/run.sh > evidence.log 2>&1 &     # start, or resume after an interruption
#   kill -TERM <its pid>                                          # stop cleanly (running recipes are resumed later)
#   TASKS="tagging classification" JOBS=2 bash examples/evidence/run.sh
#   bash examples/evidence/run.sh plan | status | progress        # the runs and their commands / state / time per epoch
#
# Settings (environment): TASKS, SEEDS or <TASK>_SEEDS, <TASK>_SYSTEMS, TAG_SETS, TRANSLATION_MAX_UPDATE,
# LM_EPOCHS, LM_LSTM_LR, TAGGING_PATIENCE, TAGGING_MAX_EPOCH, CLASSIFICATION_MAX_UPDATE, EXTRAPOLATION_MAX_UPDATE,
# EXTRAPOLATION_LSTM_MAX_UPDATE, EXTRAPOLATION_MULTIPLIERS, MAX_UPDATE (cap, smoke runs), JOBS, THREADS, EVIDENCE_OUT
# and the data folders MULTI30K_DIR, PTB_DIR, EWT (or EWT_TRAIN and EWT_DEV), SST2 (examples/evidence/evidence_plan.py).
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
[[ -x "$REPO/.venv/bin/python" ]] && export PATH="$REPO/.venv/bin:$PATH"
action=run
case "${1:-}" in plan|run|status|progress) action=$1; shift ;; esac
if [[ "$action" == run ]]; then
    source "$REPO/examples/lib/device.sh"  # the recipes' device check, before the first run starts
fi
exec python "$REPO/examples/evidence/evidence.py" "$action" "$@"
