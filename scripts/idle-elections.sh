#!/usr/bin/env bash
# Spurious elections under load: three replicas with the default timing sit idle while
# `ctrlog bench append` (its own cluster) keeps the machine's cores busy; at the end, the idle
# cluster's term must not have moved. Prints the terms before and after and the bench's line.
#
#   scripts/idle-elections.sh [seconds]      (default 600; release build of ctrlog on PATH or
#                                             CTRLOG=path/to/ctrlog)
set -euo pipefail
seconds="${1:-600}"
ctrlog="${CTRLOG:-ctrlog}"
dir="$(mktemp -d)"
trap 'kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$dir"' EXIT

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
members=""
declare -a clients
for id in 1 2 3; do
    peer="127.0.0.1:$(port)"
    client="127.0.0.1:$(port)"
    clients[$id]="$client"
    peers[$id]="$peer"
    members="${members:+$members,}$id=$peer/$client"
done
for id in 1 2 3; do
    RUST_LOG=warn "$ctrlog" serve --id "$id" --peer-addr "${peers[$id]}" \
        --client-addr "${clients[$id]}" --initial-members "$members" \
        --data "$dir/replica-$id" 2>"$dir/replica-$id.log" &
done
cluster="${clients[1]},${clients[2]},${clients[3]}"

# The term once a leader is known (fails until then).
term() {
    "$ctrlog" status --cluster "$cluster" --json | python3 -c '
import json, sys
status = json.load(sys.stdin)
assert status["leader_id"] is not None
print(status["term"])'
}
for _ in $(seq 1 100); do term >/dev/null 2>&1 && break; sleep 0.1; done
before="$(term)"
echo "idle cluster term before: $before; loading the machine for ${seconds} s"
"$ctrlog" bench append --clients 64 --duration-s "$seconds" | tail -n 1
after="$(term)"
echo "idle cluster term after: $after ($((after - before)) elections)"
