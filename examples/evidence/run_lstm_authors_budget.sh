#!/usr/bin/env bash
# The three PTB LSTM language models at the authors' budget, 2 seeds: six trainings side by side through the
# evidence runner, then docs/results.md regenerated. The systems (examples/evidence/evidence_plan.py) are
# lstm_lm_authors, attentive_lstm_lm_authors and positional_attentive_lstm_lm_authors: run_ptb.sh's lstm_lm,
# attentive_lstm_lm (Salton et al.) and positional_attentive_lstm_lm (Dagan) at Dagan's sizes with the authors'
# schedule (SGD lr 30, weight decay 1.2e-6, lr x 0.5 after 5 epochs without a lower valid loss (Salton's: 6),
# clip-norm 0.25 on the gradient per sentence), batch 32, 40 epochs, their initialisation and eps (the
# defaults). See docs/gpu_check.md, "The PTB LSTMs at the authors' budget": about 35 minutes on one H200.
#
#   bash examples/evidence/run_lstm_authors_budget.sh [--dry-run] [DEST]
#
#   --dry-run  print the six runs, their status and exact commands (the runner's plan); run nothing
#   DEST       a folder (a GPU machine's $OUT) that receives, kept up to date while the runs go on:
#              records.tar.gz   the runs recorded so far (tar -xzf DEST/records.tar.gz -C examples/evidence/records)
#              logs.tar.gz      every run's training logs so far, evaluations and recipe.log
#              run_lstm_authors_budget.log  all this script prints (the time per epoch of every run)
#              results.md       the page, if it could be regenerated there
#
# Device: whatever run_ptb.sh picks (examples/lib/device.sh): all the GPUs torch sees, else the CPU. JOBS
# (default: 6, all at once, with a GPU; 2 on a CPU, about two days) and THREADS (default 1: on a GPU each
# training's CPU work is one Python thread) as for the runner; PTB_DIR, EVIDENCE_OUT and MAX_UPDATE (a cap, for
# a smoke run: its runs are recorded under another budget) as well; RESULTS_PAGE: where the page goes (default
# docs/results.md, or results.md inside EVIDENCE_RECORDS when that names another folder; its pictures beside
# it, in images/results/). Resumable: the same command again skips
# the recorded runs and resumes the others from their checkpoint_last.pt (on the same machine; elsewhere they
# start again). Stop it with kill -TERM <its pid>: the runner stops its trainings and marks them interrupted.
# SYSTEMS: fewer of the three (a shorter session: "attentive_lstm_lm_authors positional_attentive_lstm_lm_authors"
# are the four trainings of Dagan's main claim); LM_SEEDS as for the runner.
# Every POLL seconds (default 30) it reports, per training, the time per epoch as soon as it is known (an
# estimate from the first 100 updates, then the measured epochs) and what that makes for the whole set.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
[[ -x "$REPO/.venv/bin/python" ]] && export PATH="$REPO/.venv/bin:$PATH"
PYTHON=${PYTHON:-$(command -v python || command -v python3)}
DRY_RUN=0
if [[ "${1:-}" == "--dry-run" ]]; then DRY_RUN=1; shift; fi
DEST=${1:-}
POLL=${POLL:-30}
# the page of the records these runs go to: docs/results.md, or results.md inside EVIDENCE_RECORDS elsewhere
RESULTS_PAGE=${RESULTS_PAGE:-$(cd "$REPO/examples/evidence" && PYTHONPATH="$REPO/scripts${PYTHONPATH:+:$PYTHONPATH}" \
    "$PYTHON" -c 'from records import default_page; print(default_page())')}  # records reads logs with scripts/posattn_tools

ALL="lstm_lm_authors attentive_lstm_lm_authors positional_attentive_lstm_lm_authors"
SYSTEMS=${SYSTEMS:-$ALL}
for system in $SYSTEMS; do
    [[ " $ALL " == *" $system "* ]] || { echo "run_lstm_authors_budget.sh: SYSTEMS takes $ALL, got $system" >&2; exit 2; }
done
export TASKS=lm LM_SYSTEMS="$SYSTEMS"
source "$REPO/examples/lib/device.sh"  # GPUS, checked against what torch sees here (and the recipes' device)
EVIDENCE=("$PYTHON" "$REPO/examples/evidence/evidence.py")
if (( DRY_RUN )); then
    exec "${EVIDENCE[@]}" plan
fi

if (( GPUS > 0 )); then
    JOBS=${JOBS:-6} where="$GPUS GPU(s)"
else
    JOBS=${JOBS:-2} where="the CPU (torch sees no GPU; about two days at 2 at a time)"
fi
export JOBS THREADS=${THREADS:-1}

COLLECT=()
if [[ -n "$DEST" ]]; then
    mkdir -p "$DEST"
    DEST=$(cd "$DEST" && pwd)
    COLLECT=(--collect "$DEST")
    exec > >(tee -a "$DEST/run_lstm_authors_budget.log") 2>&1
fi
STATE=$(mktemp)
trap 'rm -f "$STATE"' EXIT

echo "==> $(date -Is) the PTB LSTMs at the authors' budget ($SYSTEMS) on $where: JOBS=$JOBS at a time," \
     "THREADS=$THREADS each"
"${EVIDENCE[@]}" plan | cut -f1,2
"${EVIDENCE[@]}" run --no-results &
runner=$!
trap 'kill -TERM "$runner" 2>/dev/null || true' TERM INT   # the runner stops its trainings, then we stop
while kill -0 "$runner" 2>/dev/null; do
    sleep "$POLL" & wait $! || true
    "${EVIDENCE[@]}" progress --changed "$STATE" "${COLLECT[@]}" || true
done
status=0
wait "$runner" || status=$?
trap - TERM INT

echo "==> $(date -Is) the runner ended with status $status; every training:"
"${EVIDENCE[@]}" progress "${COLLECT[@]}" || true
"${EVIDENCE[@]}" status
if (( status < 128 )); then
    # the whole page: not only the runs of this selection (results.py adds the plan's and the records' systems)
    echo "==> regenerating the results page"
    if env -u TASKS -u LM_SYSTEMS "$PYTHON" "$REPO/examples/evidence/results.py" --output "$RESULTS_PAGE"; then
        [[ -z "$DEST" ]] || cp "$RESULTS_PAGE" "$DEST/results.md"
    else
        echo "    the page could not be made here (its data, ../shared/data, missing?): make it where the records go"
    fi
fi
if [[ -n "$DEST" ]]; then
    echo "==> in $DEST: records.tar.gz (add to the records: tar -xzf $DEST/records.tar.gz -C examples/evidence/records)," \
         "logs.tar.gz, run_lstm_authors_budget.log"
fi
exit "$status"
