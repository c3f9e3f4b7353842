#!/usr/bin/env bash
# Fuzzes satpep's parsers of untrusted input with cargo-fuzz (libFuzzer, AddressSanitizer):
# the tunnel's flow header and stream reordering (what a peer sends), and the proxy, link and
# scenario configuration files. Any crash or failed property stops the run with the input
# saved under fuzz/artifacts/TARGET/.
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]     (default: 60 s, every target)
#   scripts/fuzz.sh 60                                   (before a release; CI does not run it)
#   scripts/fuzz.sh 3600 flow_header                     (a long run of one target)
#
# cargo-fuzz passes nightly-only -Z flags to rustc; RUSTC_BOOTSTRAP=1 lets the stable
# toolchain accept them, so no nightly toolchain is needed.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
secs="${1:-60}"
shift || true
command -v cargo-fuzz >/dev/null 2>&1 || cargo install cargo-fuzz --locked --version 0.13.2
export RUSTC_BOOTSTRAP=1
cd fuzz
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  mapfile -t targets < <(cargo fuzz list)
fi
cargo fuzz build -O
for t in "${targets[@]}"; do
  mkdir -p "corpus/$t"
  log="$(mktemp)"
  if ! cargo fuzz run -O "$t" "corpus/$t" -- -max_total_time="$secs" -print_final_stats=1 >"$log" 2>&1; then
    tail -60 "$log"
    echo "fuzz: $t FAILED (input saved under fuzz/artifacts/$t/)"
    exit 1
  fi
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo '?')
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | grep -o '[0-9]*' || echo '?')
  echo "fuzz: $t: $runs runs in ${secs} s, $cov coverage points, no failure"
  rm -f "$log"
done
