#!/bin/sh
# docker-engine.sh start|stop DIR runs a Docker engine of its own for
# make test-image (CI's image step), beside anything else on the machine:
#
#   start  installs Debian's docker.io and docker-compose when dockerd or
#          docker-compose is missing (as root, with apt-get; their
#          services are not started), then starts dockerd with everything
#          under DIR: its data (storage driver vfs, which works on any file
#          system and inside a container), its state, its socket
#          DIR/docker.sock and its log DIR/dockerd.log. It touches no
#          firewall rule (--iptables=false) and makes no docker0 bridge
#          (--bridge=none): containers use --network host or a network of
#          their own. It waits until the engine answers, then prints, for
#          eval, the variables make test-image reads:
#              DOCKER_HOST=unix://DIR/docker.sock; DOCKER=<client>; export DOCKER_HOST DOCKER
#          The client is docker.io's /usr/bin/docker, which has BuildKit
#          built in, unless the docker in PATH has the buildx plugin.
#   stop   stops that dockerd (the pid in DIR/dockerd.pid) and removes DIR.
#
# Every failure exits 1 and says why (apt-get unavailable or failing,
# dockerd not starting, with its log): nothing is skipped.
set -eu

cmd=${1:-}
dir=${2:-}
if [ -z "$dir" ] || { [ "$cmd" != start ] && [ "$cmd" != stop ]; }; then
	echo "usage: docker-engine.sh start|stop DIR" >&2
	exit 2
fi
case $dir in
/*) ;;
*)
	echo "docker-engine: DIR must be an absolute path, not $dir" >&2
	exit 2
	;;
esac

fail() {
	echo "docker-engine: $*" >&2
	exit 1
}

stop() {
	if [ -f "$dir/dockerd.pid" ]; then
		pid=$(cat "$dir/dockerd.pid")
		if kill "$pid" 2>/dev/null; then
			i=0
			while kill -0 "$pid" 2>/dev/null; do
				i=$((i + 1))
				[ "$i" -le 300 ] || fail "dockerd (pid $pid) still runs 30 s after SIGTERM; see $dir/dockerd.log"
				sleep 0.1
			done
		fi
	fi
	# The engine unmounts what it mounted as it stops; whatever a crash
	# left under DIR is unmounted before DIR is removed.
	grep -F " $dir/" /proc/mounts | awk '{print $2}' | sort -r | while read -r m; do
		umount "$m" || umount -l "$m"
	done
	rm -rf "$dir"
}

if [ "$cmd" = stop ]; then
	stop
	exit 0
fi

# start
[ "$(id -u)" -eq 0 ] || fail "dockerd needs root: run this as root"
pkgs=
command -v dockerd >/dev/null 2>&1 || [ -x /usr/sbin/dockerd ] || pkgs="$pkgs docker.io"
command -v docker-compose >/dev/null 2>&1 || pkgs="$pkgs docker-compose"
if [ -n "$pkgs" ]; then
	command -v apt-get >/dev/null 2>&1 || fail "dockerd or docker-compose is missing and there is no apt-get to install$pkgs: install them"
	echo "docker-engine: installing$pkgs" >&2
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq >&2 || fail "apt-get update failed: cannot install$pkgs"
	# Their services (a system dockerd on /var/run/docker.sock) are not
	# started: a policy-rc.d that says "forbidden", unless the system has
	# a policy of its own.
	policy=
	if [ ! -e /usr/sbin/policy-rc.d ]; then
		policy=/usr/sbin/policy-rc.d
		printf '#!/bin/sh\nexit 101\n' >"$policy"
		chmod 755 "$policy"
		trap 'rm -f "$policy"' EXIT
	fi
	# shellcheck disable=SC2086 # the package list is meant to split
	apt-get install -y -qq --no-install-recommends $pkgs >&2 || fail "apt-get install$pkgs failed"
	if [ -n "$policy" ]; then
		rm -f "$policy"
		trap - EXIT
	fi
fi
dockerd=$(command -v dockerd 2>/dev/null || echo /usr/sbin/dockerd)

if [ -f "$dir/dockerd.pid" ] && kill -0 "$(cat "$dir/dockerd.pid")" 2>/dev/null; then
	fail "a dockerd already runs with $dir (pid $(cat "$dir/dockerd.pid")): stop it first (docker-engine.sh stop $dir)"
fi
stop
mkdir -p "$dir"
sock=$dir/docker.sock
# setsid: the engine is in a session of its own, so that a signal to the
# caller's process group (a ^C of make) does not stop it halfway; stop
# ends it.
setsid "$dockerd" --storage-driver=vfs --iptables=false --ip6tables=false --bridge=none \
	--data-root="$dir/data" --exec-root="$dir/exec" --pidfile="$dir/dockerd.pid" \
	--host="unix://$sock" >"$dir/dockerd.log" 2>&1 </dev/null &
pid=$!

client=/usr/bin/docker
if docker buildx version >/dev/null 2>&1; then
	client=docker
fi
[ -x "$client" ] || command -v "$client" >/dev/null 2>&1 || fail "no docker client: neither docker with buildx in PATH nor /usr/bin/docker (Debian's docker.io)"
i=0
until DOCKER_HOST=unix://$sock "$client" version >/dev/null 2>&1; do
	i=$((i + 1))
	if ! kill -0 "$pid" 2>/dev/null; then
		tail -n 30 "$dir/dockerd.log" >&2
		fail "dockerd exited at start (log above, $dir/dockerd.log)"
	fi
	if [ "$i" -gt 600 ]; then
		tail -n 30 "$dir/dockerd.log" >&2
		fail "dockerd did not answer on $sock within 60 s (log above, $dir/dockerd.log)"
	fi
	sleep 0.1
done
echo "docker-engine: dockerd $(DOCKER_HOST=unix://$sock "$client" version --format '{{.Server.Version}}') answers on $sock (pid $(cat "$dir/dockerd.pid"), client $client)" >&2
echo "DOCKER_HOST=unix://$sock; DOCKER=$client; export DOCKER_HOST DOCKER"
