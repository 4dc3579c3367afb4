#!/bin/sh
# Before the .deb or .rpm unpacks: the walcount system user and group that
# walcount.service runs as, and that owns /etc/walcount/walcount.env's
# group. Left in place on removal.
set -e
if ! getent group walcount >/dev/null 2>&1; then
	groupadd --system walcount 2>/dev/null || addgroup --system walcount
fi
if ! getent passwd walcount >/dev/null 2>&1; then
	nologin=/usr/sbin/nologin
	[ -x "$nologin" ] || nologin=/sbin/nologin
	useradd --system --gid walcount --no-create-home --home-dir /nonexistent \
		--shell "$nologin" --comment "walcount daemon" walcount 2>/dev/null ||
		adduser --system --ingroup walcount --no-create-home --home /nonexistent \
			--shell "$nologin" walcount
fi
