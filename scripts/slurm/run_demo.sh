#!/usr/bin/env bash
# The whole workflow on the test config (tests/config.test.yaml: demo target, 300 prompts, a
# short training run), every job a SLURM job through profiles/slurm; then `eagleflow.verify`
# over the shards, and the number of SLURM jobs submitted. Heavy (demo target, vLLM, training):
# about as long as a local run of the test config.
#
#   bash scripts/slurm/run_demo.sh [WORKDIR [SNAKEMAKE_ARGS...]]
#
# WORKDIR defaults to a new /tmp/eagleflow-slurm-demo.*; further arguments go to snakemake
# (`-n`: a dry run, which stops before verify).
#
# WORKDIR must be on a filesystem every SLURM node sees (true on the local single-node cluster
# of scripts/slurm/setup_local_slurm.sh). Rerunning on the same WORKDIR redoes only what is
# missing or stale.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
venv=${EAGLEFLOW_VENV:-$repo/.venv}
workdir=${1:-$(mktemp -d /tmp/eagleflow-slurm-demo.XXXXXX)}
shift || true
extra=("$@")
dry_run=0
for arg in "${extra[@]}"; do
  case "$arg" in -n | --dry-run | --dryrun) dry_run=1 ;; esac
done
mkdir -p "$workdir"
workdir=$(cd "$workdir" && pwd)

if ! command -v sinfo >/dev/null 2>&1 || ! sinfo -h >/dev/null 2>&1; then
  echo "run_demo.sh: no reachable SLURM (sinfo); see scripts/slurm/setup_local_slurm.sh" >&2
  exit 1
fi
[ -f "$workdir/config.yaml" ] || cp "$repo/tests/config.test.yaml" "$workdir/config.yaml"

# The SLURM profile alone: profiles/default (the local workflow profile) would cap GPU requests
# at its `gpu=0`.
args=(--snakefile "$repo/Snakefile" --directory "$workdir"
  --profile "$repo/profiles/slurm" --workflow-profile none)
# No accounting database (the local cluster): job states from squeue, no account to guess.
if ! sacct -n -X >/dev/null 2>&1; then
  args+=(--slurm-status-command squeue --slurm-no-account)
fi
# A cluster without GPUs (the local one): the GPU rules run on CPUs (the engine follows what is
# installed). A --set-resources on the command line replaces the profile's whole set-resources
# list, so these rules fall back to their own mem_mb and the default runtime; --cores caps every
# job's threads (and CPUs requested) at what one node has.
if ! sinfo -h -o '%G' | grep -q gpu; then
  node_cpus=$(sinfo -h -o '%c' | sort -n | tail -n 1)
  echo "no GPU gres in this cluster: GPU rules ask for CPUs only, at most $node_cpus per job"
  args+=(--cores "$node_cpus"
    --set-resources generate:gpu=0 extract:gpu=0 train:gpu=0 evaluate_serving:gpu=0)
fi

export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
log="$workdir/snakemake-slurm.log"
echo "workdir: $workdir (log: $log)"
set +e
"$venv/bin/snakemake" "${args[@]}" "${extra[@]}" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e
submitted=$(grep -cE 'has been submitted with SLURM jobid [0-9]+' "$log" || true)
echo "SLURM jobs submitted: $submitted"
if [ "$status" -ne 0 ]; then
  echo "run_demo.sh: snakemake exited $status (SLURM job logs: $workdir/.snakemake/slurm_logs)" >&2
  exit "$status"
fi
[ "$dry_run" = 0 ] || exit 0
cd "$workdir"
"$venv/bin/python" -m eagleflow.verify --results results
echo "SLURM jobs submitted: $submitted"
