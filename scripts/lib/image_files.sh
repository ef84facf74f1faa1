#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# image_files.sh BUILD OUT: what Containerfile's two images take from the build stage, laid out
# under OUT (emptied first):
#   OUT/server/   a root file system: psched-server and psched (stripped) in /usr/local/bin, the
#                 shared libraries they load and the dynamic loader at their paths (ldd), and
#                 /etc/passwd, /etc/group (root, psched 10001), /etc/nsswitch.conf, /tmp
#   OUT/state/    an empty folder, /var/lib/psched once copied (owned by psched)
#   OUT/trainer/  /opt/psched: bin/ (psched-example-trainer, psched), python/psched (the module),
#                 python/examples, configs
# Run from the source tree, as the build stage does.
set -euo pipefail
build=$1
out=$2

rm -rf "$out"
mkdir -p "$out/server/usr/local/bin" "$out/server/etc" "$out/server/tmp" "$out/state" \
  "$out/trainer/bin" "$out/trainer/python"

for program in psched-server psched; do
  strip -o "$out/server/usr/local/bin/$program" "$build/apps/$program"
done
# ldd's lines: "libfmt.so.9 => /lib/x86_64-linux-gnu/libfmt.so.9 (0x...)" and the loader's
# "/lib64/ld-linux-x86-64.so.2 (0x...)"; the vDSO has no file, and each program a "path:" line.
ldd "$out"/server/usr/local/bin/* |
  awk '$2 == "=>" && $3 ~ /^\// { print $3 } NF == 2 && $1 ~ /^\// { print $1 }' | sort -u |
  while read -r library; do cp --parents --dereference "$library" "$out/server"; done
cat >"$out/server/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/usr/sbin/nologin
psched:x:10001:10001:psched:/var/lib/psched:/usr/sbin/nologin
EOF
cat >"$out/server/etc/group" <<'EOF'
root:x:0:
psched:x:10001:
EOF
echo "hosts: files dns" >"$out/server/etc/nsswitch.conf"
chmod 1777 "$out/server/tmp"

strip -o "$out/trainer/bin/psched-example-trainer" "$build/apps/psched-example-trainer"
cp "$out/server/usr/local/bin/psched" "$out/trainer/bin/"
cp -r "$build/python/psched" "$out/trainer/python/"
rm -rf "$out/trainer/python/psched/__pycache__"
strip --strip-unneeded "$out"/trainer/python/psched/_core*.so
cp -r python/examples "$out/trainer/python/"
cp -r configs "$out/trainer/"
