#!/usr/bin/env bash
# Apache Superset against a real dpgate, through Superset's own code paths.
#
# Not part of `make test`: it installs Superset (hundreds of MB) into its own venv.
#
#   integration/superset.sh            # everything under $WORK (default /tmp/dpgate-superset)
#
# Environment:
#   WORK              working folder (venv, Superset metadata DB, dpgate demo, logs)
#   SUPERSET_VERSION  PyPI version to install (default 6.1.0)
#   SUPERSET_VENV     reuse an existing venv that already has apache-superset
#   DPGATE_PYTHON     Python with dpgate installed (default: the repo's .venv)
#
# Steps: install Superset + this repo's client (no deps) into the Superset venv → build
# the dpgate demo and serve it on a free port → initialise Superset (SQLite metadata) →
# run integration/superset_check.py: test connection, register dpgate by URL, list
# schemas/tables, read table metadata, create a dataset, run a bar-chart GROUP BY via
# /api/v1/chart/data, create a virtual (SQL-defined) dataset and chart SUM/AVG over it
# (nested aggregation), and an aggregate via SQL Lab. The SQL Superset sent is printed
# from the dpgate_client debug log and dpgate's own request history.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WORK="${WORK:-/tmp/dpgate-superset}"
SUPERSET_VERSION="${SUPERSET_VERSION:-6.1.0}"
SUPERSET_VENV="${SUPERSET_VENV:-$WORK/venv}"
DPGATE_PYTHON="${DPGATE_PYTHON:-$REPO/.venv/bin/python}"
mkdir -p "$WORK"
LOG="$WORK/logs"
mkdir -p "$LOG"

say() { printf '\n== %s\n' "$*"; }

# --- 1. Superset and the dpgate client in their own venv --------------------------------
if [ ! -x "$SUPERSET_VENV/bin/superset" ]; then
  say "installing apache-superset==$SUPERSET_VERSION into $SUPERSET_VENV"
  python3 -m venv "$SUPERSET_VENV"
  "$SUPERSET_VENV/bin/pip" install --quiet --upgrade pip
  "$SUPERSET_VENV/bin/pip" install --quiet "apache-superset==$SUPERSET_VERSION"
fi
# Superset 6.1 from PyPI resolves flask-caching 2.5, whose cache-key API it does not
# match (TypeError in `superset db upgrade`); its own lock file uses 2.3. And its CLI
# imports `rich` (for `superset test-db`) and its engine specs `cachetools`, undeclared.
"$SUPERSET_VENV/bin/pip" install --quiet "flask-caching>=2.1,<2.4" rich cachetools
say "installing the dpgate client (dialect entry points) into the Superset venv"
"$SUPERSET_VENV/bin/pip" install --quiet --no-deps -e "$REPO"
# Superset finds engine specs through the `superset.db_engine_specs` entry point, which
# pyproject.toml declares. For an older checkout that lacks it, register
# dpgate_client.superset:DpgateEngineSpec with a metadata-only shim (without it Superset
# uses its generic spec, which also works; errors then read "base error: …").
"$SUPERSET_VENV/bin/python" - <<'PY'
import importlib.metadata as md
import pathlib
import sysconfig

if not any(ep.name == "dpgate" for ep in md.entry_points(group="superset.db_engine_specs")):
    site = pathlib.Path(sysconfig.get_paths()["purelib"])
    info = site / "dpgate_superset_spec-0.0.0.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: dpgate-superset-spec\nVersion: 0.0.0\n"
    )
    (info / "entry_points.txt").write_text(
        "[superset.db_engine_specs]\ndpgate = dpgate_client.superset:DpgateEngineSpec\n"
    )
    print("registered the dpgate Superset engine spec via", info)
PY
"$SUPERSET_VENV/bin/python" - <<'EOF'
import sqlalchemy
from sqlalchemy.dialects import registry
print("SQLAlchemy", sqlalchemy.__version__, "dialect:", registry.load("dpgate"))
EOF

# --- 2. a dpgate demo on a free port -----------------------------------------------------
PORT="$("$DPGATE_PYTHON" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
export DPGATE_ADMIN_KEY="${DPGATE_ADMIN_KEY:-it-admin-$(date +%s)-$RANDOM$RANDOM}"
say "building the dpgate demo in $WORK/demo"
rm -rf "$WORK/demo"
"$DPGATE_PYTHON" -m gateway.cli demo --dir "$WORK/demo" --no-serve --port "$PORT" | tee "$LOG/demo.txt"
KEY="$(sed -n 's/^ *demo analyst key: *//p' "$LOG/demo.txt" | head -1)"
[ -n "$KEY" ] || { echo "could not read the demo analyst key" >&2; exit 1; }
say "serving dpgate on 127.0.0.1:$PORT"
"$DPGATE_PYTHON" -m gateway.cli serve --config "$WORK/demo/dpgate.yaml" \
  --host 127.0.0.1 --port "$PORT" --workers 1 >"$LOG/dpgate.log" 2>&1 &
DPGATE_PID=$!
trap 'kill "$DPGATE_PID" 2>/dev/null || true' EXIT
for _ in $(seq 1 100); do
  curl -fsS "http://127.0.0.1:$PORT/healthz" >/dev/null 2>&1 && break
  kill -0 "$DPGATE_PID" 2>/dev/null || { cat "$LOG/dpgate.log"; exit 1; }
  sleep 0.3
done

# --- 3. Superset metadata DB and admin user ----------------------------------------------
# A fresh metadata DB each run: it holds secrets encrypted with this run's SECRET_KEY.
rm -f "$WORK/superset.db"
cat >"$WORK/superset_config.py" <<EOF
SECRET_KEY = "dpgate-integration-$(date +%s)-not-a-production-secret"
SQLALCHEMY_DATABASE_URI = "sqlite:///$WORK/superset.db"
WTF_CSRF_ENABLED = False
TALISMAN_ENABLED = False
PREVENT_UNSAFE_DB_CONNECTIONS = False
# In-process caches: nothing here needs Superset's metastore cache.
_SIMPLE = {"CACHE_TYPE": "SimpleCache", "CACHE_DEFAULT_TIMEOUT": 300}
CACHE_CONFIG = DATA_CACHE_CONFIG = _SIMPLE
FILTER_STATE_CACHE_CONFIG = EXPLORE_FORM_DATA_CACHE_CONFIG = _SIMPLE
EOF
export SUPERSET_CONFIG_PATH="$WORK/superset_config.py"
export FLASK_APP=superset
say "initialising Superset (db upgrade, admin user, roles)"
"$SUPERSET_VENV/bin/superset" db upgrade >"$LOG/superset-init.log" 2>&1
"$SUPERSET_VENV/bin/superset" fab create-admin --username admin --firstname a --lastname b \
  --email admin@example.com --password admin >>"$LOG/superset-init.log" 2>&1 || true
"$SUPERSET_VENV/bin/superset" init >>"$LOG/superset-init.log" 2>&1

# --- 4. Superset's own paths against dpgate ----------------------------------------------
# The key travels as the URL password so Superset masks it in its UI.
URI="dpgate://demo:$KEY@127.0.0.1:$PORT?epsilon=0.2"
say "superset test-db (Superset's dialect checklist)"
"$SUPERSET_VENV/bin/superset" test-db "$URI" -c '{}' >"$LOG/test-db.txt" 2>&1 || true
sed 's/\x1b\[[0-9;]*m//g' "$LOG/test-db.txt" | tail -40
say "registering dpgate and charting through Superset's REST API"
set +e
"$SUPERSET_VENV/bin/python" "$REPO/integration/superset_check.py" "$URI" "$WORK/report.json" \
  2>"$LOG/superset-check.log"
STATUS=$?
set -e

say "SQL Superset sent to dpgate (dpgate_client debug log)"
grep -o 'POST http[^ ]*/v1/query .*' "$LOG/superset-check.log" | sed 's/^POST [^ ]* //' || true
say "dpgate's own history for the demo analyst"
curl -fsS "http://127.0.0.1:$PORT/v1/queries" -H "Authorization: Bearer $KEY" \
  | "$DPGATE_PYTHON" -c 'import json,sys; [print(q["outcome"], "|", q["sql"]) for q in json.load(sys.stdin)["queries"]]' || true
echo
echo "report: $WORK/report.json   logs: $LOG"
[ "$STATUS" -eq 0 ] && echo "SUPERSET INTEGRATION: OK" || echo "SUPERSET INTEGRATION: FAILED"
exit "$STATUS"
