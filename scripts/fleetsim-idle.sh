#!/bin/sh
# fleetsim-idle.sh: what an idle fleet of simulated nodes costs on this machine. It starts a
# private mosquitto (configs/mosquitto/fleet-sim.conf on a free loopback port), runs
# `mqlet-fleetsim --nodes N` (beside MQLET_BINARY) against it, and prints key=value lines:
#   fleetsim_nodes, fleetsim_connect_s (start to "all simulated nodes connected"),
#   fleetsim_cpu_pct and mosquitto_cpu_pct (average % of one core over the idle window),
#   fleetsim_rss_mib and mosquitto_rss_mib (at the end of the window),
#   fleetsim_stop_s (SIGTERM to exit) and fleetsim_offline (nodes the broker holds offline after).
# Usage: scripts/fleetsim-idle.sh [MQLET_BINARY] [NODES] [IDLE_SECONDS] [extra fleet-sim flags...]
# Defaults: bin/mqlet, 1000 nodes, 60 s (after a 20 s settle). Needs mosquitto; run as a user
# whose open-files limit exceeds NODES (ulimit -n).
set -eu

bin=${1:-bin/mqlet}
simbin=$(dirname "$bin")/mqlet-fleetsim
nodes=${2:-1000}
idle=${3:-60}
[ $# -gt 3 ] && shift 3 || set --
here=$(cd "$(dirname "$0")/.." && pwd)
dir=$(mktemp -d /tmp/fleetsim-idle.XXXXXX)
mosq_pid=
sim_pid=
cleanup() {
	[ -n "$sim_pid" ] && kill "$sim_pid" 2>/dev/null || true
	[ -n "$mosq_pid" ] && kill "$mosq_pid" 2>/dev/null || true
	wait 2>/dev/null || true
	rm -rf "$dir"
}
trap cleanup EXIT INT TERM

[ "$(ulimit -n)" = unlimited ] || [ "$(ulimit -n)" -gt $((nodes + 100)) ] ||
	{ echo "fleetsim-idle: open-files limit $(ulimit -n) is too low for $nodes nodes (ulimit -n)" >&2; exit 1; }

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
sed "s/^listener 1883 /listener $port /" "$here/configs/mosquitto/fleet-sim.conf" >"$dir/mosquitto.conf"
mosquitto -c "$dir/mosquitto.conf" >"$dir/mosquitto.log" 2>&1 &
mosq_pid=$!
for _ in $(seq 50); do
	python3 -c "import socket; socket.create_connection(('127.0.0.1',$port),1)" 2>/dev/null && break
	sleep 0.1
done

hz=$(getconf CLK_TCK)
ticks() { awk '{print $14+$15}' "/proc/$1/stat"; }
rss_mib() { awk '/VmRSS/{printf "%.0f", $2/1024}' "/proc/$1/status"; }
now() { date +%s.%N; }

start=$(now)
"$simbin" --nodes "$nodes" --broker "tcp://127.0.0.1:$port" "$@" >"$dir/sim.log" 2>&1 &
sim_pid=$!
until grep -q "all simulated nodes connected" "$dir/sim.log"; do
	kill -0 "$sim_pid" 2>/dev/null || { echo "fleetsim-idle: fleet-sim exited:" >&2; cat "$dir/sim.log" >&2; exit 1; }
	[ "$(echo "$(now) - $start > 600" | bc)" = 1 ] && { echo "fleetsim-idle: not connected in 600s" >&2; tail "$dir/sim.log" >&2; exit 1; }
	sleep 0.1
done
echo "fleetsim_nodes=$nodes"
echo "fleetsim_connect_s=$(echo "scale=1; ($(now) - $start)/1" | bc)"

sleep 20
s0=$(ticks "$sim_pid"); m0=$(ticks "$mosq_pid")
sleep "$idle"
s1=$(ticks "$sim_pid"); m1=$(ticks "$mosq_pid")
echo "fleetsim_cpu_pct=$(echo "scale=2; ($s1 - $s0) * 100 / $hz / $idle" | bc)"
echo "fleetsim_rss_mib=$(rss_mib "$sim_pid")"
echo "mosquitto_cpu_pct=$(echo "scale=2; ($m1 - $m0) * 100 / $hz / $idle" | bc)"
echo "mosquitto_rss_mib=$(rss_mib "$mosq_pid")"

t0=$(now)
kill -TERM "$sim_pid"
wait "$sim_pid" || { echo "fleetsim-idle: fleet-sim failed:" >&2; tail "$dir/sim.log" >&2; exit 1; }
sim_pid=
echo "fleetsim_stop_s=$(echo "scale=1; ($(now) - $t0)/1" | bc)"
echo "fleetsim_offline=$("$bin" ctl --broker "tcp://127.0.0.1:$port" get nodes | awk 'NR > 1 && $2 == "offline"' | wc -l)"
