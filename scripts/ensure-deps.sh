#!/bin/sh
# ensure-deps.sh [TARGET] makes sure the tools a make target needs are
# installed, and no more:
#
#   demo, bench  go, PostgreSQL >= 14 server binaries (initdb, postgres,
#                pg_ctl), redis-server and redis-cli (the test kit joins a
#                Redis Cluster with redis-cli --cluster create)
#   test         the same, promtool (the alert rules' tests),
#                systemd-analyze (the systemd unit's test) and pgbouncer
#                (the pooler tests start their own on a random port); the
#
# Missing ones are installed with apt-get when this runs as root on a
# Debian-like system; otherwise it says what to install and exits 1. It
# prints nothing when everything is present. An unknown target exits 2.
#
# promtool is not installed with Debian's prometheus package, which brings
# a Prometheus server (started at boot on a systemd host) and a dozen
# packages with it: the package is downloaded (apt-get download, which
# needs no root once the package lists exist) and only promtool is
# extracted from it (dpkg -x) into the tools cache,
#
#     ${WALCOUNT_TOOLS_CACHE:-/var/tmp/walcount/tools}/bin/promtool
#
# where the tests look for it when it is not in PATH. Nothing is started.
set -eu

MIN_PG=14
target=${1:-test}
TOOLS_CACHE=${WALCOUNT_TOOLS_CACHE:-/var/tmp/walcount/tools}

case $target in
demo | bench) tools="postgres redis" ;;
test) tools="postgres redis promtool systemd-analyze pgbouncer" ;;
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

# have_postgres: the same search as internal/testkit/servers.FindPostgresBin.
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

have_redis_cli() {
	command -v redis-cli >/dev/null 2>&1 || [ -x /usr/bin/redis-cli ] || [ -x /usr/local/bin/redis-cli ]
}

have_pgbouncer() {
	command -v pgbouncer >/dev/null 2>&1 || [ -x /usr/sbin/pgbouncer ]
}

have_promtool() {
	command -v promtool >/dev/null 2>&1 || [ -x "$TOOLS_CACHE/bin/promtool" ]
}

have_systemd_analyze() {
	command -v systemd-analyze >/dev/null 2>&1
}

# fetch_promtool extracts promtool from Debian's prometheus package into
# $TOOLS_CACHE/bin without installing the package.
fetch_promtool() {
	tmp=$(mktemp -d)
	# shellcheck disable=SC2064 # expand $tmp now
	trap "rm -rf '$tmp'" EXIT
	if ! (cd "$tmp" && apt-get download -qq prometheus >/dev/null 2>&1); then
		[ "$(id -u)" -eq 0 ] || return 1
		apt-get update -qq >&2
		(cd "$tmp" && apt-get download -qq prometheus >&2) || return 1
	fi
	dpkg -x "$tmp"/prometheus_*.deb "$tmp/x" || return 1
	[ -x "$tmp/x/usr/bin/promtool" ] || return 1
	mkdir -p "$TOOLS_CACHE/bin" || return 1
	# Rename into place, so that a reader never sees half a binary.
	cp "$tmp/x/usr/bin/promtool" "$TOOLS_CACHE/bin/.promtool.$$" || return 1
	mv "$TOOLS_CACHE/bin/.promtool.$$" "$TOOLS_CACHE/bin/promtool" || return 1
	echo "ensure-deps: extracted promtool from Debian's prometheus package into $TOOLS_CACHE/bin (the package is not installed)" >&2
	rm -rf "$tmp"
	trap - EXIT
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
		redis)
			have_redis || pkgs="$pkgs redis-server"
			# Debian's redis-server depends on redis-tools, which has
			# redis-cli; a redis-server from elsewhere may come without.
			have_redis_cli || pkgs="$pkgs redis-tools"
			;;
		systemd-analyze) have_systemd_analyze || pkgs="$pkgs systemd" ;;
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
		redis-tools) echo "  - redis-cli: package redis-tools" ;;
		systemd) echo "  - systemd-analyze, for the systemd unit's test: package systemd" ;;
		pgbouncer) echo "  - pgbouncer, for the connection pooler tests: package pgbouncer" ;;
		esac
	done
}

# promtool is extracted, not installed: try that first, and if it cannot
# be had, say how together with any missing package.
promtool_missing=
if echo "$tools" | grep -qw promtool && ! have_promtool; then
	if ! command -v apt-get >/dev/null 2>&1 || ! command -v dpkg >/dev/null 2>&1 || ! fetch_promtool; then
		promtool_missing=1
	fi
fi
promtool_help() {
	echo "  - promtool, for the alert rules' tests: run make deps as root on Debian to extract it"
	echo "    from the prometheus package without installing that (it starts a server), or do it yourself:"
	echo "    apt-get download prometheus && dpkg -x prometheus_*.deb prometheus-deb &&"
	echo "    mkdir -p $TOOLS_CACHE/bin && cp prometheus-deb/usr/bin/promtool $TOOLS_CACHE/bin/"
	echo "    (or put any promtool in PATH)"
}

pkgs=$(missing)
if [ -z "$pkgs" ]; then
	if [ -n "$promtool_missing" ]; then
		{
			echo "ensure-deps: make $target needs tools that are not installed:"
			promtool_help
		} >&2
		exit 1
	fi
	exit 0
fi

if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
	{
		echo "ensure-deps: make $target needs tools that are not installed:"
		describe "$pkgs"
		[ -z "$promtool_missing" ] || promtool_help
		echo "Install the packages with:"
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
if [ -n "$pkgs" ] || [ -n "$promtool_missing" ]; then
	echo "ensure-deps: still missing after apt-get install:$pkgs${promtool_missing:+ promtool}" >&2
	exit 1
fi
