#!/usr/bin/env bash
# Writes the Secrets that ctrlog.yaml and containers.yaml mount, one per holder, each with
# only what its holder needs:
#
#   ctrlog-replica-N   ca.pem (the CA's certificate, not its key), node.pem and node-key.pem
#                      (replica N's own), tokens (hashed: a replica holds no usable token)
#   ctrlog-container   ca.pem, token (the role containers:ctrlog-containers-)
#
# Into OUT (created 0700; keep it off the cluster):
#
#   pki/           the CA (ca-key.pem signs renewals: keep it offline) and every leaf
#   tokens         the plaintext tokens: the operator's and the containers'
#   operator-token the operator's token alone, for CTRLOG_TOKEN_FILE
#   secrets.yaml   the Secrets: kubectl apply -f OUT/secrets.yaml
#
# A CA already in OUT/pki is kept, and so are OUT/tokens; run it again to rewrite the Secrets.
#
#   deploy/kubernetes/secrets.sh OUT
#   CTRLOG=target/release/ctrlog NAMESPACE=ctrlog-job deploy/kubernetes/secrets.sh OUT
set -euo pipefail

out=${1:?usage: $0 OUT}
ctrlog=${CTRLOG:-ctrlog}
namespace=${NAMESPACE:-ctrlog-job}
replicas=(1 2 3)
container_prefix=ctrlog-containers-

umask 077
mkdir -p "$out"
chmod 700 "$out"

if [ ! -e "$out/pki/ca.pem" ]; then
    hosts=()
    for id in "${replicas[@]}"; do
        hosts+=("ctrlog-$id-0.ctrlog.$namespace.svc.cluster.local")
    done
    nodes=$(IFS=,; echo "${replicas[*]}")
    "$ctrlog" certs generate --out "$out/pki" --nodes "$nodes" \
        --hosts "$(IFS=,; echo "${hosts[*]}")" >/dev/null
fi

new_token() { head -c 32 /dev/urandom | base64 -w0 | tr '+/' '-_' | tr -d '='; }
if [ ! -e "$out/tokens" ]; then
    {
        echo "$(new_token) operator"
        echo "$(new_token) containers:$container_prefix"
    } >"$out/tokens"
fi
awk '$2 == "operator" { print $1; exit }' "$out/tokens" >"$out/operator-token"
container_token=$(awk -v role="containers:$container_prefix" '$2 == role { print $1; exit }' \
    "$out/tokens")
hashed=$("$ctrlog" tokens hash "$out/tokens")

encode() { base64 -w0; }
secret() { # NAME, then KEY=VALUE... with the values already base64
    printf -- '---\napiVersion: v1\nkind: Secret\nmetadata:\n  name: %s\n  namespace: %s\n' \
        "$1" "$namespace"
    printf 'type: Opaque\ndata:\n'
    shift
    for pair in "$@"; do
        printf '  %s: %s\n' "${pair%%=*}" "${pair#*=}"
    done
}

ca=$(encode <"$out/pki/ca.pem")
{
    echo "# Written by deploy/kubernetes/secrets.sh: one Secret per holder (see the script)."
    for id in "${replicas[@]}"; do
        secret "ctrlog-replica-$id" \
            "ca.pem=$ca" \
            "node.pem=$(encode <"$out/pki/node-$id.pem")" \
            "node-key.pem=$(encode <"$out/pki/node-$id-key.pem")" \
            "tokens=$(printf '%s\n' "$hashed" | encode)"
    done
    secret ctrlog-container \
        "ca.pem=$ca" \
        "token=$(printf '%s\n' "$container_token" | encode)"
} >"$out/secrets.yaml"

echo "wrote $out/secrets.yaml: kubectl apply -f $out/secrets.yaml"
echo "the operator's token is in $out/operator-token; keep $out/pki/ca-key.pem offline"
