#!/usr/bin/env bash
# Installs the Debian packages difflet needs, skipping what is already installed.
# Idempotent; needs root (or sudo) only when something is missing.
set -euo pipefail
pkgs=(cmake make gcc pkg-config libdnnl-dev libopenblas-openmp-dev libxxhash-dev libcjson-dev libutf8proc-dev libpng-dev libjpeg62-turbo-dev libwebp-dev libavcodec-dev libavformat-dev libavutil-dev libswscale-dev ffmpeg libmicrohttpd-dev libsqlite3-dev libopenmpi-dev openmpi-bin)
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
command -v python3 >/dev/null 2>&1 || missing+=(python3) # the serve test's HTTP client (standard library only)
command -v chromium >/dev/null 2>&1 || missing+=(chromium) # the serve test's browser screenshot
if [ ${#missing[@]} -eq 0 ]; then
    echo "deps: all ${#pkgs[@]} packages present"
    exit 0
fi
echo "deps: installing ${missing[*]}"
sudo=""
[ "$(id -u)" = 0 ] || sudo="sudo"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
