#!/usr/bin/env bash
# Installs what satpep's lab and tests need on Debian/Ubuntu (run as root). Idempotent.
set -euo pipefail
pkgs=(iproute2 nftables iptables iperf3 ethtool iputils-ping tcpdump nginx-light fonts-dejavu-core procps ca-certificates curl build-essential pkg-config clang libelf-dev zlib1g-dev libbpf-dev bpftool)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  apt-get update -qq
  # iperf3's package asks whether to start a daemon; the lab starts its own servers.
  echo "iperf3 iperf3/start_daemon boolean false" | debconf-set-selections
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
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
