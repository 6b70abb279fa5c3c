#!/usr/bin/env bash
# One task of a megatron-rl Slurm job, started by ray.sbatch with srun (one task per node):
#
#   ray_node.sh head JOBDIR              Ray head on this node; writes its address to JOBDIR/head_address
#   ray_node.sh worker JOBDIR ADDRESS    Ray worker on this node, joining the head at ADDRESS
#   ray_node.sh driver JOBDIR CMD...     CMD on this node (after the same setup), signals going straight to it
#
# Each Ray node carries the resource slurm_node_<i> (i = the node's position in the job's node list, 0 = head)
# so that recipes can place roles on nodes (+placement.server_resources.slurm_node_1=1). SIGTERM or SIGINT
# stops only the Ray processes this task started (ray start --block takes its raylet, GCS and workers with it);
# nothing else on the node is touched. Settings come from the environment ray.sbatch exports (slurm/README.md).
set -euo pipefail

role=${1:?usage: ray_node.sh head|worker|driver JOBDIR [ADDRESS | CMD...]}
jobdir=${2:?usage: ray_node.sh head|worker|driver JOBDIR [ADDRESS | CMD...]}
shift 2
node=${SLURMD_NODENAME:-$(hostname)}

index=-1
read -r -a all_nodes <<< "${MRL_NODELIST:?MRL_NODELIST is empty: ray.sbatch sets it to the node names of the job}"
for i in "${!all_nodes[@]}"; do
  if [[ "${all_nodes[$i]}" == "$node" ]]; then index=$i; fi
done
if (( index < 0 )); then
  echo "ray_node.sh: node $node is not in MRL_NODELIST ($MRL_NODELIST)" >&2
  exit 2
fi

# The same per-node setup on every node (modules, virtual environment, exports), before anything starts.
if [[ -n "${MRL_NODE_SETUP:-}" ]]; then
  # shellcheck source=/dev/null
  source "$MRL_NODE_SETUP"
fi

child=""
stop() {  # the signal that stops this task: pass it on to what this task started, wait for it, then leave
  trap - TERM INT
  if [[ -n "$child" ]]; then
    kill "-$1" "$child" 2> /dev/null || true
    wait "$child" 2> /dev/null || true
  fi
  exit 143
}

if [[ "$role" == driver ]]; then  # exec: a background child of a script would ignore SIGINT, and Python with it
  exec "$@"
fi

ray_tmp="${MRL_RAY_TMPDIR:-/tmp}/ray_${SLURM_JOB_ID}_${index}"  # node-local, short (socket paths < 108 bytes)
extra=${MRL_RAY_RESOURCES:-}
resources="{\"slurm_node_${index}\": 1000${extra:+, ${extra#\{}}"
[[ -n "$extra" ]] || resources+="}"
args=(--block --disable-usage-stats --temp-dir="$ray_tmp" --num-gpus="${MRL_GPUS_PER_NODE:-0}"
      --resources="$resources")
if [[ -n "${MRL_RAY_CPUS:-}" ]]; then args+=(--num-cpus="$MRL_RAY_CPUS"); fi
if [[ -n "${MRL_RAY_OBJECT_STORE_BYTES:-}" ]]; then args+=(--object-store-memory="$MRL_RAY_OBJECT_STORE_BYTES"); fi
ray=${MRL_RAY:-ray}
# Ray 2.60 drains a node for 30 s on SIGTERM before stopping it (for Ray Serve); a job that is stopping has
# nothing to drain, and a drain that outlasts Slurm's KillWait ends in SIGKILL with the temp dir left behind.
export RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S=${RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S:-0}

rm -f "$ray_tmp/ray_current_cluster"  # a stale address of an earlier job with this id must not be published
case "$role" in
  head)
    echo "ray_node.sh: head on $node (slurm_node_$index), port ${MRL_RAY_PORT:-6379}, temp dir $ray_tmp"
    "$ray" start --head --port="${MRL_RAY_PORT:-6379}" --include-dashboard=false "${args[@]}" &
    ;;
  worker)
    address=${1:?usage: ray_node.sh worker JOBDIR ADDRESS}
    echo "ray_node.sh: worker on $node (slurm_node_$index) joining $address, temp dir $ray_tmp"
    "$ray" start --address="$address" "${args[@]}" &
    ;;
  *)
    echo "ray_node.sh: role $role is not one of head, worker, driver" >&2
    exit 2
    ;;
esac
child=$!
trap 'stop TERM' TERM INT
trap 'rm -rf "$ray_tmp"' EXIT

if [[ "$role" == head ]]; then  # publish the head's address (the GCS) on the shared job folder
  until [[ -s "$ray_tmp/ray_current_cluster" ]]; do
    kill -0 "$child" 2> /dev/null || { wait "$child" || exit; exit 1; }
    sleep 0.5
  done
  cp "$ray_tmp/ray_current_cluster" "$jobdir/head_address.tmp"
  mv "$jobdir/head_address.tmp" "$jobdir/head_address"
  echo "ray_node.sh: head address $(< "$jobdir/head_address")"
fi
wait "$child"
