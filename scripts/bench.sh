#!/usr/bin/env bash
# Runs dilu's benchmarks with one command (no GPU needed) and says where the
# results went. Each one measures dilu and what it is compared with side by
# side in one run.
#
#   overhead   what the interposer adds per driver call (criterion, simgpu null
#              driver), then launch again with an SM-time share
#                                             -> bench/results/overhead.md, overhead-sm-launch.md
#   startup    interposer start-up per process with 0, 16 and 64 other
#              processes of the tenant        -> bench/results/startup.md, startup-cdf.svg
#   sm         SM-time accuracy over the request-style workload matrix, alone
#              and in pairs, under dilu vs plain time slicing (simgpu trace)
#                                             -> bench/results/sm-accuracy.md
#   instructions  instructions per cuLaunchKernel (valgrind's callgrind), directly,
#              through dilu without and with an SM share, and HAMi-core's
#              libvgpu.so on the same loop (DILU_PEER_HAMI)
#                                             -> bench/results/launch-instructions.md
#   syscalls   no syscall on the launch path, with a memory budget and with an
#              SM-time share (strace)
#                                             -> bench/results/syscalls.md
#   placement  cluster-lite placement latency per policy (criterion)
#                                             -> target/criterion/
#   demo       `dilu demo`: request latency of an inference tenant beside a
#              training tenant, per controller (static, dilu-rckm, dilu)
#                                             -> bench/results/demo.md, demo-latency-cdf.svg
#   colocation a primary (inference with an SLO, or training with gaps) beside
#              two deep-queue fillers: no limiter, static, dilu-rckm, dilu and
#              dilu-colo (gap filling per launch) side by side
#                                             -> bench/results/colocation.md
#   ablation   what each SM-time mechanism buys: a reduced SM-time matrix, two
#              co-location shapes and the added ns per launch, with everything
#              on and with each mechanism off in turn (about 6 minutes a round;
#              `-- --repeat 3 --seconds 2.5`, what the results file holds:
#              medians of three rounds, about 19 minutes)
#                                             -> bench/results/ablation.md
#   cluster    the cluster simulator: Alibaba's openb trace in time and under
#              FGD's protocol, the GPU-hours/risk curve, generated traces;
#              every policy, fgd included
#                                             -> bench/results/cluster-sim.md, cluster-sim-*.svg
#   placement-latency
#              one placement decision as the cluster grows to 100,000 GPUs: dilu
#              by its index of node classes and cost floors, and scanning every
#              node, dilu-paper
#                                             -> bench/results/placement-latency.md
#   openb-lists `dilu-cluster simulate --pods --nodes` on every openb pod list in
#              $OPENB_DIR (default bench/data/alibaba-openb): replayed in time
#              where the list has times, under FGD's protocol always
#                                             -> bench/results/openb-lists.md
#   power      watts in placement (PWR's model of idle and full watts per GPU
#              and CPU socket) on openb's default, gpushare, gpuspec and
#              multigpu lists in $OPENB_DIR (default: the one list this
#              repository carries): fgd, PWR+FGD, dilu and dilu-power under
#              FGD's protocol (seeds 1-5) and in time
#                                             -> bench/results/power.md
#   scaling    request-level 2D scaling on Dilu's three arrival patterns, held-out
#              seeds, generated days and a real day (Alibaba's GenAI serving
#              trace): dilu's scaler on the node manager's signals, Dilu's
#              published rule, a Knative-KPA-style and an HPA-style autoscaler
#                                             -> bench/results/scaling.md, scaling-*.svg
#   profile    `dilu profile`'s search against Dilu's published HGSS and an
#              exhaustive search, on Dilu's measured tables (no GPU, no run)
#                                             -> bench/results/profile.md
#   soak       the node manager under churn: tenants SIGKILLed, the daemon
#              SIGKILLed and restarted, budget changes, hostile clients;
#              invariants checked throughout (default 300 s, 6 tenants)
#                                             -> bench/results/soak.md
#   control-period
#              one control period's work (sampling, each GPU's controller,
#              budgets) on made-up nodes up to 8 GPUs x 64 tenants, per GPU
#              and as one group
#                                             -> bench/results/control-period.md
#   multigpu   an 8-GPU simgpu node with 24 tenants of mixed classes placed by
#              the node manager, under dilu and static: per-GPU busy time, SLO
#              violations, training throughput, control work per period; the
#              same without dilu, with the servers apart and alone; and the
#              2-GPU case (batch rate and latency SLO, each against alone)
#                                             -> bench/results/multigpu.md
#   frameworks a BERT-base inference server (Poisson requests, an SLO) beside a
#              ResNet-50 training loop, unmodified PyTorch on simgpu: alone, no
#              limiter, static, dilu (defaults, roles), HAMi-core (with
#              DILU_PEER_HAMI or HAMI_CORE_SRC); needs a torch venv, see scripts/frameworks.sh --help
#                                             -> bench/results/frameworks.md
#   field      the field's yardstick over shapes drawn from the co-location
#              class: the primary's p50/p99 (training: iterations/s) against
#              its run alone and the fillers' harvest of its idle time, for
#              time slicing, static shares, HAMi-core, XSched, TGS and dilu
#              with and without an SLO; the peers are built from their
#              sources by scripts/build-peers.sh and named by DILU_PEER_HAMI,
#              DILU_PEER_XSCHED and DILU_PEER_TGS (source target/peers/env.sh);
#              rows for the others say why they did not run
#                                             -> bench/results/field.md
#   llm        vLLM's OpenAI server (unmodified) beside PyTorch fine-tuning on
#              one simgpu: TTFT and TPOT p50/p99 against the server alone,
#              the filler's throughput against alone, device and host busy, for
#              time slicing, static shares, HAMi-core (DILU_PEER_HAMI) and dilu
#              with and without an SLO, also with bursty arrivals; two servers
#              on one GPU; then vLLM's sleep mode and PyTorch's
#              expandable segments under --mem; installs vLLM into a venv the
#              first time (see scripts/llm-bench.sh)
#                                             -> bench/results/llm.md
#   loaded-host  a batch loop on simgpu while CPU-bound processes keep every
#              core busy: the device's busy share under `dilu run --colo filler`
#              (nice 19) against the loop without co-location at nice 0 and 19
#                                             -> bench/results/loaded-host.md
#   peers      dilu and HAMi-core's libvgpu.so side by side on simgpu + its NVML
#              (needs HAMI_CORE_SRC=<HAMi-core checkout>; see scripts/peers.sh --help)
#                                             -> bench/results/peers.md
#
# usage: scripts/bench.sh [all | overhead | startup | sm | instructions | syscalls | placement | demo | colocation | field | ablation | cluster | placement-latency | openb-lists | power | scaling | profile | soak | control-period | multigpu | frameworks | llm | loaded-host | peers ...] [-- ARGS]
#   ARGS go to the one benchmark named, e.g. `scripts/bench.sh startup -- --runs 50`
#   or `scripts/bench.sh overhead -- cuLaunchKernel` (a criterion filter)
#   or `scripts/bench.sh demo -- --seconds 10` (per controller; default 5)
#   or `scripts/bench.sh soak -- --seconds 180 --tenants 6 --seed 1`
#   or `scripts/bench.sh cluster -- --seeds 10` (FGD-protocol seeds; default 5; --tune-seeds: the harness, default 8).
# The real-driver overhead needs a GPU: scripts/gpu-check.sh (-> bench/results/real-overhead.md).
set -euo pipefail
cd "$(dirname "$0")/.."

targets=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
  case $1 in
    all) targets+=(overhead startup sm syscalls placement demo colocation cluster placement-latency openb-lists power scaling profile control-period multigpu) ;;
    overhead | startup | sm | instructions | syscalls | placement | demo | colocation | field | ablation | cluster | placement-latency | openb-lists | power | scaling | profile | soak | control-period | multigpu | frameworks | llm | loaded-host | peers) targets+=("$1") ;;
    -h | --help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
    *) echo "bench: unknown benchmark '$1' (all, overhead, startup, sm, instructions, syscalls, placement, demo, colocation, field, ablation, cluster, placement-latency, openb-lists, power, scaling, profile, soak, control-period, multigpu, frameworks, llm, loaded-host, peers)" >&2; exit 2 ;;
  esac
  shift
done
[ "${1:-}" = "--" ] && shift
extra=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(overhead startup sm syscalls placement demo cluster profile)
if [ ${#extra[@]} -gt 0 ] && [ ${#targets[@]} -ne 1 ]; then
  echo "bench: arguments after -- need exactly one benchmark named" >&2
  exit 2
fi

# These run nothing on the GPU side and build only what they use.
needs_gpu_side=
for target in "${targets[@]}"; do
  case $target in
    profile | cluster | placement-latency | openb-lists | scaling | control-period | frameworks | llm) ;;
    *) needs_gpu_side=yes ;;
  esac
done
if [ -n "$needs_gpu_side" ]; then
  echo "== building (release): simgpu, the interposer, the benchmark clients" >&2
  cargo build --release -p simgpu -p simgpu-nvml -p dilu-interposer -p dilu-bench -p dilu-nodemgr -p dilu-tests --lib --bins
fi

# realtime_bench NAME: runs dilu-bench's benchmark NAME with the extra
# arguments. Latency on simgpu depends on when the host runs each process:
# at real-time priority (where permitted) the host's other work does not
# delay the primary, the fillers or the simulated device.
realtime_bench() {
  cargo bench --no-run -p dilu-bench --bench "$1"
  local realtime=()
  if chrt -r 10 true 2>/dev/null; then
    realtime=(chrt -r 10)
  else
    echo "bench: $1 at normal priority (chrt -r not permitted): on a loaded host its latencies are noisier" >&2
  fi
  "${realtime[@]}" cargo bench -p dilu-bench --bench "$1" -- "${extra[@]}"
}

results=()
failed=()
for target in "${targets[@]}"; do
  echo "== $target" >&2
  case $target in
    overhead)
      cargo bench -p dilu-bench --bench overhead -- "${extra[@]}" || failed+=(overhead)
      # The same launch rows again with an SM-time share (within budget).
      DILU_SM_LIMIT=99 DILU_TENANT="bench-sm-$$" \
        cargo bench -p dilu-bench --bench overhead -- cuLaunchKernel || failed+=(overhead-sm)
      rm -f "/dev/shm/dilu-$(id -u)/bench-sm-$$".*
      results+=("bench/results/overhead.md, overhead-sm-launch.md (and criterion's reports in target/criterion/)") ;;
    startup)
      cargo bench -p dilu-bench --bench startup -- "${extra[@]}" || failed+=(startup)
      results+=(bench/results/startup.md bench/results/startup-cdf.svg) ;;
    sm)
      cargo bench -p dilu-bench --bench sm_accuracy -- "${extra[@]}" || failed+=(sm)
      results+=(bench/results/sm-accuracy.md) ;;
    instructions)
      scripts/launch-instructions.sh --no-build || failed+=(instructions)
      results+=(bench/results/launch-instructions.md) ;;
    syscalls)
      scripts/syscalls.sh --no-build || failed+=(syscalls)
      results+=(bench/results/syscalls.md) ;;
    placement)
      cargo bench -p dilu-cluster --bench placement -- "${extra[@]}" || failed+=(placement)
      results+=("target/criterion/ (placement: printed above)") ;;
    demo)
      cargo bench -p dilu-bench --bench demo -- "${extra[@]}" || failed+=(demo)
      results+=(bench/results/demo.md bench/results/demo-latency-cdf.svg) ;;
    colocation)
      realtime_bench colocation || failed+=(colocation)
      # One case, one configuration or the class alone: printed, no file.
      case " ${extra[*]} " in
        *" --shape "* | *" --config "* | *" --class-only "* | *" --class-shape "*)
          results+=("(colocation: printed above, bench/results/colocation.md left as it was)") ;;
        *) results+=(bench/results/colocation.md) ;;
      esac ;;
    ablation)
      cargo bench -p dilu-bench --bench ablation -- "${extra[@]}" || failed+=(ablation)
      results+=(bench/results/ablation.md) ;;
    cluster)
      # Old figures go first: every figure the file links is written anew.
      rm -f bench/results/cluster-sim*.svg
      cargo run --release -q -p dilu-cluster --bin cluster-sim-report -- "${extra[@]}" || failed+=(cluster)
      results+=("bench/results/cluster-sim.md, cluster-sim-*.svg") ;;
    placement-latency)
      cargo run --release -q -p dilu-cluster --bin placement-latency -- "${extra[@]}" || failed+=(placement-latency)
      results+=(bench/results/placement-latency.md) ;;
    openb-lists)
      dir=${OPENB_DIR:-bench/data/alibaba-openb}
      cargo build --release -q -p dilu-cluster --bin dilu-cluster || failed+=(openb-lists)
      {
        echo "# \`dilu-cluster simulate --pods --nodes\` on every openb pod list"
        echo
        echo "Written by \`OPENB_DIR=<folder> scripts/bench.sh openb-lists\` (the lists of Alibaba's"
        echo "cluster-trace-gpu-v2023, \`csv/\`; this repository carries the default list and the node list)."
        echo "Policies \`dilu\` and \`fgd\` (FGD, told the drawn pods' task mix), nodes \`openb_node_list_gpu_node.csv\`,"
        echo "80 GiB per GPU. For each list: what its header lacks, the replay in time where it has times, FGD's"
        echo "protocol (to 130%, seeds 1 to 10: each seed draws other pods) always. Pods without GPUs take"
        echo "cores and memory on the node each policy chooses (FGD's lists \`cpu0\` to \`cpu300\` hold the"
        echo "default list's GPU pods with none to 3,030 such pods; the default list has 1,088)."
        err=$(mktemp)
        for pods in "$dir"/openb_pod_list_*.csv; do
          name=$(basename "$pods")
          echo
          echo "## $name"
          echo
          run=(target/release/dilu-cluster simulate --policy dilu,fgd --pods "$pods" --nodes "$dir/openb_node_list_gpu_node.csv")
          if replay=$("${run[@]}" 2>"$err"); then
            echo "$replay"
          else
            echo "Replay: $(sed -n 's/^dilu-cluster: //p' "$err" | tail -n 1)"
          fi
          sed -n 's/^dilu-cluster: pod list [^:]*: columns/Columns/p' "$err" | head -n 1
          echo
          for seed in 1 2 3 4 5 6 7 8 9 10; do
            "${run[@]}" --protocol fgd --seed "$seed" 2>/dev/null || echo "FGD protocol (seed $seed): failed"
            echo
          done
        done
        rm -f "$err"
      } >bench/results/openb-lists.md.new \
        && python3 scripts/openb_lists_summary.py bench/results/openb-lists.md.new \
        && mv bench/results/openb-lists.md.new bench/results/openb-lists.md || failed+=(openb-lists)
      results+=(bench/results/openb-lists.md) ;;
    power)
      dir=${OPENB_DIR:-bench/data/alibaba-openb}
      cargo build --release -q -p dilu-cluster --bin dilu-cluster || failed+=(power)
      policies=fgd,pwr-fgd,dilu,dilu-power
      {
        echo "# Watts in placement: \`dilu-cluster simulate\` on openb's pod lists"
        echo
        echo "Written by \`OPENB_DIR=<folder> scripts/bench.sh power\` (without the folder, the one list"
        echo "this repository carries). Nodes \`openb_node_list_gpu_node.csv\`, 80 GiB per GPU; policies"
        echo "$policies at their defaults (\`pwr-fgd\`: PWR 200, FGD 800; \`dilu-power\`: dilu with its"
        echo "price on watts; \`dilu\` has none). Watts by PWR's model (\`placement/src/model/power.rs\`): a"
        echo "GPU draws its full watts once anything runs on it, a CPU socket once any of its cores is taken."
        echo "Lists: the default, gpushare, gpuspec and multigpu ones (the PWR paper's 13 and two more)."
        echo "Each: FGD's protocol (to 130% of the GPU capacity requested, seeds 1 to 5) and, where the"
        echo "list has times, its replay in time. The price \`dilu-power\` puts on watts was chosen on the"
        echo "default list; the other lists were not looked at for it."
        for pods in "$dir"/openb_pod_list_*.csv; do
          name=$(basename "$pods" .csv)
          case ${name#openb_pod_list_} in
            default | gpushare* | gpuspec* | multigpu*) ;;
            *) continue ;;
          esac
          echo "power: $name" >&2
          echo
          echo "## $name"
          echo
          run=(target/release/dilu-cluster simulate --policy "$policies" --pods "$pods" --nodes "$dir/openb_node_list_gpu_node.csv")
          "${run[@]}" 2>/dev/null || echo "Replay: not replayable in time"
          echo
          for seed in 1 2 3 4 5; do
            "${run[@]}" --protocol fgd --seed "$seed" 2>/dev/null || echo "FGD protocol (seed $seed): failed"
            echo
          done
        done
      } >bench/results/power.md.new \
        && python3 scripts/power_summary.py bench/results/power.md.new \
        && mv bench/results/power.md.new bench/results/power.md || failed+=(power)
      results+=(bench/results/power.md) ;;
    scaling)
      rm -f bench/results/scaling-*.svg
      cargo run --release -q -p dilu-cluster --bin scaling-report -- "${extra[@]}" || failed+=(scaling)
      results+=("bench/results/scaling.md, scaling-*.svg") ;;
    profile)
      {
        echo "# \`dilu profile\`: search methods on measured tables"
        echo
        echo "Command: \`scripts/bench.sh profile\` (runs \`profile-compare\` over"
        echo "\`bench/data/dilu-profiles/*.csv\` and, held out, \`bench/data/dilu-profiles-heldout/*.csv\`)."
        echo "Tables: Dilu's measurements on a real GPU under MPS (sources in each folder's SOURCE.md)."
        echo
        cargo run --release -q -p dilu-profile --bin profile-compare -- \
          bench/data/dilu-profiles/*.csv --held-out bench/data/dilu-profiles-heldout/*.csv
      } >bench/results/profile.md.new && mv bench/results/profile.md.new bench/results/profile.md || failed+=(profile)
      results+=(bench/results/profile.md) ;;
    soak)
      target/release/soak --report bench/results/soak.md.new "${extra[@]}" \
        && mv bench/results/soak.md.new bench/results/soak.md || failed+=(soak)
      results+=(bench/results/soak.md) ;;
    control-period)
      {
        echo "# One control period's work on a full node"
        echo
        echo "Command: \`scripts/bench.sh control-period${extra[*]:+ -- ${extra[*]}}\` (runs the \`control-period\` binary of"
        echo "\`dilu-nodemgr\`, release build). Each row times the work the daemon's control loop"
        echo "does under the registry lock every period (5 ms by default): sample every tenant's"
        echo "telemetry, run each GPU's controller over that GPU's tenants, write the budgets. The"
        echo "tenants are made up (one in four serves requests with a 50 ms SLO, the rest train; all"
        echo "launch between periods), placed round-robin on the GPUs; \"one group\" runs the same"
        echo "tenants through one controller, as the node manager did before control was per GPU."
        echo "CPU time is the control thread's own (it leaves out time other processes ran instead);"
        echo "wall time includes it. Machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg) at the start."
        echo
        cargo run --release -q -p dilu-nodemgr --bin control-period -- "${extra[@]}"
      } >bench/results/control-period.md.new && mv bench/results/control-period.md.new bench/results/control-period.md || failed+=(control-period)
      results+=(bench/results/control-period.md) ;;
    multigpu)
      python3 scripts/multigpu_bench.py target/release bench/results/multigpu.md "${extra[@]}" >/dev/null || failed+=(multigpu)
      results+=(bench/results/multigpu.md) ;;
    frameworks)
      scripts/frameworks.sh "${extra[@]}" || failed+=(frameworks)
      results+=(bench/results/frameworks.md) ;;
    loaded-host)
      scripts/loaded-host.sh --no-build "${extra[@]}" || failed+=(loaded-host)
      results+=(bench/results/loaded-host.md) ;;
    field)
      realtime_bench field || failed+=(field)
      case " ${extra[*]} " in
        *" --shape "* | *" --only "* | *" --seed "*)
          results+=("(field: printed above, bench/results/field.md left as it was)") ;;
        *) results+=(bench/results/field.md) ;;
      esac ;;
    llm)
      scripts/llm-bench.sh "${extra[@]}" || failed+=(llm)
      results+=(bench/results/llm.md) ;;
    peers)
      scripts/peers.sh "${extra[@]}" || failed+=(peers)
      results+=(bench/results/peers.md) ;;
  esac
done

echo >&2
echo "bench: results in:" >&2
printf '  %s\n' "${results[@]}" >&2
echo "bench: the real-driver overhead runs on a GPU host: scripts/gpu-check.sh (bench/results/real-overhead.md)" >&2
if [ ${#failed[@]} -gt 0 ]; then
  echo "bench: failed: ${failed[*]}" >&2
  exit 1
fi
