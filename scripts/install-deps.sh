#!/usr/bin/env bash
# Installs what satpep's lab and tests need on Debian/Ubuntu (run as root). Idempotent.
set -euo pipefail
pkgs=(iproute2 nftables iptables iperf3 ethtool iputils-ping tcpdump nginx-light fonts-dejavu-core procps ca-certificates curl build-essential pkg-config clang libelf-dev zlib1g-dev libbpf-dev bpftool strace systemd)
# For tests/observability.rs, installed without its recommends (node exporters).
lean=(prometheus)
installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
missing_full=()
missing_lean=()
for p in "${pkgs[@]}"; do installed "$p" || missing_full+=("$p"); done
for p in "${lean[@]}"; do installed "$p" || missing_lean+=("$p"); done
missing=("${missing_full[@]}" "${missing_lean[@]}")
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  apt-get update -qq
  # iperf3's package asks whether to start a daemon; the lab starts its own servers.
  echo "iperf3 iperf3/start_daemon boolean false" | debconf-set-selections
  # Nor should packages start their services (nginx, prometheus: the tests run their own,
  # inside lab namespaces); policy-rc.d says no to every start while installing.
  made_policy=
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
    chmod +x /usr/sbin/policy-rc.d
    made_policy=1
  fi
  if [ ${#missing_full[@]} -gt 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing_full[@]}" >/dev/null
  fi
  if [ ${#missing_lean[@]} -gt 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing_lean[@]}" >/dev/null
  fi
  if [ -n "$made_policy" ]; then rm -f /usr/sbin/policy-rc.d; fi
fi
if ! command -v cargo >/dev/null 2>&1; then
  if [ -x "$HOME/.cargo/bin/cargo" ]; then
    echo "cargo is in ~/.cargo/bin: add it to PATH (source ~/.cargo/env)"
  else
    echo "installing Rust with rustup"
    curl -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal
    echo "run: source ~/.cargo/env"
  fi
fi
# tests/package.rs builds the .deb (scripts/package.sh) with cargo-deb.
cargo_bin=$(command -v cargo || echo "$HOME/.cargo/bin/cargo")
if [ -x "$cargo_bin" ] && ! "$cargo_bin" deb --version >/dev/null 2>&1; then
  echo "installing cargo-deb"
  "$cargo_bin" install cargo-deb --locked --version 3.8.0 --quiet
fi
