#!/usr/bin/env bash
# `rlnb train` over several nodes: run this once on every node (SLURM: `srun bash scripts/train_nodes.sh -p ...`, one
# task per node, as scripts/train_nodes.sbatch does). Each node's torchrun meets the others through a c10d rendezvous
# on the head node, then starts its processes; the arguments are `rlnb train`'s (`-p name value ...`).
#   nodes      RLNB_NNODES, else SLURM_NNODES
#   this node  RLNB_NODE_RANK, else SLURM_NODEID (0 to nodes - 1): node 0 hosts the rendezvous
#   head node  RLNB_HEAD, else the first host of SLURM_JOB_NODELIST (`scontrol show hostnames`)
#   per node   RLNB_PROCS_PER_NODE, else SLURM_GPUS_ON_NODE, else 1 process
#   rendezvous RLNB_PORT (29500) on the head node; RLNB_RUN_ID, else SLURM_JOB_ID, names the run's meeting
#   waiting    RLNB_JOIN_TIMEOUT: seconds torchrun waits for every node to join (unset: torch's 600)
# Without SLURM, set the first three yourself, e.g. two nodes on one machine (chapter 71's rehearsal):
#   RLNB_NNODES=2 RLNB_NODE_RANK=0 RLNB_HEAD=127.0.0.1 bash scripts/train_nodes.sh -p output_dir runs/nodes &
#   RLNB_NNODES=2 RLNB_NODE_RANK=1 RLNB_HEAD=127.0.0.1 bash scripts/train_nodes.sh -p output_dir runs/nodes
set -euo pipefail
refuse() { echo "train_nodes.sh: $1" >&2; exit 2; }
is_count() { [[ "$1" =~ ^[1-9][0-9]{0,5}$ ]]; }  # 1 to 999999, no leading zero (bash would read it as octal)

nnodes="${RLNB_NNODES:-${SLURM_NNODES:-}}"
node_rank="${RLNB_NODE_RANK:-${SLURM_NODEID:-}}"
head="${RLNB_HEAD:-}"
if [ -z "$head" ] && [ -n "${SLURM_JOB_NODELIST:-}" ]; then
  head="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)" \
    || refuse "could not read the head node from SLURM_JOB_NODELIST=$SLURM_JOB_NODELIST with scontrol; set RLNB_HEAD"
fi
procs="${RLNB_PROCS_PER_NODE:-${SLURM_GPUS_ON_NODE:-1}}"
port="${RLNB_PORT:-29500}"
run_id="${RLNB_RUN_ID:-${SLURM_JOB_ID:-rlnb}}"

[ -n "$nnodes" ] || refuse "the number of nodes is unset: run under SLURM (SLURM_NNODES) or set RLNB_NNODES=<nodes>"
is_count "$nnodes" || refuse "RLNB_NNODES (or SLURM_NNODES)='$nnodes' must be a whole number of nodes (1 to 999999)"
last=$((nnodes - 1))
[ -n "$node_rank" ] \
  || refuse "this node's rank is unset: run under SLURM (SLURM_NODEID) or set RLNB_NODE_RANK=<0..$last>"
[[ "$node_rank" =~ ^(0|[1-9][0-9]{0,5})$ ]] && [ "$node_rank" -le "$last" ] \
  || refuse "RLNB_NODE_RANK (or SLURM_NODEID)='$node_rank' must be a node rank from 0 to $last (of $nnodes nodes)"
[ -n "$head" ] || refuse "the head node is unset: run under SLURM (SLURM_JOB_NODELIST) or set RLNB_HEAD=<node 0's host>"
is_count "$procs" \
  || refuse "RLNB_PROCS_PER_NODE (or SLURM_GPUS_ON_NODE)='$procs' must be a whole number of processes (1 to 999999)"
[[ "$port" =~ ^[1-9][0-9]{0,4}$ ]] && [ "$port" -le 65535 ] \
  || refuse "RLNB_PORT='$port' must be a port number from 1 to 65535"

# Node 0 hosts the rendezvous store; the others connect to it (torch would guess from the host name, which on one
# machine, or a head node known by another name, guesses "host" on several nodes or on none). The rendezvous, not
# this node's rank, numbers the nodes (GROUP_RANK), so torchrun is given no --node_rank.
is_host=$([ "$node_rank" -eq 0 ] && echo 1 || echo 0)
conf="is_host=$is_host"
if [ -n "${RLNB_JOIN_TIMEOUT:-}" ]; then
  is_count "$RLNB_JOIN_TIMEOUT" || refuse "RLNB_JOIN_TIMEOUT='$RLNB_JOIN_TIMEOUT' must be a whole number of seconds"
  conf="$conf,join_timeout=$RLNB_JOIN_TIMEOUT"
fi
echo "train_nodes.sh: node $node_rank of $nnodes, $procs process(es) here, rendezvous $run_id at $head:$port" >&2
exec torchrun --nnodes "$nnodes" --nproc_per_node "$procs" --rdzv_backend c10d --rdzv_endpoint "$head:$port" \
  --rdzv_id "$run_id" --rdzv_conf "$conf" -m rlnb.cli train "$@"
