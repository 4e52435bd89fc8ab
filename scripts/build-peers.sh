#!/usr/bin/env bash
# Builds the field's GPU-sharing systems from their public sources, for the
# benchmarks that run them beside dilu on simgpu (field, llm, frameworks,
# instructions): HAMi-core's libvgpu.so, XSched at Level 1 (its CUDA shim
# and xserver) and TGS's high- and low-priority hijack libraries. Nothing is
# downloaded from a code host (CI reaches none) and none of their code is in
# this repository: each source is a checkout you point at. What a checkout
# cannot supply is ours, in scripts/peer-stand-ins/, and named below. Writes
# OUT/env.sh, which sets DILU_PEER_HAMI, DILU_PEER_XSCHED and DILU_PEER_TGS
# for each peer that built.
#
#   HAMI_CORE_SRC=~/src/HAMi-core XSCHED_SRC=~/src/xsched TGS_SRC=~/src/TGS \
#     scripts/build-peers.sh
#   source target/peers/env.sh && scripts/bench.sh field
#
# On a GPU host scripts/gpu-colo-check.sh takes the same builds:
# HAMI_VGPU=$DILU_PEER_HAMI XSCHED_DIR=$DILU_PEER_XSCHED TGS_DIR=$DILU_PEER_TGS.
#
# HAMI_CORE_SRC   a checkout of https://github.com/Project-HAMi/HAMi-core
#                 (compiled with gcc as its build.sh configures it; cuda.h and
#                 nvml.h come from ~/.cache/dilu/cudart where
#                 scripts/install-cudart.sh put them, else from the PyPI
#                 wheels nvidia-cuda-runtime-cu12 and nvidia-nvml-dev-cu12,
#                 fetched with pip once)
# XSCHED_SRC      a git checkout of https://github.com/XpuOS/xsched, built with
#                 cmake (Release, PLATFORM_CUDA, SHIM_SOFTLINK). Its submodules
#                 CLI11, cpp-httplib, jsoncpp, ftxui and cuxtra are taken from
#                 the checkout where populated, else exported at their pinned
#                 commits from git repositories in XSCHED_3RDPARTY (a folder
#                 holding CLI11, cpp-httplib, jsoncpp, FTXUI and cuxtra, bare
#                 or not, by those names; XSched's .gitmodules name XpuOS's
#                 forks of the first four, and the commits pinned at bd494cb
#                 are in the upstream repositories CLIUtils/CLI11,
#                 yhirose/cpp-httplib, open-source-parsers/jsoncpp and
#                 ArthurSonzogni/FTXUI too). Its `ipc` submodule's pinned commit
#                 is in no public repository: where the checkout has none,
#                 scripts/peer-stand-ins/ipc (the five calls XSched makes, on
#                 abstract Unix datagram sockets) takes its place.
# TGS_SRC         a checkout of https://github.com/pkusys/TGS; its hijack/
#                 sources are compiled once per priority with gcc, with
#                 scripts/peer-stand-ins/tgs_get_proc_address.c added (TGS
#                 exports no cuGetProcAddress, which CUDA 12's runtime uses),
#                 and linked to need the driver by the name TGS opens it by
#                 (libcuda.so.450.51.06), so that what TGS does not define
#                 (cuMemAllocAsync, ...) reaches the driver.
# PEERS_CACHE     where the headers and HAMi-core's build go (default
#                 target/peers-cache, as scripts/peers.sh and
#                 scripts/frameworks.sh use)
# --out DIR       where XSched's and TGS's builds and env.sh go (default
#                 target/peers)
# --only LIST     comma-separated subset of hami,xsched,tgs (default all)
#
# A peer whose source variable is unset is skipped with a note (env.sh keeps
# an earlier build of it, else the benchmarks' rows for it say it was not
# run); one that fails to build stops the script. Needs gcc, g++, make,
# cmake, python3 with pip.
set -euo pipefail
cd "$(dirname "$0")/.."
here=$(pwd)

out=target/peers
only=hami,xsched,tgs
while [ $# -gt 0 ]; do
  case $1 in
    --out) out=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    -h | --help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
    *) echo "build-peers: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
for peer in ${only//,/ }; do
  case $peer in
    hami | xsched | tgs) ;;
    *) echo "build-peers: --only: unknown peer '$peer' (hami, xsched, tgs)" >&2; exit 2 ;;
  esac
done
wants() { case ",$only," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }
mkdir -p "$out"
out=$(cd "$out" && pwd)
cache=${PEERS_CACHE:-target/peers-cache}
mkdir -p "$cache"
cache=$(cd "$cache" && pwd)
env_file=$out/env.sh
exports=()
note() { echo "build-peers: $*" >&2; }
commit_of() { git -C "$1" rev-parse HEAD 2>/dev/null || echo unknown; }
# to_build PEER VARIABLE NAME: whether PEER is asked for and its source
# VARIABLE is set (else a note that NAME is skipped).
to_build() {
  wants "$1" || return 1
  [ -n "${!2:-}" ] && return 0
  note "$3 skipped: $2 is not set"
  return 1
}
# built VARIABLE NAME PATH: NAME's build is at PATH, for env.sh.
built() {
  note "$2: $3"
  exports+=("$1=$3")
}

# --- HAMi-core: libvgpu.so
if to_build hami HAMI_CORE_SRC HAMi-core; then
  [ -f "$HAMI_CORE_SRC/src/libvgpu.c" ] || { note "HAMI_CORE_SRC=$HAMI_CORE_SRC has no src/libvgpu.c"; exit 1; }
  # cuda.h and nvml.h where scripts/install-cudart.sh left them, else
  # from the PyPI wheels.
  cudart=${XDG_CACHE_HOME:-$HOME/.cache}/dilu/cudart/nvidia
  mkdir -p "$cache/include"
  for header in cuda.h nvml.h; do
    [ -f "$cache/include/$header" ] && continue
    # No cudart cache yet is no error: the wheels below supply the headers.
    found=$(find "$cudart" -name "$header" 2> /dev/null | head -1 || true)
    if [ -n "$found" ]; then cp "$found" "$cache/include/"; fi
  done
  if [ ! -f "$cache/include/cuda.h" ] || [ ! -f "$cache/include/nvml.h" ]; then
    note "pip download nvidia-cuda-runtime-cu12 nvidia-nvml-dev-cu12 -> $cache (cuda.h, nvml.h)"
    python3 -m pip download --quiet --no-deps -d "$cache/wheels" nvidia-cuda-runtime-cu12 nvidia-nvml-dev-cu12
    mkdir -p "$cache/unpacked" "$cache/include"
    for wheel in "$cache"/wheels/*.whl; do python3 -m zipfile -e "$wheel" "$cache/unpacked"; done
    cp -r "$cache"/unpacked/nvidia/cuda_runtime/include/. "$cache/include/"
    find "$cache/unpacked" -name nvml.h -exec cp {} "$cache/include/" \;
  fi
  commit=$(commit_of "$HAMI_CORE_SRC")
  vgpu_dir=$cache/hami-$commit
  vgpu=$vgpu_dir/libvgpu.so
  if [ ! -f "$vgpu" ]; then
    note "building HAMi-core $commit with gcc"
    mkdir -p "$vgpu_dir/config"
    printf '#define DLSYM_HOOK_ENABLE 1\n#define MULTIPROCESS_LIMIT_ENABLE 1\n#define HOOK_MEMINFO_ENABLE 1\n#define HOOK_NVML_ENABLE 1\n' \
      > "$vgpu_dir/config/static_config.h"
    src=$HAMI_CORE_SRC/src
    gcc -shared -fPIC -O2 -D_GNU_SOURCE -w -I"$cache/include" -I"$src" -I"$vgpu_dir/config" \
      -o "$vgpu.tmp" "$src"/libvgpu.c "$src"/utils.c "$src"/log_utils.c "$src"/nvml/nvml_entry.c \
      "$src"/nvml/hook.c "$src"/cuda/*.c "$src"/allocator/allocator.c \
      "$src"/multiprocess/multiprocess_memory_limit.c "$src"/multiprocess/multiprocess_utilization_watcher.c \
      -lpthread -ldl
    mv "$vgpu.tmp" "$vgpu"
  fi
  built DILU_PEER_HAMI HAMi-core "$vgpu"
fi

# --- XSched: xserver and the CUDA shim, Level 1
if to_build xsched XSCHED_SRC XSched; then
  git -C "$XSCHED_SRC" rev-parse HEAD > /dev/null 2>&1 \
    || { note "XSCHED_SRC=$XSCHED_SRC is not a git checkout (its submodules' pinned commits are read from it)"; exit 1; }
  commit=$(commit_of "$XSCHED_SRC")
  install=$out/xsched-$commit
  if [ ! -x "$install/bin/xserver" ]; then
    tree=$out/xsched-src-$commit
    rm -rf "$tree" "$install"
    mkdir -p "$tree"
    # The tracked files of the checkout (its snapshot may lack docs/ blobs,
    # which the build does not read).
    git -C "$XSCHED_SRC" archive HEAD ':!docs' | tar -x -C "$tree"
    git -C "$XSCHED_SRC" config -f .gitmodules --get-regexp '^submodule\..*\.path$' |
      while read -r _ path; do
        name=${path##*/}
        pinned=$(git -C "$XSCHED_SRC" ls-tree HEAD "$path" | awk '{ print $3 }')
        rm -rf "${tree:?}/$path"
        if [ -n "$(ls -A "$XSCHED_SRC/$path" 2> /dev/null)" ]; then
          cp -a "$XSCHED_SRC/$path" "$tree/$path"
        elif [ "$name" = ipc ]; then
          note "XSched: 3rdparty/ipc ($pinned) from scripts/peer-stand-ins/ipc (ours: its commit is in no public repository)"
          cp -a "$here/scripts/peer-stand-ins/ipc" "$tree/$path"
        else
          repo=""
          for candidate in "$name" "$(echo "$name" | tr '[:lower:]' '[:upper:]')"; do
            [ -n "${XSCHED_3RDPARTY:-}" ] && [ -e "$XSCHED_3RDPARTY/$candidate" ] && { repo=$XSCHED_3RDPARTY/$candidate; break; }
          done
          [ -n "$repo" ] || { note "XSched: $path is empty and XSCHED_3RDPARTY holds no $name repository (commit $pinned)"; exit 1; }
          note "XSched: $path at $pinned from $repo"
          mkdir -p "$tree/$path"
          git --git-dir "$( [ -d "$repo/.git" ] && echo "$repo/.git" || echo "$repo")" archive "$pinned" | tar -x -C "$tree/$path" \
            || { note "XSched: $repo has no commit $pinned for $path"; exit 1; }
        fi
      done
    note "building XSched $commit with cmake (Level 1: PLATFORM_CUDA, SHIM_SOFTLINK)"
    # -Wno-range-loop-construct: GCC 12 rejects utils' region.h under -Werror.
    (cd "$tree" && CXXFLAGS=-Wno-range-loop-construct cmake -S . -B build -DCMAKE_BUILD_TYPE=Release \
      -DPLATFORM_CUDA=ON -DSHIM_SOFTLINK=ON -DCMAKE_INSTALL_PREFIX="$install" > build.log 2>&1 \
      && cmake --build build --target install -j "$(nproc)" >> build.log 2>&1) \
      || { tail -30 "$tree/build.log" >&2; note "XSched failed to build (log: $tree/build.log)"; exit 1; }
  fi
  built DILU_PEER_XSCHED XSched "$install"
fi

# --- TGS: one hijack library per priority
if to_build tgs TGS_SRC TGS; then
  [ -f "$TGS_SRC/hijack/src/loader.c" ] || { note "TGS_SRC=$TGS_SRC has no hijack/src/loader.c"; exit 1; }
  commit=$(commit_of "$TGS_SRC")
  tgs=$out/tgs-$commit
  addon=$here/scripts/peer-stand-ins/tgs_get_proc_address.c
  # The driver under the name TGS falls back to: an empty library to link
  # against, so that the hijack needs libcuda.so.450.51.06 and functions
  # TGS does not define (cuMemAllocAsync, ...) pass through to the driver,
  # as they do where TGS is preloaded before it.
  mkdir -p "$tgs/link"
  echo 'void tgs_link_stub(void) {}' > "$tgs/link/stub.c"
  gcc -shared -fPIC -o "$tgs/link/libcuda.so.450.51.06" "$tgs/link/stub.c"
  for priority in high low; do
    lib=$tgs/$priority/libcuda.so.1
    # Built again when its build line (this script) or the stand-in changed.
    if [ ! -f "$lib" ] || [ "$addon" -nt "$lib" ] || [ "$0" -nt "$lib" ]; then
      note "building TGS $commit, $priority priority, with gcc (+ our cuGetProcAddress)"
      mkdir -p "$tgs/$priority"
      (cd "$TGS_SRC/hijack" && gcc -shared -fPIC -O2 -D_GNU_SOURCE -fgnu89-inline -w -I. \
        -Wl,-soname,libcuda.so.1 -o "$lib.tmp" "src/${priority}_priority_hijack_call.c" \
        src/cuda_originals.c src/nvml_entry.c src/loader.c "$addon" \
        -L"$tgs/link" -Wl,--no-as-needed -l:libcuda.so.450.51.06 -Wl,--as-needed -lpthread -ldl -lm)
      mv "$lib.tmp" "$lib"
    fi
    ln -sf libcuda.so.1 "$tgs/$priority/libcuda.so"
  done
  built DILU_PEER_TGS TGS "$tgs"
fi

# Peers not built in this run (left out by --only, or their source not
# given) keep what an earlier run wrote for them, while that build exists.
kept=()
if [ -f "$env_file" ]; then
  for var in DILU_PEER_HAMI DILU_PEER_XSCHED DILU_PEER_TGS; do
    case " ${exports[*]} " in *" $var="*) continue ;; esac
    line=$(grep "^export $var=" "$env_file" || true)
    path=${line#*=\'}
    [ -n "$line" ] && [ -e "${path%\'}" ] && kept+=("$line")
  done
fi
{
  echo "# Written by scripts/build-peers.sh: the peers' builds, for scripts/bench.sh."
  for line in "${kept[@]}"; do echo "$line"; done
  for pair in "${exports[@]}"; do echo "export ${pair%%=*}='${pair#*=}'"; done
} > "$env_file"
exports+=("${kept[@]}")
note "wrote $env_file (${#exports[@]} peer(s)); source it before scripts/bench.sh field, llm or frameworks"
