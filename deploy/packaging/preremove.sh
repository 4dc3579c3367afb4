#!/bin/sh
# Before the package is removed (not upgraded): stop and disable the unit.
# walcount's final flush on SIGTERM keeps what it buffered.
# deb passes "remove"; rpm passes the number of versions left, 0 on removal.
set -e
case "${1:-}" in
remove | 0)
	if [ -d /run/systemd/system ]; then
		systemctl stop walcount.service >/dev/null 2>&1 || true
		systemctl disable walcount.service >/dev/null 2>&1 || true
	fi
	;;
esac
