#!/usr/bin/env bash
# Regenerates tests/fixtures/v0.1.0/wire/*.bin with v0.1.0's own code: builds commit 7ad98d6
# in a temporary worktree (its own Cargo.lock, its own target directory) with
# tests/fixtures/v0.1.0/wire/generate.rs as an example, and runs it. The bytes are then what
# v0.1.0 puts on the wire; tests/wire_compat.rs holds every later build to them.
set -euo pipefail
cd "$(dirname "$0")/.."
v010=7ad98d6
out="$PWD/tests/fixtures/v0.1.0/wire"
tree="$(mktemp -d)/ctrlog-$v010"
trap 'git worktree remove --force "$tree" >/dev/null 2>&1 || true' EXIT
git worktree add --detach "$tree" "$v010" >/dev/null
cp "$out/generate.rs" "$tree/examples/wire_fixtures.rs"
(cd "$tree" && CARGO_TARGET_DIR="${CTRLOG_V010_TARGET:-${TMPDIR:-/tmp}/ctrlog-$v010-target}" \
    cargo run --locked -q --example wire_fixtures -- "$out")
ls "$out"/*.bin | wc -l
