# Sourced by scripts/test and scripts/quickstart: create .venv if needed and
# install simdb into it (editable) with the extras named in $SIMDB_EXTRAS.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 10))'; then
    echo "simdb needs Python 3.10 or newer; $PYTHON is $("$PYTHON" --version 2>&1). Set PYTHON=/path/to/python3.x" >&2
    exit 1
fi
if [ ! -x "$ROOT/.venv/bin/python" ]; then
    "$PYTHON" -m venv "$ROOT/.venv"
fi
VENV_PYTHON="$ROOT/.venv/bin/python"
"$VENV_PYTHON" -m pip install --quiet --disable-pip-version-check --upgrade pip 2>&1 | grep -v "^WARNING: Location" || true
"$VENV_PYTHON" -m pip install --quiet --disable-pip-version-check -e "$ROOT${SIMDB_EXTRAS:+[$SIMDB_EXTRAS]}" 2>&1 \
    | grep -v "^WARNING: Location" || true
"$VENV_PYTHON" -c "import simdb" || { echo "installing simdb into $ROOT/.venv failed" >&2; exit 1; }
