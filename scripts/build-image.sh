#!/usr/bin/env bash
# Builds the image that deploy/kubernetes runs, from this repository alone: no base image
# is pulled (deploy/Dockerfile is FROM scratch), so the build reaches no registry.
#
# 1. cargo build --release, then target/image/rootfs gets the stripped binary at
#    /usr/local/bin/ctrlog, every shared library `ldd` lists for it (at the same paths),
#    /etc/passwd and /etc/group with user and group 10001 (`ctrlog`, as the manifests' runAsUser),
#    and an empty /var/lib/ctrlog and /tmp.
# 2. With a Docker engine: docker build -t ctrlog:VERSION -f deploy/Dockerfile target/image.
#    Without one, it says so and leaves the context for a machine that has one.
# 3. --check (needs root, as CI has): runs the image's file system the way the manifests run
#    it, without an engine: a read-only root, user 10001, the Secret's files as the kubelet
#    mounts them with fsGroup (root:10001, mode 0440), the ConfigMap's ctrlog.toml, in a
#    network namespace of its own. The replica must start and answer /healthz, and `ctrlog
#    --version` must name this build.
#
# CTRLOG_IMAGE_BINARY=PATH takes a release build of ctrlog made already instead of building
# one (CI passes the one its release-mode tests built).
#
#   scripts/build-image.sh [--check]
set -euo pipefail
cd "$(dirname "$0")/.."

check=false
[ "${1:-}" = "--check" ] && check=true

version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
tag="ctrlog:${version%-dev}"

binary=${CTRLOG_IMAGE_BINARY:-}
if [ -z "$binary" ]; then
    cargo build --release --quiet --bin ctrlog
    binary=target/release/ctrlog
fi
context=target/image
rootfs=$context/rootfs
rm -rf "$context"
mkdir -p "$rootfs/usr/local/bin" "$rootfs/etc" "$rootfs/var/lib/ctrlog" "$rootfs/tmp"
chmod 1777 "$rootfs/tmp"
strip -o "$rootfs/usr/local/bin/ctrlog" "$binary"
# Each library at the path the dynamic loader will look for it (ldd prints both forms:
# "name => /path (addr)" and "/path (addr)"; the vDSO has no file).
ldd "$binary" | awk '/=>/ { print $3; next } /^[ \t]*\// { print $1 }' |
    while read -r library; do
        mkdir -p "$rootfs$(dirname "$library")"
        cp -L "$library" "$rootfs$library"
    done
echo 'ctrlog:x:10001:10001:ctrlog:/var/lib/ctrlog:/nonexistent' >"$rootfs/etc/passwd"
echo 'ctrlog:x:10001:' >"$rootfs/etc/group"
cp deploy/Dockerfile "$context/Dockerfile"
echo "image context in $context ($(du -sh "$rootfs" | cut -f1))"

if docker info >/dev/null 2>&1; then
    docker build -t "$tag" -f deploy/Dockerfile "$context"
else
    echo "no Docker engine here: on a machine with one, run"
    echo "  docker build -t $tag -f deploy/Dockerfile $context"
fi

$check || exit 0

# --- the image's file system, run as the manifests run it ---------------------------------
printed=$(chroot --userspec=10001:10001 "$rootfs" /usr/local/bin/ctrlog --version)
[ "$printed" = "ctrlog $version" ] || {
    echo "FAIL: the image's ctrlog --version printed '$printed', not 'ctrlog $version'" >&2
    exit 1
}

secrets=$(mktemp -d)
trap 'rm -rf "$secrets"' EXIT
CTRLOG="$binary" deploy/kubernetes/secrets.sh "$secrets/out" >/dev/null
# What the kubelet writes for the Secret ctrlog-replica-1 (defaultMode 0400, fsGroup 10001).
mounted=$secrets/ctrlog-replica-1
mkdir "$mounted"
cp "$secrets/out/pki/ca.pem" "$mounted/ca.pem"
cp "$secrets/out/pki/node-1.pem" "$mounted/node.pem"
cp "$secrets/out/pki/node-1-key.pem" "$mounted/node-key.pem"
"$binary" tokens hash "$secrets/out/tokens" >"$mounted/tokens"
chown 0:10001 "$mounted"/*
chmod 0440 "$mounted"/*
# The ConfigMap, as mounted.
configmap=$secrets/config
mkdir "$configmap"
# PyYAML: in scripts/validate-kubernetes.sh's venv (CI runs that first), or the system's.
py=target/kubernetes-validate-venv/bin/python
[ -x "$py" ] || py=python3
"$py" - deploy/kubernetes/ctrlog.yaml "$configmap" <<'PY'
import sys, yaml
manifest, into = sys.argv[1:]
for doc in yaml.safe_load_all(open(manifest)):
    if doc and doc["kind"] == "ConfigMap":
        for key, text in doc["data"].items():
            open(f"{into}/{key}", "w").write(text)
PY

cat >"$secrets/run-in-namespace.sh" <<'SH'
set -euo pipefail
rootfs=$1 mounted=$2 configmap=$3
ip link set lo up
mkdir -p "$rootfs/etc/ctrlog-secrets" "$rootfs/etc/ctrlog"
mount --bind "$rootfs" "$rootfs"
mount -o remount,bind,ro "$rootfs"
mount -t tmpfs -o mode=0770,gid=10001 data "$rootfs/var/lib/ctrlog"
mount --bind -o ro "$mounted" "$rootfs/etc/ctrlog-secrets"
mount --bind -o ro "$configmap" "$rootfs/etc/ctrlog"
if chroot --userspec=10001:10001 "$rootfs" /usr/local/bin/ctrlog --version >/dev/null &&
   touch "$rootfs/usr/local/bin/x" 2>/dev/null; then
    echo "FAIL: the root file system is writable" >&2
    exit 1
fi
chroot --userspec=10001:10001 "$rootfs" /usr/local/bin/ctrlog serve \
    --config /etc/ctrlog/ctrlog.toml --id 1 >"$configmap/../replica.log" 2>&1 &
replica=$!
for _ in $(seq 100); do
    if curl -fsS http://127.0.0.1:7080/healthz >/dev/null 2>&1; then
        kill "$replica"
        wait "$replica" || true
        echo "the image's replica served /healthz as user 10001 on a read-only root"
        exit 0
    fi
    kill -0 "$replica" 2>/dev/null || break
    sleep 0.1
done
echo "FAIL: the image's replica did not serve /healthz; its log:" >&2
cat "$configmap/../replica.log" >&2
kill "$replica" 2>/dev/null || true
exit 1
SH
unshare --mount --net --fork bash "$secrets/run-in-namespace.sh" "$PWD/$rootfs" "$mounted" "$configmap"
