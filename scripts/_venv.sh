# Sourced by scripts/test and scripts/quickstart: create .venv if needed and
# install simdb into it (editable) with the extras named in $SIMDB_EXTRAS.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 10))'; then
    echo "simdb needs Python 3.10 or newer; $PYTHON is $("$PYTHON" --version 2>&1). Set PYTHON=/path/to/python3.x" >&2
    exit 1
fi
# What it does goes to standard error as it goes: on a fresh machine pip takes about a minute, which a quiet
# install spent in silence. pip's whole output is kept in .venv/pip.log; its steps (each package collected,
# the build, the install) are shown with the seconds since the install began.
if [ ! -x "$ROOT/.venv/bin/python" ]; then
    echo "simdb: creating a virtual environment in $ROOT/.venv" >&2
    "$PYTHON" -m venv "$ROOT/.venv"
fi
VENV_PYTHON="$ROOT/.venv/bin/python"
pip_steps() {
    local began=$SECONDS line
    while IFS= read -r line; do
        printf '%s\n' "$line" >> "$ROOT/.venv/pip.log"
        case "$line" in
            Collecting*|"Building wheel"*|"Building editable"*|"Installing collected"*|"Successfully installed"*|ERROR*)
                printf '  %3ds  %s\n' $((SECONDS - began)) "${line:0:110}" >&2 ;;
        esac
    done
}
: > "$ROOT/.venv/pip.log"
echo "simdb: installing simdb${SIMDB_EXTRAS:+ [$SIMDB_EXTRAS]} and its dependencies into .venv with pip" \
     "(about a minute on a fresh machine; nothing to fetch when they are there)" >&2
{ "$VENV_PYTHON" -m pip install --disable-pip-version-check --progress-bar off --upgrade pip 2>&1 || true; } | pip_steps
{ "$VENV_PYTHON" -m pip install --disable-pip-version-check --progress-bar off -e "$ROOT${SIMDB_EXTRAS:+[$SIMDB_EXTRAS]}" \
    2>&1 || true; } | pip_steps
"$VENV_PYTHON" -c "import simdb" || {
    echo "installing simdb into $ROOT/.venv failed; pip's output is in $ROOT/.venv/pip.log" >&2; exit 1; }
echo "simdb: installed ($("$ROOT/.venv/bin/simdb" --version))" >&2
