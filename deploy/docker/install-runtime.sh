#!/bin/sh
# pyvgpu-install-runtime HOST_DIR: copy this image's runtime ($PYVGPU_HOME, /opt/pyvgpu/<release>) to
# HOST_DIR/<release>, where HOST_DIR is the host's /opt/pyvgpu mounted into the init container.
#
# Containers that run now have the host's copy mounted, and their processes map its files: a file is never
# rewritten in place. A copy whose STAMP matches is left alone; otherwise the new tree is copied beside it
# and renamed into place, and the old one is renamed to .<release>.old.<time> (running containers keep the
# directory they mounted; remove old ones once no pod started before the upgrade runs).
set -eu
src=${PYVGPU_HOME:?PYVGPU_HOME is not set: run this in the pyvgpu image}
host=${1:?usage: pyvgpu-install-runtime HOST_DIR}
[ -d "$host" ] || { echo "pyvgpu-install-runtime: $host is not a directory (mount the host's /opt/pyvgpu there)" >&2; exit 2; }
release=$(basename "$src")
dst=$host/$release
stamp=$(cat "$src/STAMP")
if [ -f "$dst/STAMP" ] && [ "$(cat "$dst/STAMP")" = "$stamp" ]; then
    echo "pyvgpu-install-runtime: $dst is up to date ($stamp)"
    exit 0
fi
rm -rf "$host/.$release.new."*  # left by an earlier copy that did not finish
tmp=$(mktemp -d "$host/.$release.new.XXXXXX")
cp -a "$src/." "$tmp/"
chmod 755 "$tmp"
if [ -e "$dst" ]; then
    mv "$dst" "$host/.$release.old.$(date +%s).$$"
fi
mv "$tmp" "$dst"
echo "pyvgpu-install-runtime: installed $dst ($stamp)"
