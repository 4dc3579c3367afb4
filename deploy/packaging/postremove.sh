#!/bin/sh
# After the package is removed or upgraded: systemd forgets or rereads the
# unit. The walcount user and /etc/walcount/walcount.env (a configuration
# file) stay, as packages leave them.
set -e
if [ -d /run/systemd/system ]; then
	systemctl daemon-reload >/dev/null 2>&1 || true
fi
