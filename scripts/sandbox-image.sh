#!/usr/bin/env bash
# Builds the container sandbox image (ADR 0012) from this machine's own Debian packages, with no
# registry: the files of a few installed packages and what they depend on, tarred and
# `podman import`ed. The tag is a hash of this recipe and the packages' versions, so the image
# is rebuilt only when either changes. Prints the image name.
# Usage: scripts/sandbox-image.sh [--engine podman|docker]   (CONTAINERS_CONF as setup.sh writes it)
set -euo pipefail
engine=podman
[ "${1:-}" = "--engine" ] && engine="$2"

# git and a shell for Slipway's own commands; node for JavaScript projects and the agent CLIs;
# util-linux for setsid (every exec runs in its own process group, killed as one); bsdutils for
# script(1), which makes a session's terminal inside the container (ADR 0014).
PACKAGES="base-files dash bash coreutils git util-linux bsdutils findutils grep sed diffutils tar gzip nodejs ca-certificates"

closure=$(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks --no-replaces --no-enhances --installed $PACKAGES 2>/dev/null \
  | grep -v '^ ' | grep -v '^<' | sort -u)
installed=$(for p in $closure; do dpkg-query -W -f='${db:Status-Abbrev} ${Package}=${Version}\n' "$p" 2>/dev/null; done | awk '$1=="ii"{print $2}' | sort -u)
hash=$( { cat "$0"; echo "$installed"; } | sha256sum | cut -c1-16)
image="localhost/slipway-sandbox:$hash"
if "$engine" image exists "$image" 2>/dev/null || "$engine" image inspect "$image" >/dev/null 2>&1; then
  echo "$image"
  exit 0
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# Every file of those packages, under its real path (this host has merged /usr: /bin -> usr/bin).
for p in $installed; do dpkg -L "${p%%=*}" 2>/dev/null; done \
  | grep -vE '^/usr/share/(doc|man|info|locale|lintian)/' \
  | while read -r f; do if [ -f "$f" ] || [ -L "$f" ]; then echo "$f"; fi; done \
  | sed -E 's#^/(bin|sbin|lib|lib64)/#/usr/\1/#; s#^/##' | sort -u > "$work/files"
mkdir -p "$work/root"
tar -C / --no-recursion -cf - -T "$work/files" 2>/dev/null | tar -C "$work/root" -xf -
mkdir -p "$work/root"/{etc,tmp,workspace,root,proc,sys,dev,run}
chmod 1777 "$work/root/tmp"
for d in bin sbin lib lib64; do [ -d "$work/root/usr/$d" ] && ln -sfn "usr/$d" "$work/root/$d"; done
printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n' > "$work/root/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' > "$work/root/etc/group"
tar -C "$work/root" -cf "$work/root.tar" .
"$engine" import --change 'WORKDIR /workspace' --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  "$work/root.tar" "$image" >/dev/null
echo "$image"
