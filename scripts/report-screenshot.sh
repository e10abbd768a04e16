#!/usr/bin/env bash
# Screenshot of the top of a real softmaxkit report (the README's picture), with headless Chromium.
#
#   scripts/report-screenshot.sh [REPORT_DIR] [OUT_PNG]
#
# REPORT_DIR defaults to softmaxkit-report; when it holds no index.html yet, the script first
# runs `softmaxkit report --quick --out REPORT_DIR` (a few minutes on 2 cores). OUT_PNG defaults
# to docs/report-screenshot.png. Needs Chromium (Debian: apt-get install chromium); the
# Python used is $PYTHON, else .venv/bin/python, else python3.
set -euo pipefail

dir=${1:-softmaxkit-report}
out=${2:-docs/report-screenshot.png}
width=${WIDTH:-1280}
height=${HEIGHT:-2300}

chromium=$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)
if [ -z "$chromium" ]; then
    echo "error: no chromium on PATH (Debian: apt-get install chromium)" >&2
    exit 2
fi
if [ ! -f "$dir/index.html" ]; then
    python=${PYTHON:-}
    if [ -z "$python" ]; then
        if [ -x .venv/bin/python ]; then python=.venv/bin/python; else python=python3; fi
    fi
    echo "no $dir/index.html: running softmaxkit report --quick --out $dir" >&2
    "$python" -m softmaxkit.cli report --quick --out "$dir"
fi

mkdir -p "$(dirname "$out")"
target=$(realpath -m "$out")
# --no-sandbox: Chromium refuses to start as root otherwise (containers, CI)
"$chromium" --headless --no-sandbox --disable-gpu --hide-scrollbars --force-device-scale-factor=1 \
    --window-size="$width,$height" --virtual-time-budget=5000 \
    --screenshot="$target" "file://$(realpath "$dir/index.html")" 2>/dev/null
test -s "$target"
echo "wrote $out (${width}x${height}, top of $dir/index.html)"
