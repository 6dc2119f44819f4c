#!/usr/bin/env bash
# Installs everything the project needs on a fresh Debian machine, and nothing twice:
#   - Debian packages: PostgreSQL server (logical decoding, pgbench), MariaDB server, Java 17,
#     Maven, chromium;
#   - a Python 3.11 venv in .venv with the pinned project and dev tools;
#   - the JVM jars (Kafka broker, Spark-side Delta/Kafka connectors) resolved by mvn
#     from the pinned poms in stack/jvm/ into .cdc/jars/ (ignored by git);
#   - the Spark driver's class archive (.cdc/jars/spark-class-archive/), for faster JVM starts.
# Each step is skipped when its stamp matches, so a second run takes seconds.
# --python-only: just the venv (what the fast test layer needs: no services, no jars).
set -euo pipefail
PYTHON_ONLY=0
[[ "${1:-}" == "--python-only" ]] && PYTHON_ONLY=1
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
STATE="$ROOT/.cdc"
mkdir -p "$STATE/stamps" "$STATE/jars" "$STATE/logs"

say() { printf '[bootstrap] %s\n' "$*"; }
die() { printf '[bootstrap] ERROR: %s\n' "$*" >&2; exit 1; }

# --- Debian packages ---------------------------------------------------------
# Debian's postinst scripts enable the services they install; scripts/units.sh leaves the
# host's services as they were (the stack runs its own servers from .cdc/).
# shellcheck source=scripts/units.sh
. "$ROOT/scripts/units.sh"

need_apt=()
compgen -G "/usr/lib/postgresql/*/bin/postgres" >/dev/null || need_apt+=(postgresql postgresql-contrib)
compgen -G "/usr/lib/postgresql/*/bin/pgbench" >/dev/null || need_apt+=(postgresql-contrib)
# the polling source's database in the local stack (MariaDB; started from .cdc/, never as a service)
command -v mariadbd >/dev/null || [[ -x /usr/sbin/mariadbd ]] || need_apt+=(mariadb-server mariadb-client)
command -v java >/dev/null || need_apt+=(openjdk-17-jre-headless)
command -v mvn >/dev/null || need_apt+=(maven)
command -v curl >/dev/null || need_apt+=(curl)
# the UI screenshot test drives Debian's chromium headless (never a downloaded browser)
command -v chromium >/dev/null || need_apt+=(chromium)
command -v python3.11 >/dev/null || need_apt+=(python3.11 python3.11-venv)
if ((PYTHON_ONLY)); then
  need_apt=()
  command -v python3.11 >/dev/null || need_apt+=(python3.11 python3.11-venv)
fi
SUDO=""
if ((${#need_apt[@]})); then
  say "installing Debian packages: ${need_apt[*]}"
  if [[ $(id -u) -ne 0 ]]; then
    command -v sudo >/dev/null || die "need root (or sudo) to apt-get install ${need_apt[*]}"
    SUDO="sudo"
  fi
  units_before="$(enabled_units)"
  # The postgresql package's postinst would start a system cluster on 5432; we never use
  # it (our stack runs its own clusters from .cdc/), so keep apt from starting services.
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q
  $SUDO env RUNLEVEL=1 apt-get install -y -q --no-install-recommends "${need_apt[@]}" \
    || die "apt-get install ${need_apt[*]} failed (see the output above)"
  restore_units "$units_before"
fi

# The edge-values test writes money under another locale's lc_monetary (de_DE: '1.234,56 €'):
# compile that one locale from Debian's locale data if the machine lacks it (not in --python-only)
if ((!PYTHON_ONLY)) && ! locale -a 2>/dev/null | grep -qix 'de_DE.utf8'; then
  say "compiling the de_DE.UTF-8 locale (edge-values test)"
  LOCALE_SUDO=""
  [[ $(id -u) -eq 0 ]] || LOCALE_SUDO="sudo"
  command -v localedef >/dev/null || $LOCALE_SUDO env RUNLEVEL=1 apt-get install -y -q --no-install-recommends locales \
    || die "apt-get install locales failed"
  $LOCALE_SUDO localedef -i de_DE -f UTF-8 de_DE.UTF-8 || die "localedef de_DE.UTF-8 failed (package locales)"
fi

# --- JVM jars -------------------------------------------------------------------
resolve_jars() {  # $1 = name under stack/jvm/ and .cdc/jars/
  local name="$1" pom="stack/jvm/$1/pom.xml" out="$STATE/jars/$1"
  local stamp; stamp="$(sha256sum "$pom" | cut -c1-16)"
  if [[ "$(cat "$STATE/stamps/jars-$name" 2>/dev/null)" == "$stamp" ]] && compgen -G "$out/*.jar" >/dev/null; then
    return
  fi
  say "resolving $name jars with mvn (pinned in $pom)"
  rm -rf "$out"
  mvn -q -B -s "${CDC_MVN_SETTINGS:-stack/jvm/settings.xml}" -f "$pom" dependency:copy-dependencies -DoutputDirectory="$out" -DincludeScope=runtime \
    > "$STATE/logs/mvn-$name.log" 2>&1 \
    || { tail -20 "$STATE/logs/mvn-$name.log" >&2; die "mvn could not resolve $name jars; see .cdc/logs/mvn-$name.log"; }
  echo "$stamp" > "$STATE/stamps/jars-$name"
}
resolve_all_jars() {
  resolve_jars kafka
  resolve_jars spark
  resolve_jars connect   # Kafka Connect worker (test stack: the Debezium producer)
  resolve_jars debezium  # the Debezium PostgreSQL connector, on the worker's classpath
  resolve_jars s3proxy   # an S3-compatible store (test stack: the s3a:// lake)
}
# The jars download while pip installs (both wait on the network, not the CPU): on a fresh
# machine that saves minutes. One mvn at a time, as Maven's local repository is not safe
# for concurrent writers; a failure still stops the bootstrap, after pip, with mvn's log.
jars_pid=""
if ((!PYTHON_ONLY)); then
  resolve_all_jars &
  jars_pid=$!
  # a failed pip install must not leave mvn running behind the bootstrap's exit
  trap '[[ -n "$jars_pid" ]] && { pkill -P "$jars_pid"; kill "$jars_pid"; } 2>/dev/null' EXIT
fi

# --- Python venv --------------------------------------------------------------
PY="$(command -v python3.11 || true)"
[[ -n "$PY" ]] || die "python3.11 not found after install"
if [[ ! -x .venv/bin/python ]]; then
  say "creating .venv with $PY"
  "$PY" -m venv .venv || die "could not create .venv (on Debian: apt-get install python3.11-venv)"
fi
pip_stamp="$(sha256sum pyproject.toml | cut -c1-16)"
if [[ "$(cat "$STATE/stamps/pip" 2>/dev/null)" != "$pip_stamp" ]] || ! .venv/bin/python -c "import cdc_platform" 2>/dev/null; then
  say "installing Python packages (pinned in pyproject.toml)"
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e ".[dev]" || die "pip install failed (see the output above)"
  echo "$pip_stamp" > "$STATE/stamps/pip"
fi

((PYTHON_ONLY)) && { say "ready (python only)"; exit 0; }
wait "$jars_pid" || { jars_pid=""; die "the JVM jars could not be resolved (see the mvn output above)"; }
jars_pid=""

# --- the Spark driver's class archive -------------------------------------------
# Spark's classes as a warm JVM loaded them, mapped by every later driver instead of parsed
# again (devtools/spark_archive.py); built once per Java and pyspark, about a minute
.venv/bin/python -m cdc_platform.devtools.spark_archive --jars-dir "$STATE/jars/spark" \
  --log "$STATE/logs/spark-class-archive.log" \
  || die "could not build the Spark driver's class archive; see .cdc/logs/spark-class-archive.log"
say "ready"
