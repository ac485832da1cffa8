#!/usr/bin/env bash
# Run an ada config on every worker of a Cloud TPU VM (single host or pod slice).
#
#   ./launch_tpu.sh --name ada-v5e --zone us-west4-a --type v5litepod-16 \
#       [--project P] [--version tpu-ubuntu2204-base] [--spot | --queued] \
#       [--repo GIT_URL [--branch B]] [--dry-run] \
#       -- --config configs/qwen25_math_7b.py:ada_balance --workdir /mnt/shared/run1
#
# Steps (each printed before it runs; --dry-run prints them and runs nothing):
#   1. reuse the TPU VM if `describe` finds it, else create it;
#   2. put the code on every worker: `git clone/pull` of --repo, or (default) a tarball of
#      this checkout copied with `scp --worker=all`;
#   3. install jax[tpu] and requirements.txt on every worker (pip, a venv under ~/ada-venv);
#   4. start `python -m ada.runner ARGS...` on all workers at once (jax.distributed finds
#      its peers on a TPU slice), logging to ~/ada/run.log on each worker.
# --spot (a spot VM) or --queued (a spot slice through queued resources) keep the run going
# until it is done: each worker restarts the runner after exit 143 (SIGTERM: checkpointed,
# resumable) and writes its last exit code to ~/ada/run.rc; this script then checks the VM
# every ADA_WATCH_S seconds (default 60): preempted (or its queued resource suspended or
# failed), it is deleted and steps 1-4 run again, resuming from the workdir's latest
# checkpoint; it exits 0 when the run exits 0, and with the run's code otherwise.
set -euo pipefail

NAME="" ZONE="" TYPE="" PROJECT="" VERSION="tpu-ubuntu2204-base" SPOT=0 QUEUED=0 REPO="" BRANCH="main" DRY=0
JAX_VERSION="${JAX_VERSION:-0.10.2}"
WATCH_S="${ADA_WATCH_S:-60}"
usage() { sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; }

while [[ $# -gt 0 ]]; do
  case "$1" in
    --name) NAME="$2"; shift 2 ;;
    --zone) ZONE="$2"; shift 2 ;;
    --type) TYPE="$2"; shift 2 ;;
    --project) PROJECT="$2"; shift 2 ;;
    --version) VERSION="$2"; shift 2 ;;
    --repo) REPO="$2"; shift 2 ;;
    --branch) BRANCH="$2"; shift 2 ;;
    --spot) SPOT=1; shift ;;
    --queued) QUEUED=1; SPOT=1; shift ;;
    --dry-run) DRY=1; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; break ;;
    *) echo "launch_tpu.sh: unknown option $1 (run with --help)" >&2; exit 2 ;;
  esac
done
RUN_ARGS=("$@")

missing=()
[[ -z "$NAME" ]] && missing+=(--name)
[[ -z "$ZONE" ]] && missing+=(--zone)
[[ -z "$TYPE" ]] && missing+=(--type)
if [[ ${#missing[@]} -gt 0 ]]; then
  echo "launch_tpu.sh: missing ${missing[*]} (run with --help)" >&2; exit 2
fi
if [[ ${#RUN_ARGS[@]} -eq 0 ]]; then
  echo "launch_tpu.sh: no run arguments; add: -- --config configs/X.py --workdir /mnt/shared/DIR" >&2; exit 2
fi
HAVE_WORKDIR=0
for a in "${RUN_ARGS[@]}"; do [[ "$a" == --workdir* ]] && HAVE_WORKDIR=1; done
if [[ $HAVE_WORKDIR -eq 0 ]]; then
  echo "launch_tpu.sh: the run needs --workdir (a directory every worker sees at the same path, e.g. a gcsfuse or Filestore mount: all hosts write checkpoint shards there)" >&2; exit 2
fi

GC=(gcloud compute tpus tpu-vm)
QR=(gcloud compute tpus queued-resources)
LOC=(--zone "$ZONE")
[[ -n "$PROJECT" ]] && LOC+=(--project "$PROJECT")

say() { printf '+ %s\n' "$*"; }
quote() {  # shell-quote each argument readably: plain words bare, others in single quotes
  local out="" a
  for a in "$@"; do
    if [[ "$a" =~ ^[A-Za-z0-9_./:=@%+,-]+$ ]]; then out+="$a "; else out+="'${a//\'/\'\\\'\'}' "; fi
  done
  printf '%s' "${out% }"
}
run() {  # print a command, then run it unless --dry-run
  say "$(quote "$@")"
  [[ $DRY -eq 1 ]] || "$@"
}
ssh_all() { run "${GC[@]}" ssh "$NAME" "${LOC[@]}" --worker=all --command "$1"; }

# 1. create or reuse
create() {
  if [[ $QUEUED -eq 1 ]]; then
    run "${QR[@]}" create "$NAME" "${LOC[@]}" --node-id "$NAME" --accelerator-type "$TYPE" \
      --runtime-version "$VERSION" --spot
    say "until $(quote "${QR[@]}" describe "$NAME" "${LOC[@]}" --format='value(state.state)') is ACTIVE"
    [[ $DRY -eq 1 ]] || until [[ "$("${QR[@]}" describe "$NAME" "${LOC[@]}" --format='value(state.state)')" == ACTIVE ]]; do sleep 30; done
  else
    extra=(); [[ $SPOT -eq 1 ]] && extra+=(--spot)
    run "${GC[@]}" create "$NAME" "${LOC[@]}" --accelerator-type "$TYPE" --version "$VERSION" "${extra[@]}"
  fi
}

# 2. code on every worker
put_code() {
  local here tarball
  here="$(cd "$(dirname "$0")" && pwd)"
  if [[ -n "$REPO" ]]; then
    ssh_all "if [ -d ~/ada/.git ]; then cd ~/ada && git fetch -q && git checkout -q $BRANCH && git pull -q; else git clone -q -b $BRANCH $REPO ~/ada; fi"
  else
    tarball="/tmp/ada-code-$$.tar.gz"
    run tar -C "$here" --exclude=.git --exclude=runs --exclude='*.egg-info' --exclude=__pycache__ -czf "$tarball" .
    run "${GC[@]}" scp "$tarball" "$NAME:~/ada-code.tar.gz" "${LOC[@]}" --worker=all
    ssh_all "mkdir -p ~/ada && tar -xzf ~/ada-code.tar.gz -C ~/ada"
  fi
}

# 3. install on every worker
install() {
  ssh_all "python3 -m venv ~/ada-venv && ~/ada-venv/bin/pip install -q -U pip && ~/ada-venv/bin/pip install -q \"jax[tpu]==${JAX_VERSION}\" -f https://storage.googleapis.com/jax-releases/libtpu_releases.html && ~/ada-venv/bin/pip install -q -r ~/ada/requirements.txt && ~/ada-venv/bin/pip install -q --no-deps -e ~/ada"
}

# 4. run on all workers at once (with --spot: again after each exit 143)
start_run() {
  local args_q runner
  args_q=$(printf '%q ' "${RUN_ARGS[@]}")
  runner="~/ada-venv/bin/python -m ada.runner ${args_q% }"
  if [[ $SPOT -eq 1 ]]; then
    ssh_all "cd ~/ada && rm -f ~/ada/run.rc && nohup sh -c 'while :; do $runner; rc=\$?; [ \$rc -eq 143 ] || break; done; echo \$rc > ~/ada/run.rc' >> ~/ada/run.log 2>&1 &"
  else
    ssh_all "cd ~/ada && nohup $runner > ~/ada/run.log 2>&1 &"
  fi
}

if [[ $DRY -eq 1 ]]; then
  say "$(quote "${GC[@]}" describe "$NAME" "${LOC[@]}") || (create below)"
  CREATE=1
elif "${GC[@]}" describe "$NAME" "${LOC[@]}" >/dev/null 2>&1; then
  echo "reusing TPU VM $NAME"; CREATE=0
else
  CREATE=1
fi
[[ $CREATE -eq 1 ]] && create
put_code
install
start_run
echo "started; follow worker 0 with: ${GC[*]} ssh $NAME ${LOC[*]} --worker=0 --command 'tail -f ~/ada/run.log'"
[[ $SPOT -eq 1 ]] || exit 0

# 5. --spot / --queued: watch until the run is done; a preempted VM is made again and resumes
STATE=("${GC[@]}" describe "$NAME" "${LOC[@]}" --format='value(state)')
RC=("${GC[@]}" ssh "$NAME" "${LOC[@]}" --worker=0 --command 'cat ~/ada/run.rc 2>/dev/null')
if [[ $QUEUED -eq 1 ]]; then
  STATE=("${QR[@]}" describe "$NAME" "${LOC[@]}" --format='value(state.state)')
  DELETE=("${QR[@]}" delete "$NAME" "${LOC[@]}" --force --quiet)
  UP=ACTIVE GONE="SUSPENDED|FAILED"
else
  DELETE=("${GC[@]}" delete "$NAME" "${LOC[@]}" --quiet)
  UP=READY GONE="PREEMPTED|TERMINATED"
fi
say "every ${WATCH_S} s: $(quote "${STATE[@]}")"
say "  $UP: $(quote "${RC[@]}"): 0 -> done (exit 0); another code, twice -> stop with it"
say "  $GONE or NOT_FOUND: $(quote "${DELETE[@]}"), then steps 1-4 again (the run resumes)"
[[ $DRY -eq 1 ]] && exit 0
last=""
while :; do
  sleep "$WATCH_S"
  if ! state="$("${STATE[@]}" 2>&1)"; then  # NOT_FOUND: gone; another error: ask again later
    [[ "$state" == *NOT_FOUND* ]] && state=NOT_FOUND || continue
  fi
  if [[ "|$GONE|NOT_FOUND|" == *"|$state|"* ]]; then
    echo "$NAME is $state (preempted): making it again; the run resumes from its latest checkpoint"
    "${DELETE[@]}" >/dev/null 2>&1 || true
    create; put_code; install; start_run; last=""
  elif [[ "$state" == "$UP" ]]; then
    rc="$("${RC[@]}" 2>/dev/null | tr -dc 0-9 || true)"
    if [[ "$rc" == 0 ]]; then echo "the run is done (exit 0)"; exit 0; fi
    # a code seen twice with the VM up: not a preemption the VM state has yet to show
    if [[ -n "$rc" && "$rc" == "$last" ]]; then
      echo "the run stopped with exit $rc (1: a crash or a lost process, 2: bad input; see ~/ada/run.log on the workers); not restarting it" >&2
      exit "$rc"
    fi
    last="$rc"
  fi
done
