#!/usr/bin/env bash
# bench/gpu/prepare.sh [DIR] — run HERE (Debian 12, apt), before a GPU lease:
# downloads the Debian packages the GPU machine's image lacks into DIR
# (default .gpu-debs/, ignored by git) for bench/gpu/run.sh build to unpack
# there into a private prefix (never into /). Name the folder in the device
# tool's carry: ["build/...", ".gpu-debs"]. It must stay under 64 MiB with
# everything else that travels; this script fails above 48 MiB.
#
# What the image lacks (read there 2026-11-25, Ubuntu 24.04, see the
# build stage's own check): MPICH (it has Open MPI, which our MPI tests never
# ran on), cJSON and Criterion. It has the OpenSSL headers, hwloc, UCX,
# libfabric and NCCL. The list carries, beside the three, the libraries they
# link that the image may lack or hold at another ABI: UCX and hwloc at the
# versions MPICH 4.0.2 was built against, Slurm's library (hydra links it),
# libgfortran (libmpich links it), libgit2 and its TLS/SSH stack and nanomsg
# (Criterion links them). Debian 12's glibc (2.36) is older than the image's
# (2.39), so its binaries run there. libssl-dev is carried as a fallback only:
# the build stage uses it where the image has no openssl/evp.h.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
DEST=${1:-$ROOT/.gpu-debs}
PKGS=(mpich libmpich12 libmpich-dev libslurm38 libucx0 libhwloc15 libnuma1 libgfortran5
      libcjson1 libcjson-dev
      libcriterion3 libcriterion-dev libgit2-1.5 libmbedtls14 libmbedx509-1 libmbedcrypto7 libhttp-parser2.9
      libssh2-1 libnanomsg5
      libssl-dev)
command -v apt-get >/dev/null || { echo "prepare.sh: needs apt-get (run it on the Debian machine, not the GPU one)" >&2; exit 2; }
mkdir -p "$DEST"
tmp=$(mktemp -d "$DEST/.dl.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
# as root, apt's sandbox user cannot write a folder root made; download as root
(cd "$tmp" && apt-get -q -o APT::Sandbox::User=root download "${PKGS[@]}") >"$tmp/apt.log" 2>&1 || {
  echo "prepare.sh: apt-get download failed:" >&2; tail -n 5 "$tmp/apt.log" >&2; exit 1; }
n=$(find "$tmp" -name '*.deb' | wc -l)
[ "$n" -eq "${#PKGS[@]}" ] || { echo "prepare.sh: got $n of ${#PKGS[@]} packages" >&2; exit 1; }
rm -f "$DEST"/*.deb
mv "$tmp"/*.deb "$DEST"/
(cd "$DEST" && sha256sum ./*.deb > SHA256SUMS)
kib=$(du -sk --exclude=.dl.* "$DEST" | cut -f1)
[ "$kib" -le $((48 * 1024)) ] || { echo "prepare.sh: $DEST is $kib KiB, over the 48 MiB budget" >&2; exit 1; }
echo "prepare.sh: ${#PKGS[@]} packages in $DEST, $((kib / 1024)) MiB ($kib KiB)"
