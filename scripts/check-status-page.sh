#!/usr/bin/env bash
# Renders a live replica's status page in headless Chromium (Debian's `chromium`) and checks
# what the page's own script drew: the leader's role, the containers, the four running tasks,
# and the charts with their marks. Leaves the screenshot at target/status-page.png.
#
#   scripts/check-status-page.sh        (CI runs it after installing chromium)
set -euo pipefail
cd "$(dirname "$0")/.."

chromium_bin=$(command -v chromium || command -v chromium-browser || true)
if [ -z "$chromium_bin" ]; then
    echo "chromium is not installed (apt-get install chromium)" >&2
    exit 1
fi

cargo build -q --example status_page
out=$(mktemp)
err=$(mktemp)
# At most ten minutes; killed as soon as the check is done.
target/debug/examples/status_page 600 >"$out" 2>"$err" &
job=$!
trap 'kill "$job" 2>/dev/null || true; wait "$job" 2>/dev/null || true; rm -f "$out" "$err"' EXIT

for _ in $(seq 1 600); do
    url=$(head -n1 "$out" 2>/dev/null || true)
    [ -n "$url" ] && break
    sleep 0.1
done
if [ -z "${url:-}" ]; then
    echo "the example printed no URL" >&2
    cat "$err" >&2
    exit 1
fi

flags=(--headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1100,900
       --virtual-time-budget=4000)
dom=$("$chromium_bin" "${flags[@]}" --dump-dom "$url" 2>/dev/null | tr -d '\0')
"$chromium_bin" "${flags[@]}" --screenshot="$PWD/target/status-page.png" "$url" 2>/dev/null

fail=0
expect() {
    if ! grep -q -- "$1" <<<"$dom"; then
        echo "the rendered page lacks: $1" >&2
        fail=1
    fi
}
expect '<span id="id">[0-9]'
expect 'ctrlog [0-9][^:]*: Leader, term [0-9]'
expect '<td>container-1</td>'
expect '<td>container-2</td>'
for p in 0 1 2 3; do expect "<td>partition-$p</td><td>running</td>"; done
expect '<td>ack: partition-[0-3] started by container-[1-3]</td>'
# The charts, from /history.json: a line in each, and the marks the example's job made (it
# scaled out and lost its first leader before printing the URL).
for chart in commits containers lag; do
    expect "<svg id=\"chart-$chart\"[^>]*>.*<polyline class=\"series\""
done
expect 'class="mark leader"'
expect 'class="mark scale"'
expect 'lag of container-3'
expect '(desired 3, live 3)'
[ -s target/status-page.png ] || { echo "no screenshot was written" >&2; fail=1; }
[ "$fail" = 0 ] && echo "status page OK: $url rendered, screenshot at target/status-page.png"
exit "$fail"
