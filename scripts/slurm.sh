#!/usr/bin/env bash
# Single-host Slurm 22.05 (Debian 12) for Berth's tests and demo: munge, slurmctld, 4 fake slurmd nodes
# with fake GRES GPUs (n1-n2: 4x a100, n3-n4: 8x h100) and slurmrestd on 127.0.0.1 with JWT.
#   scripts/slurm.sh start|stop|status|token [USER]|reset|stop-controller|start-controller
# Run as root (no systemd: every daemon is started by hand). start and stop are idempotent; daemons are
# stopped by PID file only. `reset` stops everything and wipes Slurm's state (jobs, reservations).
# Needs: apt-get install slurmctld slurmd slurm-client slurmrestd munge slurm-wlm-jwt-plugin
# BERTH_SLURM_ACCOUNTING=1 also runs slurmdbd on a MariaDB (socket only, no TCP), so that sacct has real
# accounting (GRES TRES included); needs apt-get install slurmdbd mariadb-server.
# Facts behind every choice below: ../shared/notes/machine-setup.md §5 (gotcha numbers quoted).
set -euo pipefail

CTLD_PORT=${BERTH_SLURMCTLD_PORT:-46817}
NODE_PORT_BASE=${BERTH_SLURMD_PORT_BASE:-46800}  # n1..n4 listen on BASE+1..BASE+4
REST_PORT=${BERTH_SLURMRESTD_PORT:-46820}
JOB_USER=${BERTH_SLURM_USER:-berth}  # the account Berth's jobs run as (token owner)
REST_USER=slurmrest                  # slurmrestd refuses root and SlurmUser (gotcha 5)
ACCOUNTING=${BERTH_SLURM_ACCOUNTING:-0}
DBD_PORT=${BERTH_SLURMDBD_PORT:-46819}
NODES="n1 n2 n3 n4"

ETC=/etc/slurm
CTLD_SPOOL=/var/spool/slurmctld
SLURMD_SPOOL=/var/spool/slurmd
LOG=/var/log/slurm
JWT_KEY=$ETC/jwt_hs256.key  # outside the state dir so that `reset` keeps issued tokens valid
MUNGE_PID=/run/munge/munged.pid
CTLD_PID=/run/slurmctld.pid
REST_PID=/run/slurmrestd-berth.pid
DBD_PID=/run/slurmdbd-berth.pid
MYSQL_RUN=/run/mysqld
MYSQL_PID=$MYSQL_RUN/mysqld-berth.pid

die() { echo "slurm.sh: $*" >&2; exit 1; }

is_running() {  # is_running PIDFILE: the PID in the file is alive
  [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null
}

stop_pid() {  # stop_pid PIDFILE: TERM, wait up to 10 s, then KILL; always removes the file
  local f=$1 pid
  [ -f "$f" ] || return 0
  pid=$(cat "$f")
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && kill -9 "$pid" 2>/dev/null
  fi
  rm -f "$f"
}

accounting_config() {  # slurm.conf lines: slurmdbd with GPU TRES, or none (sacct then only has sacct -c)
  if [ "$ACCOUNTING" = 1 ]; then
    printf '%s\n' "AccountingStorageType=accounting_storage/slurmdbd" "AccountingStorageHost=localhost" \
      "AccountingStoragePort=$DBD_PORT" "AccountingStorageTRES=gres/gpu,gres/gpu:a100,gres/gpu:h100" \
      "JobAcctGatherType=jobacct_gather/linux"
  else
    printf '%s\n' "AccountingStorageType=accounting_storage/none" "JobAcctGatherType=jobacct_gather/none"
  fi
}

start_accounting() {  # MariaDB on its socket, the accounting database, slurmdbd, the cluster row
  command -v slurmdbd >/dev/null && command -v mariadbd >/dev/null ||
    die "BERTH_SLURM_ACCOUNTING=1 needs: apt-get install slurmdbd mariadb-server"
  local sock=$MYSQL_RUN/mysqld.sock
  if ! is_running "$MYSQL_PID"; then
    install -d -o mysql -g mysql -m 0755 "$MYSQL_RUN"
    setsid /usr/sbin/mariadbd --user=mysql --skip-networking --socket="$sock" \
      --pid-file="$MYSQL_PID" --log-error="$LOG/mariadb.err" </dev/null >/dev/null 2>&1 &
    for _ in $(seq 150); do mariadb-admin --socket="$sock" ping >/dev/null 2>&1 && break; sleep 0.2; done
    mariadb-admin --socket="$sock" ping >/dev/null 2>&1 || die "MariaDB did not start (see $LOG/mariadb.err)"
  fi
  mariadb --socket="$sock" -e "CREATE DATABASE IF NOT EXISTS slurm_acct_db;
    CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY 'slurmdbpass';
    GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';"
  # JWT in slurmdbd.conf too, else /slurmdb/ answers "Protocol authentication error" (gotcha 7).
  (umask 077 && printf '%s\n' "# Written by Berth's scripts/slurm.sh (BERTH_SLURM_ACCOUNTING=1)." \
    "AuthType=auth/munge" "AuthAltTypes=auth/jwt" "AuthAltParameters=jwt_key=$JWT_KEY" \
    "DbdHost=localhost" "DbdPort=$DBD_PORT" "SlurmUser=root" "PidFile=$DBD_PID" "LogFile=$LOG/slurmdbd.log" \
    "StorageType=accounting_storage/mysql" "StorageHost=localhost" "StorageLoc=slurm_acct_db" \
    "StorageUser=slurm" "StoragePass=slurmdbpass" >"$ETC/slurmdbd.conf")
  if ! is_running "$DBD_PID"; then
    slurmdbd
    for _ in $(seq 100); do timeout 5 sacctmgr -n show cluster >/dev/null 2>&1 && break; sleep 0.2; done
  fi
  timeout 10 sacctmgr -n -P show cluster format=cluster | grep -qx berth ||
    timeout 10 sacctmgr -i add cluster berth >/dev/null || die "sacctmgr could not register the cluster"
}

write_config() {
  install -d "$CTLD_SPOOL" "$LOG" "$ETC/fake-gpus"
  for n in $NODES; do install -d "$SLURMD_SPOOL/$n"; done
  # gres/gpu in 22.05 drops GPUs without File= and wants device files: symlinks to /dev/null are clean (gotcha 1).
  for i in 0 1 2 3 4 5 6 7; do ln -sfn /dev/null "$ETC/fake-gpus/nvidia$i"; done
  if [ ! -s "$JWT_KEY" ]; then
    (umask 077 && dd if=/dev/urandom bs=32 count=1 status=none >"$JWT_KEY")
  fi
  cat >"$ETC/slurm.conf" <<EOF
# Written by Berth's scripts/slurm.sh: single-host test cluster, do not edit by hand.
ClusterName=berth
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# JWT for slurmrestd (gotcha 7).
AuthAltTypes=auth/jwt
AuthAltParameters=jwt_key=$JWT_KEY
SlurmctldPort=$CTLD_PORT
StateSaveLocation=$CTLD_SPOOL
SlurmdSpoolDir=$SLURMD_SPOOL/%n
SlurmctldPidFile=$CTLD_PID
SlurmdPidFile=/run/slurmd-%n.pid
SlurmctldLogFile=$LOG/slurmctld.log
SlurmdLogFile=$LOG/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SwitchType=switch/none
# The fake nodes claim more CPUs than the host has, so that GPUs, not CPUs, limit how many jobs fit.
SlurmdParameters=config_overrides
MailProg=/bin/true
ReturnToService=2
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
$(accounting_config)
JobCompType=jobcomp/filetxt
JobCompLoc=$LOG/jobcomp.log
# Requeue is how Berth preempts; let it (and keep finished jobs visible for an hour so that Berth's
# reconcile sees how they ended before slurmctld forgets them).
JobRequeue=1
MinJobAge=3600
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
Waittime=0
NodeName=n[1-2] NodeHostname=localhost NodeAddr=127.0.0.1 Port=[$((NODE_PORT_BASE + 1))-$((NODE_PORT_BASE + 2))] CPUs=16 RealMemory=16000 Gres=gpu:a100:4 State=UNKNOWN
NodeName=n[3-4] NodeHostname=localhost NodeAddr=127.0.0.1 Port=[$((NODE_PORT_BASE + 3))-$((NODE_PORT_BASE + 4))] CPUs=16 RealMemory=16000 Gres=gpu:h100:8 State=UNKNOWN
PartitionName=gpu  Nodes=ALL    Default=YES MaxTime=INFINITE State=UP
PartitionName=a100 Nodes=n[1-2] MaxTime=INFINITE State=UP
PartitionName=h100 Nodes=n[3-4] MaxTime=INFINITE State=UP
EOF
  cat >"$ETC/gres.conf" <<EOF
AutoDetect=off
NodeName=n[1-2] Name=gpu Type=a100 File=$ETC/fake-gpus/nvidia[0-3]
NodeName=n[3-4] Name=gpu Type=h100 File=$ETC/fake-gpus/nvidia[0-7]
EOF
}

ensure_users() {
  id "$REST_USER" >/dev/null 2>&1 ||
    useradd --system --no-create-home --shell /usr/sbin/nologin "$REST_USER"
  id "$JOB_USER" >/dev/null 2>&1 ||
    useradd --system --no-create-home --home-dir /tmp --shell /bin/bash "$JOB_USER"
}

start_munge() {
  is_running "$MUNGE_PID" && return 0
  if [ ! -s /etc/munge/munge.key ]; then
    mungekey --create --keyfile=/etc/munge/munge.key
    chown munge: /etc/munge/munge.key && chmod 600 /etc/munge/munge.key
  fi
  install -d -o munge -g munge -m 0755 /run/munge
  # --force: a stale socket left by a killed munged would otherwise stop it from starting.
  runuser -u munge -- /usr/sbin/munged --force
  for _ in $(seq 50); do [ -S /run/munge/munge.socket.2 ] && break; sleep 0.1; done
}

start_controller() {
  is_running "$CTLD_PID" && return 0
  slurmctld
  for _ in $(seq 100); do timeout 5 scontrol ping 2>/dev/null | grep -q 'is UP' && return 0; sleep 0.1; done
  die "slurmctld did not answer within 10 s (see $LOG/slurmctld.log)"
}

start_nodes() {
  for n in $NODES; do
    is_running "/run/slurmd-$n.pid" || slurmd -N "$n"
  done
  # Ready = registered and responding; a node drained on purpose (a test, an admin) counts, since
  # drain is a scheduling state (a node that registered badly is INVAL, see gotcha 2: that fails here).
  local up=0
  for _ in $(seq 150); do
    up=$(sinfo -h -N -o '%N %t' 2>/dev/null | sort -u | grep -Evc ' (down|unk|inval|fail|futr|npc|boot)|\*$' || true)
    [ "$up" = 4 ] && return 0
    sleep 0.2
  done
  sinfo -N -o "%N %T %E" >&2 || true
  die "only $up of 4 nodes came up within 30 s (see $LOG/slurmd-*.log)"
}

start_rest() {
  is_running "$REST_PID" && return 0
  install -d -o "$REST_USER" -g "$REST_USER" -m 0755 /run/slurmrestd
  # SLURM_JWT=daemon, else every token is refused (gotcha 7); -u/-g drop root after binding (gotcha 5).
  # With slurmdbd, also serve the accounting API (/slurmdb/v0.0.38/..., the dbv0.0.38 plugin).
  local spec=openapi/v0.0.38
  if [ "$ACCOUNTING" = 1 ]; then spec=openapi/v0.0.38,openapi/dbv0.0.38; fi
  SLURM_JWT=daemon setsid slurmrestd -u "$REST_USER" -g "$REST_USER" -a rest_auth/jwt -s "$spec" \
    "127.0.0.1:$REST_PORT" </dev/null >"$LOG/slurmrestd.log" 2>&1 &
  echo $! >"$REST_PID"
  for _ in $(seq 50); do
    (exec 3<>"/dev/tcp/127.0.0.1/$REST_PORT") 2>/dev/null && return 0
    sleep 0.1
  done
  die "slurmrestd did not listen on 127.0.0.1:$REST_PORT (see $LOG/slurmrestd.log)"
}

check_ports() {  # refuse to start on a port someone else holds (our own daemons are fine)
  local p
  for p in "$CTLD_PORT" "$REST_PORT" $(seq $((NODE_PORT_BASE + 1)) $((NODE_PORT_BASE + 4))); do
    if ss -Hltnp "( sport = :$p )" 2>/dev/null | grep -q . &&
      ! ss -Hltnp "( sport = :$p )" | grep -Eq 'slurm(ctld|d|restd)'; then
      die "port $p is taken by another program: set BERTH_SLURM*_PORT* to free ports"
    fi
  done
}

status() {
  local rc=0 f
  for f in "$MUNGE_PID" "$CTLD_PID" /run/slurmd-n1.pid /run/slurmd-n2.pid /run/slurmd-n3.pid \
    /run/slurmd-n4.pid "$REST_PID"; do
    if is_running "$f"; then echo "running  $(basename "$f" .pid) pid $(cat "$f")"; else
      echo "stopped  $(basename "$f" .pid)"; rc=3; fi
  done
  echo "slurmrestd: http://127.0.0.1:$REST_PORT (openapi/v0.0.38, JWT; token: $0 token $JOB_USER)"
  return $rc
}

stop_all() {
  stop_pid "$REST_PID"
  for n in $NODES; do stop_pid "/run/slurmd-$n.pid"; done
  stop_pid "$CTLD_PID"
  stop_pid "$DBD_PID"
  stop_pid "$MYSQL_PID"
  stop_pid "$MUNGE_PID"
}

[ "$(id -u)" = 0 ] || die "run as root (Slurm daemons and munge need it)"
case "${1:-}" in
  start)
    command -v slurmctld >/dev/null || die "Slurm is not installed (see header)"
    check_ports
    write_config
    ensure_users
    start_munge
    if [ "$ACCOUNTING" = 1 ]; then start_accounting; fi
    start_controller
    start_nodes
    start_rest
    echo "slurm ready: 4 nodes, slurmrestd on http://127.0.0.1:$REST_PORT"
    ;;
  stop) stop_all ;;
  status) status ;;
  token)  # prints a JWT for USER (default: the job user), valid for 1 h
    scontrol token username="${2:-$JOB_USER}" lifespan="${3:-3600}" | sed -n 's/^SLURM_JWT=//p'
    ;;
  reset)
    stop_all
    rm -rf "${CTLD_SPOOL:?}"/* "${SLURMD_SPOOL:?}"/*
    ;;
  stop-controller) stop_pid "$CTLD_PID" ;;  # for tests: the controller goes away, nodes and jobs stay
  start-controller) start_controller ;;
  *) die "usage: $0 start|stop|status|token [USER [LIFESPAN_S]]|reset|stop-controller|start-controller" ;;
esac
