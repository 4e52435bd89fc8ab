#!/usr/bin/env bash
# Real models co-located on one simulated GPU: a BERT-base inference server
# (Poisson requests, an SLO) beside a ResNet-50 training loop, both ordinary
# PyTorch programs (scripts/frameworks.py), run unmodified under: each alone,
# no limiter, the node manager's static controller, dilu at its defaults
# (`dilu nodemgr`, the server under `dilu run --colo primary --slo-ms`, the
# trainer under `dilu run --colo filler`), the same without the server's SLO
# (`--colo primary` alone: kept as if alone), dilu with the server's profile
# (`dilu profile` of the server first, then the server under `dilu run
# --profile`) and HAMi-core's libvgpu.so (built from a checkout, as
# scripts/peers.sh does). Writes bench/results/frameworks.md.
#
# Not part of CI: it needs PyTorch, torchvision (and transformers, else the
# server builds BERT-base's shape in plain torch.nn) in a virtual environment:
# DILU_TORCH_VENV, default ~/.cache/dilu/torch-venv, else ~/.cache/dilu/vllm-venv
# when that one has torch. Nothing is installed or downloaded.
#
#   scripts/bench.sh frameworks [-- OPTIONS]
#   scripts/frameworks.sh [OPTIONS]
#
# --seconds S       length of each co-located run (default 20)
# --rate R          requests per second (default: 30% of what one server can
#                   answer back to back, measured first, alone)
# --slo-ms MS       the server's SLO (default: 3 x its warm service time alone)
# --train-batch B   training batch (default 32), --image P image side (default 224),
# --model M         torchvision model (default resnet50)
# --static-split P  static and HAMi-core: the server's SM share in % (default 50;
#                   the trainer gets the rest)
# --profile-max-batch B   largest batch `dilu profile` tries (default 4)
# --profile-trial-seconds S  each profile trial's length (default 6)
# --only LIST       comma-separated subset of: alone,none,static,dilu,noslo,profiled,hami
#
# DILU_PEER_HAMI=FILE a HAMi-core libvgpu.so already built (as the field and llm
#                   benches take it); else
# HAMI_CORE_SRC=DIR a HAMi-core checkout (https://github.com/Project-HAMi/HAMi-core)
#                   built by scripts/build-peers.sh (into PEERS_CACHE, default
#                   target/peers-cache); without either, or if it does not build
#                   here, the HAMi-core row says why it is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

given_args="$*"
seconds=20 rate="" slo_ms="" train_batch=32 image=224 model=resnet50 split=50
profile_max_batch=4 profile_trial=6
only=alone,none,static,dilu,noslo,profiled,hami
while [ $# -gt 0 ]; do
  case $1 in
    --seconds) seconds=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --slo-ms) slo_ms=$2; shift 2 ;;
    --train-batch) train_batch=$2; shift 2 ;;
    --image) image=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    --static-split) split=$2; shift 2 ;;
    --profile-max-batch) profile_max_batch=$2; shift 2 ;;
    --profile-trial-seconds) profile_trial=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    -h | --help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
    *) echo "frameworks: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
wants() { [[ ",$only," == *",$1,"* ]]; }

# --- PyTorch
venv=${DILU_TORCH_VENV:-}
if [ -z "$venv" ]; then
  venv=$HOME/.cache/dilu/torch-venv
  if ! "$venv/bin/python" -c 'import torch' >/dev/null 2>&1 &&
    "$HOME/.cache/dilu/vllm-venv/bin/python" -c 'import torch' >/dev/null 2>&1; then
    venv=$HOME/.cache/dilu/vllm-venv
  fi
fi
python=$venv/bin/python
if ! "$python" -c 'import torch, torchvision' >/dev/null 2>&1; then
  echo "frameworks: no torch and torchvision in $venv (set DILU_TORCH_VENV; scripts/torch-sim-check.sh installs torch)" >&2
  exit 2
fi

echo "== building dilu and simgpu (release)" >&2
cargo build --release -q -p dilu-nodemgr -p dilu-interposer -p simgpu -p simgpu-nvml
# The report's as-if-alone bound of the pair.
cargo build --release -q -p dilu-bench --bin as-if-alone-bound
release=$(pwd)/target/release
dilu=$release/dilu
libdir=$release/frameworks-lib
mkdir -p "$libdir"
ln -sf "$release/libsimgpu.so" "$libdir/libcuda.so.1"
ln -sf "$release/libsimgpu.so" "$libdir/libcuda.so"
ln -sf "$release/libsimgpu_nvml.so" "$libdir/libnvidia-ml.so.1"

work=$(mktemp -d /tmp/dilu-frameworks.XXXXXX)
cleanup() {
  local pid
  for pid in $(jobs -p); do kill "$pid" 2>/dev/null || true; done
  rm -f /dev/shm/simgpu-"$(id -u)"-fw-$$-* 2>/dev/null || true
  [ -n "${FRAMEWORKS_KEEP:-}" ] || rm -rf "$work"
}
trap cleanup EXIT

# --- HAMi-core, built by scripts/build-peers.sh
vgpu="" hami_note=""
if wants hami; then
  if [ -n "${DILU_PEER_HAMI:-}" ]; then
    # A build already made, as the field and llm benches take it.
    if [ -f "$DILU_PEER_HAMI" ]; then
      vgpu=$DILU_PEER_HAMI
      hami_note="HAMi-core's libvgpu.so named by \`DILU_PEER_HAMI\`"
    else
      hami_note="not run: DILU_PEER_HAMI names no file ($DILU_PEER_HAMI)"
    fi
  elif [ -z "${HAMI_CORE_SRC:-}" ]; then
    hami_note="not run: neither DILU_PEER_HAMI (a built libvgpu.so) nor HAMI_CORE_SRC (a checkout to build) is set"
  else
    cache=${PEERS_CACHE:-target/peers-cache}
    mkdir -p "$cache"
    commit=$(git -C "$HAMI_CORE_SRC" rev-parse HEAD 2>/dev/null || echo unknown)
    if PEERS_CACHE=$cache scripts/build-peers.sh --only hami --out "$cache/peers" 2>"$work/hami-build.log"; then
      vgpu=$(. "$cache/peers/env.sh" && echo "$DILU_PEER_HAMI")
    else
      hami_note="not run: HAMi-core $commit did not build here ($(grep -m1 -i error "$work/hami-build.log" || echo 'see scripts/build-peers.sh'))"
    fi
    [ -n "$vgpu" ] && hami_note="HAMi-core commit \`$commit\`"
  fi
fi

# launch LIMITER ROLE CONFIG ARGS...: one program of frameworks.py, on this
# configuration's simgpu instance, under LIMITER: none (simgpu as the
# driver), static / dilu (`dilu run` under the configuration's node
# manager), hami (libvgpu.so preloaded, as HAMi-core documents it).
launch() {
  local limiter=$1 role=$2 config=$3; shift 3
  local program=("$python" scripts/frameworks.py "$@")
  local tenant=fw-$$-$config-$role
  case $limiter in
    none)
      env LD_LIBRARY_PATH="$libdir" "${program[@]}" ;;
    static)
      local spec=(--class batch --sm-request $((100 - split)) --sm-limit 100)
      [ "$role" = serve ] && spec=(--class latency --slo-ms "$slo_ms" --sm-request "$split" --sm-limit 100)
      "$dilu" run --sim --tenant "$tenant" "${spec[@]}" -- "${program[@]}" ;;
    dilu)
      local spec=(--colo filler)
      [ "$role" = serve ] && spec=(--colo primary --slo-ms "$slo_ms")
      "$dilu" run --sim --tenant "$tenant" "${spec[@]}" -- "${program[@]}" ;;
    noslo)
      local spec=(--colo filler)
      [ "$role" = serve ] && spec=(--colo primary)
      "$dilu" run --sim --tenant "$tenant" "${spec[@]}" -- "${program[@]}" ;;
    profiled)
      local spec=(--colo filler)
      [ "$role" = serve ] && spec=(--colo primary --profile "$work/profile/profile.toml")
      "$dilu" run --sim --tenant "$tenant" "${spec[@]}" -- "${program[@]}" ;;
    hami)
      local share=$((100 - split))
      [ "$role" = serve ] && share=$split
      env LD_LIBRARY_PATH="$libdir" LD_PRELOAD="$vgpu" CUDA_REDIRECT="$vgpu" LIBCUDA_LOG_LEVEL=0 \
        CUDA_DEVICE_MEMORY_SHARED_CACHE="$work/$tenant.cache" CUDA_DEVICE_SM_LIMIT="$share" "${program[@]}" ;;
  esac
}

# configuration NAME LIMITER WHICH: runs the server and/or the trainer
# (WHICH: both, serve, train) for --seconds on a fresh simgpu instance with a
# trace; the outputs go to $work/NAME/.
configuration() {
  local name=$1 limiter=$2 which=$3 dir=$work/$1 nm="" pids=()
  mkdir -p "$dir"
  echo "== $name ($which, ${seconds}s)" >&2
  # The host's load: both programs' host side runs on these cores.
  cut -d' ' -f1 /proc/loadavg >"$dir/load.before"
  export SIMGPU_INSTANCE=fw-$$-$name SIMGPU_TRACE=$dir/trace.jsonl DILU_COLO_GROUP=fw-$$-$name
  if [ "$limiter" = static ] || [ "$limiter" = dilu ] || [ "$limiter" = noslo ] || [ "$limiter" = profiled ]; then
    : >"$dir/none.toml"
    local controller=()
    [ "$limiter" = static ] && controller=(--controller static)
    "$dilu" nodemgr --config "$dir/none.toml" --socket "$dir/nm.sock" --run-dir "$dir/run" \
      --metrics "" "${controller[@]}" >"$dir/nm.log" 2>&1 &
    nm=$!
    for _ in $(seq 300); do [ -S "$dir/nm.sock" ] && break; sleep 0.1; done
    [ -S "$dir/nm.sock" ] || { echo "frameworks: the node manager did not start (see $dir/nm.log)" >&2; exit 1; }
    export DILU_NODEMGR_SOCKET=$dir/nm.sock
  fi
  local trainer="" train_args=(--seconds "$((seconds + 10))")
  # Beside the server, the trainer trains until the server has ended (a stop
  # file, checked after every step; the seconds are only a cap), so that it
  # covers the server's whole window: however long either one's start-up
  # takes, the server never runs alone.
  [ "$which" = both ] && train_args=(--seconds "$((seconds + 900))" --ready-file "$dir/train.ready" --stop-file "$dir/train.stop")
  if [ "$which" != serve ]; then
    launch "$limiter" train "$name" train "${train_args[@]}" --batch "$train_batch" \
      --image "$image" --model "$model" >"$dir/train.out" 2>"$dir/train.err" &
    trainer=$!
    pids+=("$trainer")
  fi
  if [ "$which" != train ]; then
    if [ "$which" = both ]; then
      # The server starts once the trainer is past its start-up (its warm-up
      # steps done, its timed steps begun).
      for _ in $(seq 6000); do
        [ -e "$dir/train.ready" ] || ! kill -0 "$trainer" 2>/dev/null && break
        sleep 0.1
      done
      sleep "${FRAMEWORKS_TRAIN_HEAD_START:-0}"
    fi
    launch "$limiter" serve "$name" serve --seconds "$seconds" --rate "$rate" --slo-ms "$slo_ms" \
      >"$dir/serve.out" 2>"$dir/serve.err" &
    local server=$!
    wait "$server" || true
    touch "$dir/train.stop"
  fi
  wait "${pids[@]}" || true
  cut -d' ' -f1 /proc/loadavg >"$dir/load.after"
  if [ -n "$nm" ]; then kill "$nm" 2>/dev/null || true; wait "$nm" 2>/dev/null || true; fi
  unset DILU_NODEMGR_SOCKET
  rm -f /dev/shm/simgpu-"$(id -u)"-fw-$$-"$name" 2>/dev/null || true
}

# --- the server's rate and SLO, from its service time alone
if [ -z "$rate" ] || [ -z "$slo_ms" ]; then
  echo "== the server alone, back to back: its warm service time" >&2
  export SIMGPU_INSTANCE=fw-$$-calibrate
  # 50 requests at once (1000/s for 50 ms): answered back to back.
  env LD_LIBRARY_PATH="$libdir" "$python" scripts/frameworks.py serve --seconds 0.05 --rate 1000 --slo-ms 1e9 \
    >"$work/calibrate.out" 2>"$work/calibrate.err" || { cat "$work/calibrate.err" >&2; exit 1; }
  rm -f /dev/shm/simgpu-"$(id -u)"-fw-$$-calibrate
  service_ms=$("$python" -c 'import json,sys; print(json.loads(open(sys.argv[1]).read().splitlines()[-1])["service_ms_mean"])' "$work/calibrate.out")
  [ -n "$rate" ] || rate=$("$python" -c "print(round(0.3 * 1000 / $service_ms, 2))")
  [ -n "$slo_ms" ] || slo_ms=$("$python" -c "print(round(3 * $service_ms, 1))")
  echo "   service ${service_ms} ms back to back: rate $rate/s, SLO $slo_ms ms" >&2
fi

wants alone && { configuration serve-alone none serve; configuration train-alone none train; }
wants none && configuration "no-limiter" none both
wants static && configuration static static both
wants dilu && configuration dilu dilu both
wants noslo && configuration dilu-noslo noslo both
if wants profiled; then
  # The server's profile, found by running its request path alone under
  # `dilu profile` (the profiler's own node manager holds each share).
  mkdir -p "$work/profile"
  echo "== dilu profile of the server (SLO $slo_ms ms, batches up to $profile_max_batch, ${profile_trial}s trials)" >&2
  if "$dilu" profile --sim --class latency --slo-ms "$slo_ms" --max-batch "$profile_max_batch" \
    --trial-seconds "$profile_trial" --output "$work/profile/profile.toml" --json \
    -- "$python" scripts/frameworks.py measure >"$work/profile/profile.json" 2>"$work/profile/profile.err"; then
    configuration dilu-profiled profiled both
  else
    echo "frameworks: dilu profile failed: $(tail -1 "$work/profile/profile.err")" >&2
  fi
fi
if wants hami && [ -n "$vgpu" ]; then configuration hami-core hami both; fi

"$python" scripts/frameworks_report.py "$work" \
  "scripts/bench.sh frameworks${given_args:+ -- $given_args}" \
  "$rate" "$slo_ms" "$split" "$hami_note" "$(git rev-parse --short HEAD)" >bench/results/frameworks.md.new
mv bench/results/frameworks.md.new bench/results/frameworks.md
echo "frameworks: results in bench/results/frameworks.md" >&2
