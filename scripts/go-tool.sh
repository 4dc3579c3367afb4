#!/bin/sh
# go-tool.sh NAME prints the path of a pinned Go tool the tests and the
# release targets use, building it first if it is not cached:
#
#   helm        helm.sh/helm/v3/cmd/helm@v3.22.0 (the chart's tests)
#   goreleaser  github.com/goreleaser/goreleaser/v2@v2.15.1 (make
#               release-snapshot and its test)
#
# The binaries live in ${WALCOUNT_TOOLS_CACHE:-/var/tmp/walcount/tools}/<name>-<version>/
# and are built with `go install` from the Go module proxy: once per
# machine (a few minutes each on 2 CPUs), then reused. A build goes to a
# temporary directory that is renamed into place, so an interrupted build
# never leaves half a tool, and concurrent callers wait for one build
# (flock). Build output goes to stderr; stdout is the path only.
set -eu

name=${1:-}
case $name in
helm) module=helm.sh/helm/v3/cmd/helm version=v3.22.0 ;;
goreleaser) module=github.com/goreleaser/goreleaser/v2 version=v2.15.1 ;;
*)
	echo "go-tool: unknown tool '$name': use helm or goreleaser" >&2
	exit 2
	;;
esac

if ! command -v go >/dev/null 2>&1; then
	echo "go-tool: go not found in PATH: install Go (see the go directive in go.mod)" >&2
	exit 1
fi

CACHE=${WALCOUNT_TOOLS_CACHE:-/var/tmp/walcount/tools}
dir=$CACHE/$name-$version
bin=$dir/$name
if [ -x "$bin" ]; then
	echo "$bin"
	exit 0
fi

mkdir -p "$CACHE"
build() {
	[ -x "$bin" ] && return 0
	tmp=$(mktemp -d "$CACHE/.$name-$version.XXXXXX")
	echo "go-tool: building $module@$version into $dir (once per machine)" >&2
	if ! GOBIN=$tmp GOFLAGS= go install "$module@$version" >&2; then
		rm -rf "$tmp"
		echo "go-tool: go install $module@$version failed" >&2
		return 1
	fi
	rm -rf "$dir"
	mv "$tmp" "$dir"
}
if command -v flock >/dev/null 2>&1; then
	(
		flock 9
		build
	) 9>"$CACHE/.$name.lock"
else
	build
fi
echo "$bin"
