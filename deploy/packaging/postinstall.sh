#!/bin/sh
# After the .deb or .rpm is unpacked: systemd learns the unit. A new install
# is neither enabled nor started: it needs its settings first.
set -e
if [ -d /run/systemd/system ]; then
	systemctl daemon-reload >/dev/null 2>&1 || true
	# An upgrade restarts a running walcount on the new binary (it flushes
	# and acknowledges on SIGTERM); a stopped one stays stopped.
	if systemctl is-active --quiet walcount.service; then
		systemctl try-restart walcount.service >/dev/null 2>&1 || true
		exit 0
	fi
fi
cat <<'MSG'
walcount is installed. To run it:
  1. put the settings in /etc/walcount/walcount.env (and the counters in the
     file WALCOUNT_CONFIG names);
  2. run walcount setup once with them:
       sudo sh -c 'set -a; . /etc/walcount/walcount.env; exec walcount setup'
  3. sudo systemctl enable --now walcount
MSG
