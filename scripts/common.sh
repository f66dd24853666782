# Sourced by install.sh, setup_and_demo.sh and setup_and_test.sh: picks the interpreter, $PY.
#
# $PYTHON if set; else the ./.venv a previous run made; else python3 (an active venv or conda
# environment included), unless that is a distribution's externally managed Python (PEP 668:
# pip refuses to install into it). Then ./.venv is made from it and used; activate it
# (`. .venv/bin/activate`) to use persistent_gemm afterwards.
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
die() { echo "persistent_gemm setup: $*" >&2; exit 1; }

if [ -n "${PYTHON:-}" ]; then
  PY=$PYTHON
elif [ -z "${VIRTUAL_ENV:-}${CONDA_PREFIX:-}" ] && [ -x "$ROOT/.venv/bin/python" ]; then
  PY=$ROOT/.venv/bin/python
else
  PY=python3
  command -v "$PY" >/dev/null || die "no python3 on PATH (set PYTHON to your interpreter)"
  if "$PY" -c 'import os, sys, sysconfig; sys.exit(not (sys.prefix == sys.base_prefix and os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED"))))'; then
    echo "== $(command -v "$PY") is externally managed (PEP 668): making $ROOT/.venv"
    "$PY" -m venv "$ROOT/.venv" || die "could not make a venv (on Debian/Ubuntu: apt install python3-venv)"
    echo '*' > "$ROOT/.venv/.gitignore"  # keep git status clean (Python < 3.13 does not write it)
    PY=$ROOT/.venv/bin/python
  fi
fi
command -v "$PY" >/dev/null || die "no '$PY' (set PYTHON to your interpreter)"
