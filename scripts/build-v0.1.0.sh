#!/usr/bin/env bash
# Builds the ctrlog binary of v0.1.0 (commit 7ad98d6, the first stable release) once, and
# prints its path. tests/upgrade.rs runs it beside the current build to prove a rolling
# upgrade; the binary is kept in target/v0.1.0/, so later runs find it built.
#
# The build happens in a temporary worktree with v0.1.0's own Cargo.lock. Its target
# directory is CTRLOG_V010_TARGET if set: CI points it at the main target directory so the
# dependencies both builds share are compiled once (it runs this before `cargo test`, which
# links the current binary back into target/debug). Otherwise it is a directory of its own,
# which is what a nested build from inside `cargo test` needs (the outer cargo holds
# target/debug's lock).
set -euo pipefail
cd "$(dirname "$0")/.."
v010=7ad98d67a6cfe04edf75d32f919b2f4aef9eb7dc
out="$PWD/target/v0.1.0"
bin="$out/ctrlog"
if [ -x "$bin" ]; then
    echo "$bin"
    exit 0
fi
if ! git cat-file -e "$v010^{commit}" 2>/dev/null; then
    echo "commit $v010 (v0.1.0) is not in this clone; fetch the full history" >&2
    exit 1
fi
mkdir -p "$out"
target="${CTRLOG_V010_TARGET:-$out/build}"
tree="$(mktemp -d)/ctrlog-v0.1.0"
trap 'git worktree remove --force "$tree" >/dev/null 2>&1 || true' EXIT
git worktree add --detach "$tree" "$v010" >/dev/null 2>&1
(cd "$tree" && CARGO_TARGET_DIR="$target" cargo build --locked -q --bin ctrlog >&2)
# Copied under a name of this run's own, then renamed: a concurrent run never sees half a file.
cp "$target/debug/ctrlog" "$bin.partial.$$"
mv "$bin.partial.$$" "$bin"
echo "$bin"
