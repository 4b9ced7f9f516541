# The background work of the recipes that train in the background (length_extrapolation, language_model,
# pos_tagging, sentence_classification, the structural recipes, quickstart): one run per output folder, jobs
# that end with their recipe, and a recipe that fails when one of its jobs failed. Sourced after
# examples/lib/device.sh (RECIPE: the recipe's name in its messages).
#
#   lock_output_folder DIR         one run of a recipe per output folder (flock on DIR/.recipe.lock)
#   stop_jobs_with_the_recipe      Ctrl-C (SIGINT) or SIGTERM stops every background job, then the recipe
#   start_job LIMIT FUNC ARG...    FUNC ARG... in the background once fewer than LIMIT jobs run
#   wait_jobs                      wait for every job started; fails if one failed (FAILED_JOBS: how many)
#   how_it_ended STATUS            "exit status 1", "killed by SIGKILL (...)": a command's end, in words

STARTED_JOBS=()
FAILED_JOBS=0

# lock_output_folder DIR: make DIR and hold DIR/.recipe.lock until this recipe and every process it started
# have ended (they inherit the lock); a second recipe on DIR stops at once, in one line naming the first one's
# process: two runs would train the same checkpoints and overwrite each other's logs
lock_output_folder() {
    local dir="$1" lock="$1/.recipe.lock" holder
    mkdir -p "$dir"
    exec {OUTPUT_LOCK_FD}<> "$lock"
    if ! flock --nonblock "$OUTPUT_LOCK_FD"; then
        holder=$(< "$lock")
        echo "${RECIPE:-${0##*/}}: error: another run is working in $dir (process ${holder:-?}, or the trainings" \
             "it started: they hold $lock until they end): wait for it, or stop it with kill -TERM" \
             "${holder:-<its process>}" >&2
        exit 1
    fi
    echo "$$" > "$lock"
}

# stop_jobs_with_the_recipe: from here on every background job runs in a process group of its own (set -m),
# and Ctrl-C (SIGINT) or SIGTERM sends SIGTERM to each job's group (the job and every command it started),
# waits for them, and ends the recipe with status 130 / 143: nothing of this run goes on behind the back of
# the next one. What a job had not finished is redone by the next run.
stop_jobs_with_the_recipe() {
    set -m
    trap 'stop_jobs SIGINT 130' INT
    trap 'stop_jobs SIGTERM 143' TERM
}

stop_jobs() {
    local signal="$1" status="$2" group groups
    trap - INT TERM
    groups=$(jobs -p)
    echo "${RECIPE:-${0##*/}}: $signal: stopping its $(wc -w <<< "$groups") running job(s); run the same command" \
         "again to carry on" >&2
    for group in $groups; do kill -TERM -- "-$group" 2> /dev/null || true; done
    wait 2> /dev/null || true
    exit "$status"
}

# start_job LIMIT FUNC ARG...: FUNC ARG... in the background, once fewer than LIMIT jobs of start_job run (a
# job paused by SIGSTOP still counts: under job control `wait -n` returns when a job stops, not only when it ends)
start_job() {
    local limit="$1"; shift
    while (( $(live_jobs) >= limit )); do
        wait -n 2> /dev/null || sleep 1
    done
    "$@" &
    STARTED_JOBS+=($!)
}

# live_jobs: how many jobs of start_job have not ended (running or stopped)
live_jobs() {
    local pid live=0
    for pid in "${STARTED_JOBS[@]}"; do kill -0 "$pid" 2> /dev/null && live=$((live + 1)); done
    echo "$live"
}

# wait_jobs: wait for every job of start_job to end; FAILED_JOBS is how many failed (exit status not 0), and so
# is the status: 1 if one failed. A job stopped (SIGSTOP, to lend its CPU for a while) and continued is waited
# for again, not counted as failed: under job control `wait PID` also returns when the job stops.
wait_jobs() {
    local pid status
    FAILED_JOBS=0
    for pid in "${STARTED_JOBS[@]}"; do
        while true; do
            wait "$pid" 2> /dev/null && status=0 || status=$?
            kill -0 "$pid" 2> /dev/null || break  # ended: $status is its own
            sleep 1  # stopped, alive: wait until it ends
        done
        (( status == 0 )) || FAILED_JOBS=$((FAILED_JOBS + 1))
    done
    STARTED_JOBS=()
    (( FAILED_JOBS == 0 ))
}

# how_it_ended STATUS: a command's exit status in words ("exit status 1"; above 128: the signal that killed it)
how_it_ended() {
    local status="$1"
    if (( status <= 128 )); then echo "exit status $status"; return; fi
    local name; name=$(kill -l $((status - 128)) 2> /dev/null || echo "signal $((status - 128))")
    case "$name" in
        KILL) echo "killed by SIGKILL (the out-of-memory killer, or kill -9)" ;;
        *) echo "killed by SIG${name#SIG}" ;;
    esac
}
