#!/usr/bin/env bash
# Three skillbox nodes on one Postgres database and one S3 bucket, behind HAProxy, on
# this machine: each node in a network namespace of its own, joined by a bridge to the
# host, where Postgres (Debian's, a cluster of this script's own, with a password),
# moto's S3 server and HAProxy listen. Then scripts/cluster/check.py drives it through
# the balancer (a run lands in Postgres and the bucket and is downloadable from every
# node; a session is used 50 times; a node killed with SIGKILL mid-run: the others go
# on, nothing acknowledged is lost), and everything is stopped and removed.
#
#   scripts/cluster.sh [BINARY] [-- CMD…]
#
# As root. BINARY defaults to target/debug/skillbox (the target dir: $CARGO_TARGET_DIR,
# else target/). With `-- CMD…`, CMD runs against the cluster instead of the checks
# (bench/scale.sh does), with the CLUSTER_* variables below; CLUSTER_SERVE_FLAGS adds
# flags to every node's `serve`.
#
# Needs: root (namespaces), ip, iptables when a FORWARD policy drops bridged traffic,
# Debian's postgresql and haproxy, and moto's server in <target>/s3/venv (scripts/test.sh
# installs all of them). Exit 0 when every check held.
set -euo pipefail
cd "$(dirname "$0")/.."

target=${CARGO_TARGET_DIR:-$PWD/target}
bin=$target/debug/skillbox
if [ $# -gt 0 ] && [ "$1" != -- ]; then bin=$1; shift; fi
[ "${1:-}" = -- ] && shift
command=("$@")
bin=$(realpath "$bin")
moto=$target/s3/venv/bin/moto_server
pg_bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
for need in "$bin" "$moto" "$pg_bin/initdb" /usr/sbin/haproxy; do
  [ -e "$need" ] || { echo "cluster: $need is missing (scripts/test.sh installs it)" >&2; exit 1; }
done
[ "$(id -u)" = 0 ] || { echo "cluster: run as root (network namespaces)" >&2; exit 1; }

net=10.77.0            # the host is .1, node N is .1N
bridge=sbxc0
pg_port=15432 moto_port=15900 lb_port=18080
work=$(mktemp -d /tmp/skillbox-cluster.XXXXXX)
chmod 755 "$work"
pids=()

stop_all() {
  set +e
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null; done
  [ -f "$work/pg/data/postmaster.pid" ] &&
    runuser -u postgres -- "$pg_bin/pg_ctl" -D "$work/pg/data" -m immediate stop >/dev/null 2>&1
  for n in 1 2 3; do ip netns del "sbxc-n$n" 2>/dev/null; done
  ip link del "$bridge" 2>/dev/null
  command -v iptables >/dev/null && iptables -w -D FORWARD -i "$bridge" -o "$bridge" -j ACCEPT 2>/dev/null
  rm -rf "$work"
}
trap stop_all EXIT
# What a run killed before its cleanup left.
for n in 1 2 3; do ip netns del "sbxc-n$n" 2>/dev/null || true; done
ip link del "$bridge" 2>/dev/null || true

echo "cluster: network: bridge $bridge $net.1/24, nodes in namespaces sbxc-n1..3"
ip link add "$bridge" type bridge
ip addr add "$net.1/24" dev "$bridge"
ip link set "$bridge" up
# Docker's FORWARD policy drops bridged traffic when br_netfilter is loaded: let the
# nodes reach each other (a session's requests are forwarded to its node).
command -v iptables >/dev/null && iptables -w -I FORWARD -i "$bridge" -o "$bridge" -j ACCEPT
for n in 1 2 3; do
  ip netns add "sbxc-n$n"
  ip link add "sbxc-v$n" type veth peer name eth0 netns "sbxc-n$n"
  ip link set "sbxc-v$n" master "$bridge" up
  ip -n "sbxc-n$n" addr add "$net.1$n/24" dev eth0
  ip -n "sbxc-n$n" link set eth0 up
  ip -n "sbxc-n$n" link set lo up
done

echo "cluster: postgres on $net.1:$pg_port (password auth)"
mkdir -p "$work/pg"
chown postgres "$work/pg"
password=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
printf '%s\n' "$password" > "$work/pg/pwfile"
chown postgres "$work/pg/pwfile"
runuser -u postgres -- "$pg_bin/initdb" -D "$work/pg/data" -U skillbox --pwfile="$work/pg/pwfile" \
  --auth-local=trust --auth-host=scram-sha-256 -E UTF8 --locale=C --no-sync >/dev/null
echo "host all all $net.0/24 scram-sha-256" >> "$work/pg/data/pg_hba.conf"
runuser -u postgres -- "$pg_bin/pg_ctl" -D "$work/pg/data" -w -l "$work/pg/log" \
  -o "-p $pg_port -k $work/pg -c listen_addresses=$net.1 -c fsync=off" start >/dev/null
db="postgres://skillbox:$password@$net.1:$pg_port/postgres"

echo "cluster: moto's S3 on $net.1:$moto_port"
"$moto" -H "$net.1" -p "$moto_port" >"$work/moto.log" 2>&1 &
pids+=($!)
export AWS_ENDPOINT_URL=http://$net.1:$moto_port AWS_ALLOW_HTTP=true AWS_REGION=us-east-1 \
  AWS_ACCESS_KEY_ID=cluster AWS_SECRET_ACCESS_KEY=cluster-secret
python3 scripts/cluster/check.py make-bucket cluster

# The Node runtime is set up once, here, where npm's registry is reachable (the nodes'
# namespaces reach only the bridge), and each node's data dir starts with a copy.
seed=$target/cluster/seed
echo "cluster: the Node runtime in $seed"
"$bin" --data-dir "$seed" setup --no-wasm >"$work/setup.log" 2>&1 ||
  { cat "$work/setup.log" >&2; exit 1; }

echo "cluster: API keys of two tenants in the database (every node answers them), one data dir per node"
SKILLBOX_DB="$db" "$bin" keys new acme 2>/dev/null > "$work/token"
SKILLBOX_DB="$db" "$bin" keys new globex 2>/dev/null > "$work/token-globex"
# A model whose one script outlasts the check, so a node can be killed mid-run.
cat > "$work/transcript.json" <<'JSON'
{"turns": [
  {"text": "Waiting.", "toolCalls": [{"name": "run_script", "arguments": {"language": "node", "script": "setTimeout(() => {}, 600000);"}}]},
  {"text": "Done."}
]}
JSON
for n in 1 2 3; do
  mkdir -p "$work/node$n"
  cp -a "$seed/runtimes" "$work/node$n/"
  ip netns exec "sbxc-n$n" env SKILLBOX_DB="$db" "$bin" --data-dir "$work/node$n" serve \
    --addr "$net.1$n:8080" --node "n$n" --node-silence 3s \
    --store s3://cluster/skillbox --transcript "$work/transcript.json" \
    ${CLUSTER_SERVE_FLAGS:-} >"$work/node$n.log" 2>&1 &
  pids+=($!)
  echo "$!" > "$work/node$n.pid"
done

cat > "$work/haproxy.cfg" <<CFG
global
  maxconn 4000
  stats socket $work/haproxy.sock mode 600 level admin
defaults
  mode http
  timeout connect 5s
  timeout client 300s
  timeout server 300s
  retries 2
  option redispatch
frontend skillbox
  bind 127.0.0.1:$lb_port
  default_backend nodes
backend nodes
  balance roundrobin
  option httpchk GET /healthz
  default-server inter 500ms fall 2 rise 1
  server n1 $net.11:8080 check
  server n2 $net.12:8080 check
  server n3 $net.13:8080 check
CFG
echo "cluster: haproxy on 127.0.0.1:$lb_port"
haproxy -db -f "$work/haproxy.cfg" >"$work/haproxy.log" 2>&1 &
pids+=($!)

# What the checks (or CMD) are told: where the balancer, the nodes and the database
# are, psql, and the work dir (token, token-globex, nodeN.pid, haproxy.sock).
export CLUSTER_WORK=$work CLUSTER_LB=http://127.0.0.1:$lb_port CLUSTER_DB=$db \
  CLUSTER_NODES="n1=http://$net.11:8080,n2=http://$net.12:8080,n3=http://$net.13:8080" \
  CLUSTER_PSQL=$pg_bin/psql CLUSTER_BIN=$bin
node_logs() { for n in 1 2 3; do echo "--- node$n.log"; tail -20 "$work/node$n.log"; done >&2; }
if [ ${#command[@]} -gt 0 ]; then
  python3 scripts/cluster/check.py wait || { node_logs; exit 1; }
  "${command[@]}"
  exit
fi
python3 scripts/cluster/check.py run || { node_logs; exit 1; }
