#!/usr/bin/env bash
# Builds .corpus/ (the demo model's training text) from Debian packages on this machine.
# Idempotent: installs the packages only when missing and rebuilds only when the extractor
# changed (its hash is the stamp in .corpus/SOURCES.txt) or when --force is given.
# Usage: bash tools/build_corpus.sh [--force]   (run from anywhere; writes <repo>/.corpus)
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="$repo/.corpus"
extractor="$repo/tools/corpus_extract.py"
packages=(python3.11-doc manpages-zh libpython3.11-stdlib)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if ((${#missing[@]})); then
  echo "build_corpus: installing ${missing[*]}" >&2
  if [[ $(id -u) -ne 0 ]]; then
    echo "build_corpus: need root (or sudo) to apt-get install ${missing[*]}" >&2
    exit 1
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}" >&2
fi

stamp="$(sha256sum "$extractor" | cut -c1-16)"
if [[ "${1:-}" != "--force" && -f "$out/SOURCES.txt" ]] && grep -q "^stamp: $stamp$" "$out/SOURCES.txt"; then
  echo "build_corpus: $out is up to date (stamp $stamp)" >&2
  exit 0
fi

mkdir -p "$out"
/usr/bin/python3 "$extractor" --out "$out" --stamp "$stamp"
du -cb "$out"/*.txt | tail -1 >&2
