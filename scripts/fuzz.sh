#!/usr/bin/env bash
# Runs every libFuzzer target of tests/fuzz for a bounded time (make fuzz FUZZ_SECONDS=N), from
# its seed corpus. A crash is copied into tests/fuzz/corpus/<target>/ (so `make test` replays it
# from then on) and fails the run. Prints executions per target, for docs/security.md.
set -euo pipefail
build=${1:-build-fuzz}
seconds=${2:-60}
root=$(cd "$(dirname "$0")/.." && pwd)
status=0
for binary in "$build"/tests/fuzz/fuzz_*; do
  target=$(basename "$binary" | sed 's/^fuzz_//')
  seeds="$root/tests/fuzz/corpus/$target"
  work="$build/fuzz-corpus/$target"
  artifacts="$build/fuzz-artifacts/$target"
  mkdir -p "$work" "$artifacts"
  log="$build/fuzz-$target.log"
  set +e
  "$binary" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
    -artifact_prefix="$artifacts/" "$work" "$seeds" >"$log" 2>&1
  rc=$?
  set -e
  runs=$(grep -o 'Done [0-9]* runs' "$log" | grep -o '[0-9]*' || echo "?")
  if [ "$rc" -ne 0 ]; then
    status=1
    for crash in "$artifacts"/*; do
      [ -f "$crash" ] || continue
      cp "$crash" "$seeds/$(basename "$crash")"
      echo "fuzz $target: CRASH kept as tests/fuzz/corpus/$target/$(basename "$crash")"
    done
    echo "fuzz $target: failed (exit $rc); see $log"
    tail -30 "$log"
  else
    echo "fuzz $target: $runs executions in ${seconds}s, no crash"
  fi
done
exit $status
