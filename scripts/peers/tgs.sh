#!/usr/bin/env bash
# Builds TGS's hijack libraries (pkusys/TGS, NSDI'23 "Transparent GPU Sharing
# in Container Clouds for Deep Learning Workloads", Apache-2.0), one for
# high-priority and one for low-priority jobs, from a checkout you point at,
# and prints the output folder's path on stdout (progress goes to stderr).
# Nothing of TGS is in this repository and this script never downloads code.
#
#   TGS_SRC=/path/to/TGS scripts/peers/tgs.sh
#
# TGS_SRC      a checkout of https://github.com/pkusys/TGS, pinned at commit
#              e1c6a319cd3a91356c19508307966e79bf61cd36 ("init", 2023-06-26,
#              the repository's only commit after the empty first one); another
#              commit is built with a warning. Only hijack/ is used.
# PEERS_CACHE  where the output goes (default target/peers-cache):
#              PEERS_CACHE/tgs-<commit>/ (or tgs-unknown outside git), with
#                high/libcuda.so.1  the high-priority hijack (libcuda.so beside it)
#                low/libcuda.so.1   the low-priority hijack (libcuda.so beside it)
#                driver/            libcuda.so.450.51.06 and libnvidia-ml.so.450.51.06
#                                   linking to simgpu's libsimgpu.so and
#                                   libsimgpu_nvml.so in target/release
#              rebuilt when this script or tgs-procaddress.c is newer.
#
# Build: per priority p, like the note in ../shared/research/peers-on-simgpu.md,
#   gcc -shared -fPIC -O2 -D_GNU_SOURCE -fgnu89-inline -w -I. \
#     -Wl,-soname,libcuda.so.1 -o p/libcuda.so.1 src/p_priority_hijack_call.c \
#     src/{cuda_originals,nvml_entry,loader}.c -lpthread -ldl -lm
# (TGS's own build.sh does the same through CMake and copies the library to
# five names for an /etc/ld.so.preload in a container), with two additions
# that are dilu's, not TGS's:
#   - scripts/peers/tgs-procaddress.c (written for dilu) is compiled in: it
#     exports cuGetProcAddress/_v2, which TGS lacks, answering from the driver
#     and swapping in TGS's export of the same name (dladdr), so cudart-style
#     clients go through TGS's hooks instead of failing or bypassing them.
#   - the library is linked against the driver by name (DT_NEEDED
#     libcuda.so.450.51.06, through an empty stub at link time), so a client
#     that dlsyms a function TGS does not export (the cudarc crate, which
#     dilu's benchmark programs use, resolves every function by name and needs
#     cuMemAllocAsync and cuMemFreeAsync) gets the driver's instead of a
#     "Missing symbol" panic. TGS hooks neither function.
#
# Run a program under it (bench/src/peers/tgs.rs does this):
#   LD_LIBRARY_PATH=OUT/high:OUT/driver:target/release/peers-lib  (high priority)
#   LD_LIBRARY_PATH=OUT/low:OUT/driver:target/release/peers-lib   (low priority)
# TGS opens the driver as libcuda.so.<version> with the version from
# /proc/driver/nvidia/version, else 450.51.06 (driver/ also gets the name of
# the version that file reports on this machine). There is no TGS server: the
# low-priority process listens on /etc/gsharing/rate_<GPU uuid>.sock and the
# high-priority one connects and sends its kernel rate every 5 s; the path is
# hard-coded. This script creates /etc/gsharing (it needs root or a writable
# /etc). simgpu's UUID is a hash of SIMGPU_INSTANCE, so runs on different
# instances use different sockets, but two runs on one instance at once
# collide, and of several low-priority processes on one instance only the last
# one started is throttled (each re-binds the socket). TGS also appends to
# /tmp/cudalog, pins its threads to core (UUID byte sum % 8) (printing "failed
# to set cpu affinity" where that core does not exist) and exits the process
# on some driver errors.
# Needs: gcc.
set -euo pipefail
self=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")
cd "$(dirname "$self")/../.."

case ${1:-} in
  -h | --help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$self"; exit 0 ;;
  "") ;;
  *) echo "tgs: unknown argument '$1'" >&2; exit 2 ;;
esac
: "${TGS_SRC:?tgs: set TGS_SRC to a TGS checkout (https://github.com/pkusys/TGS)}"
hijack=$TGS_SRC/hijack
[ -f "$hijack/src/loader.c" ] || { echo "tgs: $hijack/src/loader.c not found: TGS_SRC is not a TGS checkout" >&2; exit 1; }
pinned=e1c6a319cd3a91356c19508307966e79bf61cd36
commit=$(git -C "$TGS_SRC" rev-parse HEAD 2>/dev/null || echo unknown)
[ "$commit" = "$pinned" ] || echo "tgs: warning: TGS_SRC is at $commit, not the pinned $pinned" >&2
cache=${PEERS_CACHE:-target/peers-cache}
mkdir -p "$cache"
cache=$(cd "$cache" && pwd)
out=$cache/tgs-$commit
addon=$(pwd)/scripts/peers/tgs-procaddress.c
driver_name=libcuda.so.450.51.06

# --- the hijack libraries
stale() { [ ! -f "$1" ] || [ "$self" -nt "$1" ] || [ "$addon" -nt "$1" ]; }
if stale "$out/high/libcuda.so.1" || stale "$out/low/libcuda.so.1"; then
  echo "== building TGS $commit hijack libraries with gcc" >&2
  stub=$(mktemp -d /tmp/dilu-tgs-stub.XXXXXX)
  trap 'rm -rf "$stub"' EXIT
  # Link-time stand-in for the driver: only its soname matters.
  echo 'int dilu_tgs_driver_stub;' > "$stub/stub.c"
  gcc -shared -fPIC -Wl,-soname,"$driver_name" -o "$stub/$driver_name" "$stub/stub.c"
  for p in high low; do
    mkdir -p "$out/$p"
    # Built under a temporary name: an interrupted build leaves no library.
    (cd "$hijack" && gcc -shared -fPIC -O2 -D_GNU_SOURCE -fgnu89-inline -w -I. \
      -DTGS_DRIVER_LIBRARY="\"$driver_name\"" -Wl,-soname,libcuda.so.1 -o "$out/$p/libcuda.so.1.tmp" \
      "src/${p}_priority_hijack_call.c" src/cuda_originals.c src/nvml_entry.c src/loader.c "$addon" \
      -Wl,--no-as-needed -L"$stub" -l:"$driver_name" -lpthread -ldl -lm)
    mv "$out/$p/libcuda.so.1.tmp" "$out/$p/libcuda.so.1"
    # cudarc opens libcuda.so before libcuda.so.1.
    ln -sfn libcuda.so.1 "$out/$p/libcuda.so"
  done
fi

# --- the driver under the names TGS opens
release=$(pwd)/target/release
versions=(450.51.06)
if [ -r /proc/driver/nvidia/version ]; then
  v=$(grep -m1 '^NVRM' /proc/driver/nvidia/version | grep -oE '[0-9]+(\.[0-9]+)+' | head -1 || true)
  [ -n "$v" ] && [ "$v" != 450.51.06 ] && versions+=("$v")
fi
mkdir -p "$out/driver"
for v in "${versions[@]}"; do
  ln -sfn "$release/libsimgpu.so" "$out/driver/libcuda.so.$v"
  ln -sfn "$release/libsimgpu_nvml.so" "$out/driver/libnvidia-ml.so.$v"
done
[ -f "$release/libsimgpu.so" ] || echo "tgs: note: $release/libsimgpu.so is not built yet (cargo build --release -p simgpu -p simgpu-nvml)" >&2

# --- TGS's coordination socket folder (hard-coded)
mkdir -p /etc/gsharing 2>/dev/null || echo "tgs: warning: cannot create /etc/gsharing (TGS's hard-coded socket folder): high and low priority will not coordinate" >&2
echo "$out"
