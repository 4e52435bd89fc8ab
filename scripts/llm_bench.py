"""LLM serving beside fine-tuning on one simulated GPU, judged by TTFT and
TPOT against the server alone (run by scripts/llm-bench.sh, which installs
vLLM and builds dilu; see there for the command).

    python llm_bench.py --dilu BIN --out FILE [--seconds S] [--rate R] [--seed N]
                        [--rows NAME,...] [--slo-ms MS]

Each row starts its processes on a fresh simulated GPU (its own
SIMGPU_INSTANCE), waits until they are warm, then sends the same requests
(Poisson arrivals, fixed seed; the bursty rows' in bursts of twice the rate
and pauses as long; the two-server rows' to both servers) to vLLM's OpenAI
API for S seconds and
measures, client side, each request's time to first token (TTFT: from its
send to its first streamed token) and time per output token (TPOT: from the
first token to the last, over the tokens after the first). The filler
reports when each of its training steps (or, offline vLLM, its batches)
ended; its throughput counts the steps that ended inside the measured
window. Device busy is simgpu's
busy-time counter read through its NVML once a second; host busy is
/proc/stat over the same window.
"""

import argparse
import asyncio
import json
import math
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from typing import NamedTuple

SCRIPTS = os.path.dirname(os.path.abspath(__file__))
PORT = 18911

# The served model: the shape of a 1B-parameter Llama (16 layers, width
# 2048, grouped-query attention with 8 KV heads), random weights.
MODEL = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama",
    "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
    "vocab_size": 32000, "max_position_embeddings": 2048, "rms_norm_eps": 1e-5,
    "torch_dtype": "bfloat16", "bos_token_id": 1, "eos_token_id": 2,
    "tie_word_embeddings": True,
}
MAX_MODEL_LEN = 1024
PROMPT_TOKENS = (32, 512)
OUTPUT_TOKENS = (16, 128)
SERVER_MEM = "8GiB"
FILLER_MEM = "4GiB"
# The share a static split (and HAMi-core's core limit) gives the server.
STATIC_SERVER_PCT = 70

# name -> (server's dilu flags, filler's dilu flags, runs the server, runs the filler)
# None as flags: not under dilu (HAMi-core's library instead).
HOST_ONLY = "host only (filler on a second simulated GPU)"
NICE_0 = "filler at the server's CPU priority (--cpu-nice 0): dilu with "
ROWS = {
    "server alone": ([], None, True, False),
    "filler alone": (None, [], False, True),
    "time slicing (no limiter)": ([], [], True, True),
    # Control: the filler on a second simulated GPU, so the two share only
    # the host (its cores, memory, scheduler): what co-location costs on
    # this machine before any GPU sharing.
    HOST_ONLY: ([], [], True, True),
    f"static shares ({STATIC_SERVER_PCT}/{100 - STATIC_SERVER_PCT})":
        (["--sm", str(STATIC_SERVER_PCT)], ["--sm", str(100 - STATIC_SERVER_PCT)], True, True),
    "HAMi-core": ("hami", "hami", True, True),
    "dilu defaults (--colo primary / filler)": (["--colo", "primary"], ["--colo", "filler"], True, True),
    "dilu with an SLO (--slo-ms)": (["--colo", "primary", "--slo-ms", "SLO"], ["--colo", "filler"], True, True),
    # What lowering a filler's CPU priority (dilu run's default for a
    # filler: nice 19) does, against the filler at the server's priority.
    NICE_0 + "defaults": (["--colo", "primary"], ["--colo", "filler", "--cpu-nice", "0"], True, True),
    NICE_0 + "an SLO": (["--colo", "primary", "--slo-ms", "SLO"], ["--colo", "filler", "--cpu-nice", "0"],
                        True, True),
}
# The rows run again with bursty arrivals (the same mean rate, all of it in
# bursts): bursty row -> the row whose processes it runs.
BURSTY = " - bursty arrivals"
BURSTY_ROWS = {name + BURSTY: name for name in (
    "server alone", "time slicing (no limiter)", "dilu defaults (--colo primary / filler)",
    "dilu with an SLO (--slo-ms)")}
# Arrivals come in bursts of this long at twice the rate, each followed by
# as long without any.
BURST_S = 10.0


class TwoServers(NamedTuple):
    """How a row runs two servers, each `--mem`."""
    flags: list
    # A node manager runs them (each a tenant of its own).
    node_manager: bool = False
    # Their arrivals are independent, not the same requests at the same
    # instants.
    independent: bool = False
    # Each on a simulated GPU of its own: they share only the host.
    own_gpus: bool = False


ELASTIC = ["--class", "latency", "--slo-ms", "SLO", "--sm-request", "50", "--sm-limit", "100"]
INDEPENDENT = "two servers with independent arrivals: "
TWO_HOST_ONLY = "host only (each server on a simulated GPU of its own)"
TWO_SERVERS = {
    "two servers: " + TWO_HOST_ONLY: TwoServers([], own_gpus=True),
    "two servers: time slicing (no limiter)": TwoServers([]),
    "two servers: dilu --sm 50 each": TwoServers(["--sm", "50"]),
    "two servers: dilu node manager with --slo-ms --sm-request 50 --sm-limit 100 each":
        TwoServers(ELASTIC, node_manager=True),
    INDEPENDENT + TWO_HOST_ONLY: TwoServers([], independent=True, own_gpus=True),
    INDEPENDENT + "time slicing (no limiter)": TwoServers([], independent=True),
    INDEPENDENT + "dilu node manager with --slo-ms --sm-request 50 --sm-limit 100 each":
        TwoServers(ELASTIC, node_manager=True, independent=True),
}
# The rows run again with offline vLLM batch generation as the filler
# (scripts/llm_offline_filler.py: the server's model, 16 prompts of 256
# tokens, 64 generated each, batch after batch) instead of fine-tuning:
# offline row -> the row whose flags it runs.
OFFLINE = " - offline vLLM filler"
OFFLINE_ROWS = {name + OFFLINE: name for name in (
    "filler alone", "time slicing (no limiter)", "dilu defaults (--colo primary / filler)",
    "dilu with an SLO (--slo-ms)")}
ALL_ROWS = [*ROWS, *BURSTY_ROWS, *OFFLINE_ROWS, *TWO_SERVERS]


def log(message):
    print(f"llm-bench: {message}", file=sys.stderr, flush=True)


def percentile(values, p):
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(p / 100 * len(ordered)) - 1))]


def host_busy_ticks():
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    idle = fields[3] + fields[4]
    return sum(fields) - idle, sum(fields)


class Row:
    """The processes of one row and what they measured."""

    def __init__(self, args, name, scratch):
        self.args, self.name = args, name
        self.scratch = os.path.join(scratch, re.sub(r"[^A-Za-z0-9]+", "-", name).strip("-"))
        os.makedirs(self.scratch)
        self.instance = f"llm-bench-{os.getpid()}-{len(os.listdir(scratch))}"
        self.env = dict(os.environ, SIMGPU_INSTANCE=self.instance, SIMGPU_WAVE_NS=args.wave,
                        VLLM_USE_FLASHINFER_SAMPLER="0", VLLM_USE_V2_MODEL_RUNNER="0")
        for name_ in ("DILU_MEM_LIMIT", "DILU_SM_LIMIT", "DILU_TENANT", "CUDA_VISIBLE_DEVICES",
                      "DILU_COLO_TOLERANCE", "DILU_COLO_GUARANTEE", "DILU_NODEMGR_SOCKET"):
            self.env.pop(name_, None)
        self.processes = []

    def command(self, flags, mem, program, hami_pct, tag):
        """`dilu run --sim` with flags, or the bare program under HAMi-core."""
        if flags == "hami":
            env = dict(self.env, LD_PRELOAD=self.args.hami, CUDA_REDIRECT=self.args.hami,
                       LD_LIBRARY_PATH=self.args.driver_dir,
                       CUDA_DEVICE_MEMORY_SHARED_CACHE=os.path.join(self.scratch, f"hami-{tag}.cache"),
                       CUDA_DEVICE_MEMORY_LIMIT=f"{int(mem[:-3]) * 1024}m",
                       CUDA_DEVICE_SM_LIMIT=str(hami_pct), LIBCUDA_LOG_LEVEL="0")
            return program, env
        flags = [self.args.slo_ms if f == "SLO" else f for f in flags]
        return [self.args.dilu, "run", "--sim", "--mem", mem, *flags, "--", *program], self.env

    def start(self, argv, env, tag):
        out = open(os.path.join(self.scratch, f"{tag}.out"), "w")
        err = open(os.path.join(self.scratch, f"{tag}.err"), "w")
        process = subprocess.Popen(argv, env=env, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                   start_new_session=True)
        self.processes.append((tag, process))
        return process

    def failure(self, tag, what):
        with open(os.path.join(self.scratch, f"{tag}.err")) as f:
            lines = [l.strip() for l in f if l.strip()]
        tail = " / ".join(lines[-3:])[-500:]
        return f"{tag}: {what}: {tail or 'no output'}"

    def stop(self):
        """The filler ends after its step, the server as at Ctrl-C (it ends
        its engine), the rest at once; a group still there after 60 s is
        killed."""
        open(os.path.join(self.scratch, "stop"), "w").close()
        for tag, process in self.processes:
            if process.poll() is None and tag != "filler":
                os.killpg(process.pid, signal.SIGINT if tag.startswith("server") else signal.SIGTERM)
        deadline = time.monotonic() + 60
        for _, process in self.processes:
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            process.wait()
        self.processes = []


def start_filler(row, flags, model, offline=False):
    nice = ["nice", "-n", str(row.args.filler_nice)] if row.args.filler_nice else []
    files = ["--ready-file", os.path.join(row.scratch, "ready"), "--stop-file", os.path.join(row.scratch, "stop")]
    if offline:
        program = [*nice, row.args.python, os.path.join(SCRIPTS, "llm_offline_filler.py"), "--model", model, *files]
    else:
        program = [*nice, row.args.python, os.path.join(SCRIPTS, "frameworks.py"), "finetune", "--seconds",
                   "100000", *files]
    argv, env = row.command(flags, FILLER_MEM, program, 100 - STATIC_SERVER_PCT, "filler")
    if row.name == HOST_ONLY:
        env = dict(env, SIMGPU_INSTANCE=env["SIMGPU_INSTANCE"] + "-second")
    process = row.start(argv, env, "filler")
    deadline = time.monotonic() + 600
    while not os.path.exists(os.path.join(row.scratch, "ready")):
        if process.poll() is not None:
            raise RuntimeError(row.failure("filler", f"exited with {process.returncode} before it was warm"))
        if time.monotonic() > deadline:
            raise RuntimeError("filler: not warm after 600 s")
        time.sleep(0.5)


def start_server(row, flags, model, tag="server", port=PORT, instance_suffix=""):
    program = [os.path.join(os.path.dirname(row.args.python), "vllm"), "serve", model,
               "--load-format", "dummy", "--skip-tokenizer-init", "--enforce-eager",
               "--gpu-memory-utilization", "0.6", "--max-model-len", str(MAX_MODEL_LEN),
               "--port", str(port), "--host", "127.0.0.1"]
    argv, env = row.command(flags, SERVER_MEM, program, STATIC_SERVER_PCT, tag)
    if instance_suffix:
        env = dict(env, SIMGPU_INSTANCE=env["SIMGPU_INSTANCE"] + instance_suffix)
    process = row.start(argv, env, tag)
    started = time.monotonic()
    while not asyncio.run(server_ready(port)):
        if process.poll() is not None:
            raise RuntimeError(row.failure(tag, f"exited with {process.returncode} while starting"))
        if time.monotonic() - started > 900:
            raise RuntimeError(f"{tag}: not answering after 900 s")
        time.sleep(1)
    return time.monotonic() - started


async def server_ready(port):
    import aiohttp

    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://127.0.0.1:{port}/v1/models") as response:
                return response.status == 200
    except aiohttp.ClientError:
        return False


def requests_for(args, bursty=False, seed=None):
    """The same arrivals and lengths for every row of an arrival pattern:
    (send offset s, prompt, output tokens). Bursty: Poisson at twice the
    rate, kept only in the first half of every 2 x BURST_S."""
    draw = random.Random(args.seed if seed is None else seed)
    at, schedule = 0.0, []
    rate = args.rate * 2 if bursty else args.rate
    while True:
        at += draw.expovariate(rate)
        if at >= args.seconds:
            return schedule
        prompt = [draw.randrange(3, MODEL["vocab_size"]) for _ in range(draw.randint(*PROMPT_TOKENS))]
        tokens = draw.randint(*OUTPUT_TOKENS)
        if not bursty or at % (2 * BURST_S) < BURST_S:
            schedule.append((at, prompt, tokens))


async def one_request(session, model, prompt, tokens, port=PORT):
    body = {"model": model, "prompt": prompt, "max_tokens": tokens, "min_tokens": tokens,
            "ignore_eos": True, "temperature": 0, "stream": True}
    sent = time.monotonic()
    first = last = None
    chunks = 0
    async with session.post(f"http://127.0.0.1:{port}/v1/completions", json=body) as response:
        if response.status != 200:
            raise RuntimeError(f"HTTP {response.status}: {(await response.text())[:200]}")
        async for line in response.content:
            line = line.strip()
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            now = time.monotonic()
            first = first or now
            last = now
            chunks += 1
    if first is None:
        raise RuntimeError("no token streamed")
    return {"ttft_ms": (first - sent) * 1e3,
            "tpot_ms": (last - first) * 1e3 / (tokens - 1) if tokens > 1 else None,
            "chunks": chunks, "end": last}


async def load(model, schedules, ports=(PORT,)):
    """Sends each of `schedules` to the server on the port beside it in
    `ports`; returns when it began and each server's results."""
    import aiohttp

    timeout = aiohttp.ClientTimeout(total=600)
    # vLLM's server closes a connection idle for 5 s (VLLM_HTTP_TIMEOUT_KEEP_ALIVE);
    # aiohttp keeps one for 15 s by default, so a request sent on a pooled
    # connection as the server closes it can fail with a connection reset
    # (likely what one request of a two-server row met). Pooled connections
    # are dropped well before the server's limit.
    connector = aiohttp.TCPConnector(keepalive_timeout=2)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        for port in ports:
            for _ in range(3):  # warm-up, not measured
                await one_request(session, model, list(range(3, 67)), 16, port)
        begin = time.monotonic()

        async def at(offset, prompt, tokens, port):
            await asyncio.sleep(max(0.0, begin + offset - time.monotonic()))
            return await one_request(session, model, prompt, tokens, port)

        results = await asyncio.gather(*(at(*r, port) for port, schedule in zip(ports, schedules)
                                         for r in schedule), return_exceptions=True)
    each, taken = [], 0
    for schedule in schedules:
        each.append(results[taken:taken + len(schedule)])
        taken += len(schedule)
    return begin, each


def busy_sampler(row):
    """A process polling simgpu's NVML once a second: 'monotonic_ns percent' lines."""
    code = ("import time, pynvml\n"
            "pynvml.nvmlInit(); h = pynvml.nvmlDeviceGetHandleByIndex(0)\n"
            "while True:\n"
            "    time.sleep(1.0)\n"
            "    print(time.monotonic_ns(), pynvml.nvmlDeviceGetUtilizationRates(h).gpu, flush=True)\n")
    env = dict(row.env, LD_LIBRARY_PATH=row.args.driver_dir)
    return row.start([row.args.python, "-c", code], env, "busy")


def filler_steps(row):
    """When each of the filler's steps ended, and the tokens a step
    generates (offline vLLM; None for fine-tuning)."""
    path = os.path.join(row.scratch, "filler.out")
    for line in open(path):
        if line.startswith("{"):
            result = json.loads(line)
            return result["step_end_ns"], result.get("tokens_per_step")
    raise RuntimeError(row.failure("filler", "printed no result"))


def server_figures(results):
    """A server's requests: how many answered, the first failure, TTFT and TPOT."""
    failed = [r for r in results if isinstance(r, Exception)]
    done = [r for r in results if not isinstance(r, Exception)]
    return {"requests": len(done), "failed": len(failed),
            "failure": str(failed[0])[:200] if failed else None,
            "ttft": [r["ttft_ms"] for r in done],
            "tpot": [r["tpot_ms"] for r in done if r["tpot_ms"] is not None],
            "end": max((r["end"] for r in done), default=time.monotonic())}


def busy_over(row, ticks_before, begin, end):
    """Host busy since `ticks_before` and the device busy samples from
    `begin` to `end` (the first second left out), now."""
    ticks_after = host_busy_ticks()
    lo, hi = begin * 1e9, end * 1e9
    with open(os.path.join(row.scratch, "busy.out")) as f:
        samples = [int(v.split()[1]) for v in f if v.strip() and lo + 1e9 <= int(v.split()[0]) <= hi]
    return {"host_busy": (ticks_after[0] - ticks_before[0]) / max(1, ticks_after[1] - ticks_before[1]),
            "device_busy": sum(samples) / len(samples) / 100 if samples else None}


def run_row(args, name, scratch, model):
    if name in TWO_SERVERS:
        return run_two_servers(args, name, scratch, model)
    bursty = name in BURSTY_ROWS
    offline = name in OFFLINE_ROWS
    base = BURSTY_ROWS.get(name) or OFFLINE_ROWS.get(name) or name
    server_flags, filler_flags, with_server, with_filler = ROWS[base]
    row = Row(args, name, scratch)
    result = {"row": name, "bursty": bursty}
    try:
        if "hami" in (server_flags, filler_flags) and not args.hami:
            raise RuntimeError("not run: DILU_PEER_HAMI names no libvgpu.so built from HAMi-core's sources")
        if with_filler:
            log(f"{name}: starting the filler")
            start_filler(row, filler_flags, model, offline)
        if with_server:
            log(f"{name}: starting vLLM")
            result["server_start_s"] = start_server(row, server_flags, model)
        busy_sampler(row)
        ticks_before = host_busy_ticks()
        log(f"{name}: measuring for {args.seconds:g} s")
        if with_server:
            begin, (results,) = asyncio.run(load(model, [requests_for(args, bursty)]))
            result.update(server_figures(results))
            end = result.pop("end")
        else:
            begin = time.monotonic()
            time.sleep(args.seconds)
            end = time.monotonic()
        result["window_s"] = end - begin
        result.update(busy_over(row, ticks_before, begin, end))
        row.stop()
        lo, hi = begin * 1e9, end * 1e9
        if with_filler:
            ends, tokens_per_step = filler_steps(row)
            steps = [t for t in ends if lo <= t <= hi]
            result["filler_steps_per_s"] = len(steps) / (end - begin)
            result["filler_tokens_per_step"] = tokens_per_step
    except Exception as e:  # noqa: BLE001 - the row says why it has no figures
        result["error"] = str(e)
        log(f"{name}: {e}")
        row.stop()
    return result


def start_node_manager(row):
    """`dilu nodemgr --sim` at its defaults on the row's simulated GPU, on a
    socket of the row's own; the flags that point a tenant at it."""
    # A socket path is at most 107 bytes: in the run's folder (removed at
    # the end), as the row's own may be longer.
    socket = os.path.join(os.path.dirname(row.scratch), row.instance + ".sock")
    argv = [row.args.dilu, "nodemgr", "--sim", "--foreground", "--socket", socket,
            "--run-dir", os.path.join(row.scratch, "nodemgr-run"), "--metrics", ""]
    process = row.start(argv, row.env, "nodemgr")
    deadline = time.monotonic() + 60
    while not os.path.exists(socket):
        if process.poll() is not None:
            raise RuntimeError(row.failure("nodemgr", f"exited with {process.returncode} while starting"))
        if time.monotonic() > deadline:
            raise RuntimeError("nodemgr: no socket after 60 s")
        time.sleep(0.2)
    return ["--socket", socket]


def run_two_servers(args, name, scratch, model):
    """Two servers with the same flags, sent the same requests at the same
    instants, or independent ones (the second server's drawn from another
    seed)."""
    spec = TWO_SERVERS[name]
    flags = spec.flags
    row = Row(args, name, scratch)
    result = {"row": name}
    try:
        if spec.node_manager:
            log(f"{name}: starting the node manager")
            flags = [*start_node_manager(row), *flags]
        for k, tag in enumerate(("server", "server-b")):
            log(f"{name}: starting vLLM ({tag})")
            # Server B on the second simulated GPU where they share only
            # the host (the busy sampler reads the first: server A's).
            suffix = "-second" if spec.own_gpus and k == 1 else ""
            start_server(row, [*flags, "--tenant", tag] if spec.node_manager else flags, model, tag, PORT + k,
                         suffix)
        busy_sampler(row)
        ticks_before = host_busy_ticks()
        log(f"{name}: measuring for {args.seconds:g} s")
        second = requests_for(args, seed=args.seed + 1000) if spec.independent else requests_for(args)
        begin, each = asyncio.run(load(model, [requests_for(args), second], (PORT, PORT + 1)))
        result["servers"] = [server_figures(results) for results in each]
        end = max(server["end"] for server in result["servers"])
        result.update(busy_over(row, ticks_before, begin, end))
        row.stop()
    except Exception as e:  # noqa: BLE001 - the row says why it has no figures
        result["error"] = str(e)
        log(f"{name}: {e}")
        row.stop()
    return result


def fmt(value, digits=2, suffix=""):
    return "—" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}{suffix}"


def server_cells(r, alone):
    """Requests, TTFT, TTFT over alone, TPOT and TPOT over alone of one server."""
    t50, t99 = percentile(r["ttft"], 50), percentile(r["ttft"], 99)
    p50, p99 = percentile(r["tpot"], 50), percentile(r["tpot"], 99)
    failed = f" ({r['failed']} failed: {r['failure']})" if r["failed"] else ""
    cells = [f"{r['requests']}{failed}", f"{fmt(t50, 1)} / {fmt(t99, 1)}"]
    if alone:
        cells.append(f"{fmt(t50 / percentile(alone['ttft'], 50), 2, 'x')} / "
                     f"{fmt(t99 / percentile(alone['ttft'], 99), 2, 'x')}")
    else:
        cells.append("—")
    cells.append(f"{fmt(p50, 2)} / {fmt(p99, 2)}")
    if alone:
        cells.append(f"{fmt(p50 / percentile(alone['tpot'], 50), 2, 'x')} / "
                     f"{fmt(p99 / percentile(alone['tpot'], 99), 2, 'x')}")
    else:
        cells.append("—")
    return cells


def row_line(r, alone, filler_alone):
    """One row of a server-and-filler table."""
    if "error" in r:
        return f"| {r['row']} | {r['error']} ||||||||"
    cells = [r["row"]]
    cells += server_cells(r, alone) if "ttft" in r else ["—"] * 5
    if "filler_steps_per_s" in r and filler_alone:
        ratio = r["filler_steps_per_s"] / filler_alone["filler_steps_per_s"]
        tokens = r.get("filler_tokens_per_step")
        rate = (f"{r['filler_steps_per_s'] * tokens:.0f} tokens/s" if tokens
                else f"{r['filler_steps_per_s']:.2f} steps/s")
        cells.append(f"{ratio * 100:.0f}% ({rate})")
    else:
        cells.append("—")
    cells += [fmt(r.get("device_busy") and r["device_busy"] * 100, 1, "%"), fmt(r["host_busy"] * 100, 0, "%")]
    return "| " + " | ".join(cells) + " |"


def table(w, header, title, text, rows, alone, filler_alone):
    """A section of server-and-filler rows under its own title and text."""
    w("")
    w(f"### {title}")
    w("")
    w(text)
    w("")
    w(header)
    w("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        w(row_line(r, alone, filler_alone))


def report(args, results, versions):
    alone = next((r for r in results if r["row"] == "server alone" and "ttft" in r), None)
    filler_alone = next((r for r in results if r["row"] == "filler alone" and "filler_steps_per_s" in r), None)
    out = []
    w = out.append
    w("<!-- Written by scripts/llm-bench.sh (scripts/llm_bench.py); do not edit by hand. -->")
    w("# LLM serving beside fine-tuning and batch inference on one simulated GPU")
    w("")
    w(f"Command: `scripts/bench.sh llm -- --seconds {args.seconds:g} --rate {args.rate:g} --seed {args.seed}`. {versions}")
    w("")
    w(f"**Server**: `vllm serve`, unmodified, eager, on a model of the shape of a 1B-parameter Llama "
      f"(16 layers, width 2048, 32 heads, 8 KV heads, vocab 32000; random weights), `--mem {SERVER_MEM}`, "
      f"`--gpu-memory-utilization 0.6`, max length {MAX_MODEL_LEN}. **Requests**: Poisson arrivals at {args.rate:g}/s for "
      f"{args.seconds:g} s (seed {args.seed}; the same requests in every row), prompts of {PROMPT_TOKENS[0]}-{PROMPT_TOKENS[1]} "
      f"random token ids and {OUTPUT_TOKENS[0]}-{OUTPUT_TOKENS[1]} output tokens (uniform), streamed from the OpenAI "
      f"completions API; TTFT and TPOT measured by the client. **Filler**: fine-tuning of a small causal transformer LM "
      f"(`scripts/frameworks.py finetune`: 4 layers, width 512, batch 4 x 128 tokens, AdamW, bf16 autocast), "
      f"`--mem {FILLER_MEM}`; its throughput is training steps per second.")
    w("")
    w(f"**Device time**: simgpu with `SIMGPU_WAVE_NS={args.wave}` (default 10us) for every process. At the default a "
      f"decode step of this model (about 214 kernels, eager) is 2.3 ms of device time against about 9 ms of host "
      f"time to launch it, so the host, not the device, would bound every row; at 40us a step is about 9 ms of "
      f"device time, as long as the host's part. Device busy: simgpu's busy counter through its NVML, once a second. "
      f"Host busy: all cores, from /proc/stat ({os.cpu_count()} here): where it nears 100%, the host binds, not the "
      f"device.")
    w("")
    w(f"Rows: *{HOST_ONLY}* is a control: the same two programs, sharing only this host's 2 cores; "
      "*time slicing* runs both under `dilu run --sim --mem` with no SM limit (simgpu time-slices between "
      f"processes as the driver does); *static shares* `--sm {STATIC_SERVER_PCT}` and `--sm {100 - STATIC_SERVER_PCT}`; "
      f"*HAMi-core* its libvgpu.so preloaded with `CUDA_DEVICE_SM_LIMIT` {STATIC_SERVER_PCT} and {100 - STATIC_SERVER_PCT} "
      f"(a build named by `DILU_PEER_HAMI`); *dilu defaults* `--colo primary` beside `--colo filler`, no SLO declared "
      f"(the primary kept as if alone); *dilu with an SLO* adds `--slo-ms {args.slo_ms}` to the server. `dilu run` "
      f"lowers a `--colo filler`'s CPU priority to nice 19 by default; the rows *{NICE_0}...* keep it at the server's "
      f"(`--cpu-nice 0`), to show what that does. The other rows' fillers run at the server's priority"
      f"{f' plus `nice -n {args.filler_nice}`' if args.filler_nice else ''}.")
    w("")
    header = ("| row | requests | TTFT p50 / p99 ms | TTFT p50 / p99 vs alone | TPOT p50 / p99 ms "
              "| TPOT p50 / p99 vs alone | filler vs alone | device busy | host busy |")
    w(header)
    w("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        if r["row"] in ROWS:
            w(row_line(r, alone, filler_alone))
    bursty = [r for r in results if r["row"] in BURSTY_ROWS]
    if bursty:
        bursty_alone = next((r for r in bursty if r["row"] == "server alone" + BURSTY and "ttft" in r), None)
        table(w, header, "Bursty arrivals",
              f"The same mean rate, {args.rate:g}/s, all of it in bursts: Poisson arrivals at {2 * args.rate:g}/s "
              f"for {BURST_S:g} s, then none for {BURST_S:g} s (the same seed; the same requests in every row of "
              f"this table). Ratios are over this table's server alone; the filler's over the filler alone above.",
              bursty, bursty_alone, filler_alone)
    offline = [r for r in results if r["row"] in OFFLINE_ROWS]
    if offline:
        offline_alone = next((r for r in offline if r["row"] == "filler alone" + OFFLINE
                              and "filler_steps_per_s" in r), None)
        table(w, header, "Offline vLLM batch generation as the filler",
              f"The filler is offline batch generation with vLLM (`scripts/llm_offline_filler.py`: the server's "
              f"model, `--mem {FILLER_MEM}`, batches of 16 prompts of 256 random token ids, 64 tokens generated for "
              f"each, one batch after another) instead of fine-tuning: batch inference harvesting a serving GPU, as "
              f"Valve and ConServe do. The server and its requests are the first table's; ratios over the server "
              f"alone there; the filler's throughput (generated tokens per second) over its own alone in this table.",
              offline, alone, offline_alone)
    two = [r for r in results if r["row"] in TWO_SERVERS]
    if two:
        w("")
        w("### Two servers on one GPU")
        w("")
        w(f"Two `vllm serve` processes, each `--mem {SERVER_MEM}`, each sent the Poisson requests of the first table at "
          f"the same instants (the worst case: every prefill meets the other server's), or in the rows "
          f"*{INDEPENDENT}...* server A those requests and server B as many drawn from another seed (two "
          f"services' users do not arrive together); ratios over the server alone of the first table; within the SLO: "
          f"TTFT p99 at most {args.slo_ms} ms (the SLO of the first table's SLO row). *{TWO_HOST_ONLY}* is the "
          f"control: the two servers share only this host's {os.cpu_count()} cores (device busy: server A's GPU); "
          f"where it misses the SLO, the host binds, not the GPU. *dilu --sm 50 each*: a hard cap "
          f"of half the device each, no node manager; *dilu node manager*: `dilu nodemgr --sim` at its defaults, each "
          f"server `--class latency --slo-ms {args.slo_ms} --sm-request 50 --sm-limit 100` (half the device "
          f"guaranteed, the rest borrowed while the other idles).")
        w("")
        w("| row | server | requests | TTFT p50 / p99 ms | TTFT p50 / p99 vs alone | TTFT p99 within the SLO "
          "| TPOT p50 / p99 ms | TPOT p50 / p99 vs alone | device busy | host busy |")
        w("|---|---|---|---|---|---|---|---|---|---|")
        for r in two:
            if "error" in r:
                w(f"| {r['row']} | {r['error']} |||||||||")
                continue
            for label, server in zip(("A", "B"), r["servers"]):
                t99 = percentile(server["ttft"], 99)
                cells = server_cells(server, alone)
                within = "—" if t99 is None or math.isnan(t99) else ("yes" if t99 <= float(args.slo_ms) else "no")
                w("| " + " | ".join([r["row"], label, *cells[:3], within, *cells[3:],
                                     fmt(r.get("device_busy") and r["device_busy"] * 100, 1, "%"),
                                     fmt(r["host_busy"] * 100, 0, "%")]) + " |")
    w("")
    w(f"p99 over a row's requests (about {int(args.rate * args.seconds)}) is its second-largest value or so; "
      "a ratio is the row's figure over the server-alone row's, measured in this run.")
    return "\n".join(out) + "\n"


def memory_checks(args, model):
    """vLLM's sleep mode and PyTorch's expandable segments under --mem
    (scripts/llm_memory_check.py), as a section of the results."""
    sections = ["", "## Memory given back under `--mem`", ""]
    for what in ("sleep", "expandable"):
        log(f"memory check: {what}")
        out = subprocess.run([args.python, os.path.join(SCRIPTS, "llm_memory_check.py"), what,
                              "--dilu", args.dilu, "--python", args.python, "--driver-dir", args.driver_dir,
                              "--model", model], capture_output=True, text=True, timeout=1800)
        sections.append(out.stdout.strip() or f"### {what}\n\nno result (exit {out.returncode}): "
                        f"{out.stderr.strip()[-400:]}")
        sections.append("")
    return "\n".join(sections)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dilu", required=True, help="the dilu binary (release build)")
    parser.add_argument("--python", default=sys.executable, help="the Python with vLLM and torch")
    parser.add_argument("--driver-dir", required=True, help="the folder where libcuda.so.1 and libnvidia-ml.so.1 are simgpu's")
    parser.add_argument("--out", required=True)
    parser.add_argument("--seconds", type=float, default=90)
    parser.add_argument("--rate", type=float, default=1.0, help="requests per second (Poisson)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--slo-ms", default="100", help="the SLO of the 'with an SLO' row (default 100)")
    parser.add_argument("--wave", default="40us", help="SIMGPU_WAVE_NS for every process (default 40us)")
    parser.add_argument("--rows", default=",".join(ALL_ROWS), help="rows to run, by name, comma-separated")
    parser.add_argument("--filler-nice", type=int, default=0,
                        help="run the filler at this nice value (default 0: as the server)")
    parser.add_argument("--no-memory-checks", action="store_true",
                        help="leave out the sleep-mode and expandable-segments checks")
    args = parser.parse_args()
    args.hami = os.environ.get("DILU_PEER_HAMI")
    names = [n.strip() for n in args.rows.split(",") if n.strip()]
    unknown = [n for n in names if n not in ALL_ROWS]
    if unknown:
        sys.exit(f"llm-bench: unknown rows {unknown}; rows: {ALL_ROWS}")
    import torch
    import vllm

    versions = f"Versions: vllm {vllm.__version__}, torch {torch.__version__}; simgpu's simulated H100."
    scratch = tempfile.mkdtemp(prefix="dilu-llm-bench-")
    log(f"processes' output and the rows so far in {scratch} (removed at the end)")
    model = os.path.join(scratch, "model")
    os.makedirs(model)
    with open(os.path.join(model, "config.json"), "w") as f:
        json.dump(MODEL, f)
    results = []
    for name in names:
        started = time.monotonic()
        results.append(run_row(args, name, scratch, model))
        log(f"{name}: done in {time.monotonic() - started:.0f} s")
        # What the rows measured so far, should a later row hang.
        with open(os.path.join(scratch, "rows-so-far.json"), "w") as f:
            json.dump(results, f)
    text = report(args, results, versions)
    if not args.no_memory_checks:
        text += memory_checks(args, model)
    with open(args.out, "w") as f:
        f.write(text)
    print(text)
    subprocess.run(["rm", "-rf", scratch], check=False)


if __name__ == "__main__":
    main()
