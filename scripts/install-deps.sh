#!/usr/bin/env bash
# Installs the Debian packages normcore builds, tests and trains with (run as root), the
# Fashion-MNIST data set included, and any packages named as arguments (a script's own needs,
# e.g. clang). Skips apt-get entirely when everything is already installed.
#   install-deps.sh [package...]
set -euo pipefail

packages=(cmake ninja-build g++ ccache pkg-config libeigen3-dev nlohmann-json3-dev libgtest-dev zlib1g-dev libssl-dev libpng-dev
          clang-format dataset-fashion-mnist fortunes libonnx-dev libprotobuf-dev libonnx-testdata "$@")
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "normcore: build dependencies already installed"
  exit 0
fi
echo "normcore: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq "${missing[@]}" >/dev/null
