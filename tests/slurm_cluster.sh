#!/usr/bin/env bash
# A two-host SLURM cluster on this one machine, for tests/test_slurm.py (docs/distributed.md, "SLURM").
#
#   tests/slurm_cluster.sh up      # as root; Debian's slurm-wlm and munge installed
#   tests/slurm_cluster.sh exec CMD...   # CMD where the controller is (sbatch, squeue, scontrol, srun)
#   tests/slurm_cluster.sh down
#
# Each "host" is a network namespace of its own (mocose-node1, mocose-node2: a veth pair into a bridge in the
# controller's namespace mocose-ctl, addresses 10.231.0.11/.12, .1 the controller's, only inside these namespaces),
# its own hostname (a UTS namespace: `srun hostname` says node1/node2) and its own /etc/hosts (`ip netns exec` binds
# /etc/netns/NS/hosts), with its own `slurmd -N nodeN`; one slurmctld and one munged (its own key and socket) serve
# both. CPU only: proctrack/linuxproc, task/none, no cgroups, no accounting. The file system is the machine's own, so
# every folder is "shared" (the stand-in for a cluster file system). Everything the cluster writes (config, state,
# logs) is under $MOCOSE_SLURM_DIR (/tmp/mocose-slurm); `down` stops the daemons and removes the namespaces.
set -euo pipefail

DIR="${MOCOSE_SLURM_DIR:-/tmp/mocose-slurm}"
NODES=(node1 node2)
SUBNET=10.231.0
CTL_NS=mocose-ctl
export SLURM_CONF="$DIR/slurm.conf"

in_ctl() { ip netns exec "$CTL_NS" "$@"; }
# A daemon in namespace $1 with hostname $2: `nsenter --net` (not `ip netns exec`, whose fresh /sys has no cgroup
# mounts, which slurmd's cgroup plugin refuses), a UTS namespace for the hostname and a mount namespace in which the
# namespace's hosts file is /etc/hosts.
as_host() {
  local ns="$1" host="$2"; shift 2
  nsenter --net="/run/netns/$ns" unshare --uts --mount sh -c \
    "mount --bind /etc/netns/$ns/hosts /etc/hosts && hostname $host && exec \"\$@\"" sh "$@"
}

write_config() {
  mkdir -p "$DIR"/{state,spool,log,munge}
  cat > "$SLURM_CONF" <<EOF
ClusterName=mocose
SlurmctldHost=mocose-ctl($SUBNET.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# A requeued job waits cred_expire + 1 s before it starts again (120 s by default): the lost-node test waits 11 s.
# (Moving its BeginTime to now raced the killed job's revoked credential on node1: "Job credential revoked", and the
# restart failed without a requeue.)
AuthInfo=socket=$DIR/munge/munge.socket,cred_expire=10
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd-%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd-%n.log
SlurmctldPort=6817
SlurmdPort=6818
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/backfill
# Bounded failure: a silent node is DOWN after 20 s; a killed step's leftovers get 5 s after SIGTERM.
SlurmdTimeout=20
SlurmctldTimeout=20
MessageTimeout=10
KillWait=5
InactiveLimit=0
ReturnToService=2
MinJobAge=600
NodeName=node1 NodeAddr=$SUBNET.11 NodeHostname=node1 CPUs=$(nproc) State=UNKNOWN
NodeName=node2 NodeAddr=$SUBNET.12 NodeHostname=node2 CPUs=$(nproc) State=UNKNOWN
PartitionName=debug Nodes=node1,node2 Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
EOF
}

hosts_file() {
  printf '127.0.0.1 localhost\n%s.1 mocose-ctl\n%s.11 node1\n%s.12 node2\n' "$SUBNET" "$SUBNET" "$SUBNET"
}

up() {
  command -v slurmctld >/dev/null && command -v munged >/dev/null || {
    echo "slurm_cluster.sh: slurmctld or munged not found: apt-get install -y slurm-wlm munge" >&2; exit 1; }
  down quiet
  write_config
  # munge: a key of our own, its socket under $DIR (the machine's munged, if any, is left alone).
  [ -f "$DIR/munge/munge.key" ] || dd if=/dev/urandom of="$DIR/munge/munge.key" bs=1024 count=1 status=none
  chmod 700 "$DIR/munge"; chmod 400 "$DIR/munge/munge.key"
  munged --force --key-file="$DIR/munge/munge.key" --socket="$DIR/munge/munge.socket" \
    --pid-file="$DIR/munge/munged.pid" --log-file="$DIR/log/munged.log" --seed-file="$DIR/munge/munge.seed"

  # The network: a bridge in the controller's namespace, one veth pair per node.
  ip netns add "$CTL_NS"
  in_ctl ip link set lo up
  in_ctl ip link add mocose-br type bridge
  in_ctl ip addr add "$SUBNET.1/24" dev mocose-br
  in_ctl ip link set mocose-br up
  mkdir -p "/etc/netns/$CTL_NS"; hosts_file > "/etc/netns/$CTL_NS/hosts"
  local i=0 node ns
  for node in "${NODES[@]}"; do
    i=$((i + 1)); ns="mocose-$node"
    ip netns add "$ns"
    ip link add "m57-$node" netns "$ns" type veth peer name "m57-$node-br" netns "$CTL_NS"
    ip netns exec "$ns" ip link set lo up
    ip netns exec "$ns" ip addr add "$SUBNET.1$i/24" dev "m57-$node"
    ip netns exec "$ns" ip link set "m57-$node" up
    in_ctl ip link set "m57-$node-br" master mocose-br up
    mkdir -p "/etc/netns/$ns"; hosts_file > "/etc/netns/$ns/hosts"
  done

  as_host "$CTL_NS" mocose-ctl slurmctld -f "$SLURM_CONF"
  for node in "${NODES[@]}"; do
    mkdir -p "$DIR/spool/$node"
    as_host "mocose-$node" "$node" slurmd -f "$SLURM_CONF" -N "$node"
  done
  local tries
  for tries in $(seq 60); do
    if [ "$(in_ctl sinfo -h -N -t idle -o %N 2>/dev/null | sort -u | wc -l)" -eq "${#NODES[@]}" ]; then
      in_ctl sinfo -N; return 0
    fi
    sleep 1
  done
  echo "slurm_cluster.sh: the nodes did not come up within 60 s (logs in $DIR/log):" >&2
  in_ctl sinfo -N >&2 || true; tail -n 20 "$DIR"/log/*.log >&2 || true
  exit 1
}

stop_pidfile() {
  local pid
  [ -f "$1" ] && pid="$(cat "$1")" && [ -n "$pid" ] && kill "$pid" 2>/dev/null || true
}

down() {
  local node
  for node in "${NODES[@]}"; do stop_pidfile "$DIR/slurmd-$node.pid"; done
  stop_pidfile "$DIR/slurmctld.pid"
  stop_pidfile "$DIR/munge/munged.pid"
  sleep 1
  for node in "${NODES[@]}"; do
    # What still runs in a node's namespace (a job's processes) goes with it.
    ip netns pids "mocose-$node" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
    ip netns del "mocose-$node" 2>/dev/null || true
    rm -rf "/etc/netns/mocose-$node"
  done
  ip netns pids "$CTL_NS" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
  ip netns del "$CTL_NS" 2>/dev/null || true
  rm -rf "/etc/netns/$CTL_NS"
  rm -rf "$DIR/state" "$DIR/spool"
  [ "${1:-}" = quiet ] || echo "slurm_cluster.sh: down"
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  exec) shift; in_ctl "$@" ;;
  *) echo "usage: $0 up|down|exec CMD..." >&2; exit 2 ;;
esac
