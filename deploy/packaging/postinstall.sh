#!/bin/sh
# After the .deb or .rpm is unpacked: systemd learns the unit. The service is
# neither enabled nor started: it needs its settings first.
set -e
if [ -d /run/systemd/system ]; then
	systemctl daemon-reload >/dev/null 2>&1 || true
fi
cat <<'MSG'
walcount is installed. To run it:
  1. put the settings in /etc/walcount/walcount.env (and the counters in the
     file WALCOUNT_CONFIG names);
  2. run walcount setup once with them:
       sudo sh -c 'set -a; . /etc/walcount/walcount.env; exec walcount setup'
  3. sudo systemctl enable --now walcount
MSG
