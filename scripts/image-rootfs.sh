#!/bin/sh
# image-rootfs.sh DIR assembles in DIR/rootfs the root filesystem of the
# image's BASE=local runtime (see the Dockerfile), from this machine,
# pulling nothing: what walcount needs of distroless static nonroot, and no
# shell.
#
#   etc/passwd, etc/group    root, nobody and nonroot (uid and gid 65532),
#                            as in distroless
#   etc/ssl/certs/ca-certificates.crt
#                            this machine's CA bundle (Debian's
#                            ca-certificates), for TLS to PostgreSQL and
#                            Redis with verify-full
#   tmp                      mode 1777
#   home                     empty; nonroot's home, /home/nonroot, is
#                            DIR/nonroot-home, which the Dockerfile copies
#                            with --chown (a COPY chowns only what it
#                            creates)
#
# DIR/rootfs and DIR/nonroot-home are replaced. make image BASE=local runs
# this with DIR=bin/image.
set -eu

dir=${1:-}
if [ -z "$dir" ]; then
	echo "usage: image-rootfs.sh DIR" >&2
	exit 2
fi
certs=${WALCOUNT_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}
if [ ! -s "$certs" ]; then
	echo "image-rootfs: no CA bundle at $certs: install Debian's ca-certificates (apt-get install ca-certificates), or set WALCOUNT_CA_BUNDLE to a PEM bundle" >&2
	exit 1
fi

rm -rf "$dir/rootfs" "$dir/nonroot-home"
mkdir -p "$dir/nonroot-home"
chmod 755 "$dir/nonroot-home"
dir=$dir/rootfs
mkdir -p "$dir/etc/ssl/certs" "$dir/tmp" "$dir/home"
chmod 755 "$dir" "$dir/etc" "$dir/etc/ssl" "$dir/etc/ssl/certs" "$dir/home"
chmod 1777 "$dir/tmp"
cat >"$dir/etc/passwd" <<'PASSWD'
root:x:0:0:root:/root:/sbin/nologin
nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin
nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin
PASSWD
cat >"$dir/etc/group" <<'GROUP'
root:x:0:
nobody:x:65534:
nonroot:x:65532:
GROUP
chmod 644 "$dir/etc/passwd" "$dir/etc/group"
cp "$certs" "$dir/etc/ssl/certs/ca-certificates.crt"
chmod 644 "$dir/etc/ssl/certs/ca-certificates.crt"
