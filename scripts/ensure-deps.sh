#!/bin/sh
# ensure-deps.sh [TARGET] makes sure the tools a make target needs are
# installed, and no more:
#
#   demo, bench  go, PostgreSQL >= 14 server binaries (initdb, postgres,
#                pg_ctl) and redis-server
#   test         the same, promtool (the alert rules' tests) and pgbouncer
#                (the pooler tests start their own on a random port); the
#                default
#
# Missing ones are installed with apt-get when this runs as root on a
# Debian-like system; otherwise it says what to install and exits 1. It
# prints nothing when everything is present. An unknown target exits 2.
set -eu

MIN_PG=14
target=${1:-test}

case $target in
demo | bench) tools="postgres redis" ;;
test) tools="postgres redis promtool pgbouncer" ;;
*)
	echo "ensure-deps: unknown target '$target': use demo, bench or test" >&2
	exit 2
	;;
esac

# pg_bindir_ok DIR: DIR holds initdb, postgres and pg_ctl of version >= MIN_PG.
pg_bindir_ok() {
	for b in initdb postgres pg_ctl; do
		[ -x "$1/$b" ] || return 1
	done
	v=$("$1/postgres" --version 2>/dev/null | sed -n 's/.*(PostgreSQL) \([0-9][0-9]*\).*/\1/p')
	[ -n "$v" ] && [ "$v" -ge "$MIN_PG" ]
}

# have_postgres: the same search as internal/servers.FindPostgresBin.
have_postgres() {
	if p=$(command -v initdb 2>/dev/null); then
		pg_bindir_ok "$(dirname "$(readlink -f "$p")")" && return 0
		pg_bindir_ok "$(dirname "$p")" && return 0
	fi
	if d=$(pg_config --bindir 2>/dev/null); then
		pg_bindir_ok "$d" && return 0
	fi
	for d in $(printf '%s\n' /usr/lib/postgresql/*/bin | sort -t/ -k4,4 -rn); do
		pg_bindir_ok "$d" && return 0
	done
	return 1
}

have_redis() {
	command -v redis-server >/dev/null 2>&1 || [ -x /usr/bin/redis-server ] || [ -x /usr/local/bin/redis-server ]
}

have_pgbouncer() {
	command -v pgbouncer >/dev/null 2>&1 || [ -x /usr/sbin/pgbouncer ]
}

have_promtool() {
	command -v promtool >/dev/null 2>&1
}

if ! command -v go >/dev/null 2>&1; then
	echo "ensure-deps: go not found in PATH: install Go (see the go directive in go.mod) from https://go.dev/dl/" >&2
	if [ -x /usr/local/go/bin/go ]; then
		echo "ensure-deps: /usr/local/go/bin/go exists: add /usr/local/go/bin to PATH" >&2
	fi
	exit 1
fi

# missing lists the Debian packages of the target's tools that are not
# installed.
missing() {
	pkgs=
	for t in $tools; do
		case $t in
		postgres) have_postgres || pkgs="$pkgs postgresql" ;;
		redis) have_redis || pkgs="$pkgs redis-server" ;;
		promtool) have_promtool || pkgs="$pkgs prometheus" ;;
		pgbouncer) have_pgbouncer || pkgs="$pkgs pgbouncer" ;;
		esac
	done
	echo "$pkgs"
}

# describe names the tools that a package list stands for.
describe() {
	for p in $1; do
		case $p in
		postgresql) echo "  - PostgreSQL >= $MIN_PG server binaries (initdb, postgres, pg_ctl): package postgresql" ;;
		redis-server) echo "  - redis-server: package redis-server" ;;
		prometheus) echo "  - promtool, for the alert rules' tests: package prometheus" ;;
		pgbouncer) echo "  - pgbouncer, for the connection pooler tests: package pgbouncer" ;;
		esac
	done
}

pkgs=$(missing)
[ -z "$pkgs" ] && exit 0

if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
	{
		echo "ensure-deps: make $target needs tools that are not installed:"
		describe "$pkgs"
		echo "Install them with:"
		echo "    sudo apt-get install -y --no-install-recommends$pkgs"
	} >&2
	exit 1
fi

echo "ensure-deps: installing$pkgs (for make $target)" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >&2
# The packages' services (a system pgbouncer on port 6432, a redis-server
# on 6379) are not started: the tests start servers of their own on random
# ports. A policy-rc.d that says "forbidden" keeps invoke-rc.d from
# starting them, unless the system has a policy of its own.
policy=
if [ ! -e /usr/sbin/policy-rc.d ]; then
	policy=/usr/sbin/policy-rc.d
	printf '#!/bin/sh\nexit 101\n' >"$policy"
	chmod 755 "$policy"
	trap 'rm -f "$policy"' EXIT
fi
# shellcheck disable=SC2086 # the package list is meant to split
apt-get install -y -qq --no-install-recommends $pkgs >&2
if [ -n "$policy" ]; then
	rm -f "$policy"
	trap - EXIT
fi

pkgs=$(missing)
if [ -n "$pkgs" ]; then
	echo "ensure-deps: still missing after apt-get install:$pkgs" >&2
	exit 1
fi
