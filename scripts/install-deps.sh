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
# Rust: rustup's default profile (rustfmt and clippy included: .ci/run checks both).
cargo_was_on_path=
command -v cargo >/dev/null 2>&1 && cargo_was_on_path=1
if [ -z "$cargo_was_on_path" ] && [ ! -x "$HOME/.cargo/bin/cargo" ]; then
  echo "installing Rust with rustup"
  curl -sSf https://sh.rustup.rs | sh -s -- -y --profile default
fi
# tests/package.rs builds the .deb (scripts/package.sh) with cargo-deb.
cargo_bin=$(command -v cargo || echo "$HOME/.cargo/bin/cargo")
if [ -x "$cargo_bin" ] && ! "$cargo_bin" deb --version >/dev/null 2>&1; then
  echo "installing cargo-deb"
  "$cargo_bin" install cargo-deb --locked --version 3.8.0 --quiet
fi
# The README runs `scripts/install-deps.sh && cargo …` in one shell, which cannot pick up
# ~/.cargo/env: rustup's tools are linked into /usr/local/bin (on every Debian PATH) so that
# cargo is found in that same command. rustup's proxies tell the tool by the name they are
# called with, so a link works as the original does.
if [ -z "$cargo_was_on_path" ] && [ -d "$HOME/.cargo/bin" ]; then
  for tool in "$HOME"/.cargo/bin/*; do
    name=$(basename "$tool")
    [ -e "/usr/local/bin/$name" ] || ln -s "$tool" "/usr/local/bin/$name"
  done
  echo "linked the Rust tools of $HOME/.cargo/bin into /usr/local/bin"
fi
