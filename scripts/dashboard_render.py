"""Renders deploy/grafana/dilu.json without Grafana or Prometheus: runs a
node manager with tenants on simgpu, scrapes its /metrics every second,
evaluates every panel's query over those scrapes and draws the panels.

The queries are evaluated by a small evaluator of the PromQL the dashboard
uses (selectors with = and =~ matchers, rate(x[w]), sum by (...) (...),
a / b over series with the same labels, a and on (...) b); anything else stops it with the
query named. rate() is the increase over the window's first and last
samples divided by their distance (Prometheus also extrapolates to the
window's edges). Grafana's variables: $instance and $tenant select all,
$__rate_interval is four scrape intervals (Grafana's rule).

usage: python3 scripts/dashboard_render.py BIN_DIR SECONDS OUT.svg OUT.md COMMAND
(scripts/dashboard-render.sh runs it.)
"""

import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request

import matplotlib

matplotlib.use("svg")
matplotlib.rcParams["svg.hashsalt"] = "dilu"
import matplotlib.pyplot as plt  # noqa: E402

SCRAPE_INTERVAL = 1.0
RATE_INTERVAL = 4 * SCRAPE_INTERVAL


# ---- the scenario -----------------------------------------------------------

def start(bin_dir, seconds, scratch):
    """The node manager and its tenants; returns (daemon, tenants, address)."""
    config = os.path.join(scratch, "nodemgr.toml")
    with open(config, "w") as f:
        # Short scale windows so advice shows within the run (defaults 10 s, 300 s).
        f.write('controller = "dilu-colo"\nscale_out_after_s = 5\nscale_in_after_s = 10\n')
    socket = os.path.join(scratch, "nodemgr.sock")
    instance = f"dashboard-{os.getpid()}"
    env = dict(os.environ, DILU_LOG="info", SIMGPU_INSTANCE=instance)
    env.pop("DILU_SM_LIMIT", None)
    # --sim: the daemon reads the simulated GPU through simgpu's NVML, as it
    # reads a real one through NVIDIA's (utilisation, the memory audit).
    daemon = subprocess.Popen(
        [f"{bin_dir}/dilu", "nodemgr", "--sim", "--foreground", "--config", config, "--socket", socket,
         "--run-dir", os.path.join(scratch, "run"), "--metrics", "127.0.0.1:0"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, text=True)
    address = None
    for line in daemon.stderr:
        match = re.search(r'node manager ready.*metrics="([^"]+)"', line)
        if match:
            address = match.group(1)
            break
    if address is None:
        sys.exit("dashboard: the node manager exited before it was ready")
    # Keep draining its log so it never blocks on a full pipe.
    subprocess.Popen(["cat"], stdin=daemon.stderr, stdout=subprocess.DEVNULL)

    tenant_env = dict(env, DILU_NODEMGR_SOCKET=socket,
                      DILU_COLO_GROUP=instance, DILU_COLO_TOLERANCE="2ms")
    run = [f"{bin_dir}/dilu", "run", "--sim"]
    s = str(seconds)
    tenants = [
        # An inference server with a 10 ms SLO, co-location primary.
        subprocess.Popen(
            run + ["--tenant", "infer", "--colo", "primary", "--class", "latency", "--slo-ms", "10",
                   "--sm-request", "40", "--sm-limit", "100", "--mem", "2GiB", "--",
                   f"{bin_dir}/demo-tenant", "serve", "--seconds", s, "--rate", "120",
                   "--kernels", "4", "--blocks", "2640", "--on-ms", "1000", "--off-ms", "0",
                   "--slo-ms", "10"],
            env=tenant_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL),
        # A deep-queue batch job filling the server's gaps.
        subprocess.Popen(
            run + ["--tenant", "train", "--colo", "filler", "--class", "batch",
                   "--sm-request", "20", "--sm-limit", "100", "--mem", "4GiB", "--",
                   f"{bin_dir}/cudarc-loop", "--seconds", s, "--blocks", "13200", "--depth", "32"],
            env=tenant_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL),
    ]
    # A tenant that allocates and then never launches: scale-in advice.
    idle = subprocess.Popen(
        run + ["--tenant", "idle", "--mem", "1GiB", "--", f"{bin_dir}/mem-probe"],
        env=dict(tenant_env, DILU_CONTEXT_MEMORY="0"), stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    idle.stdin.write(f"alloc {512 << 20}\n")
    idle.stdin.flush()
    idle.stdout.readline()
    tenants.append(idle)
    return daemon, tenants, address


def scrape_for(address, seconds):
    """[(seconds since start, /metrics text)], one per scrape interval."""
    scrapes = []
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        at = time.monotonic()
        with urllib.request.urlopen(f"http://{address}/metrics", timeout=30) as response:
            scrapes.append((at - start, response.read().decode()))
        time.sleep(max(0.0, SCRAPE_INTERVAL - (time.monotonic() - at)))
    return scrapes


def parse_metrics(text, address):
    """{(name, frozenset(labels))): value}, with Prometheus' instance label."""
    samples = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = re.match(r'([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)', line)
        if not match:
            continue
        labels = dict(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"', match.group(3) or ""))
        labels["instance"] = address
        samples[(match.group(1), frozenset(labels.items()))] = float(match.group(4))
    return samples


# ---- the PromQL the dashboard uses --------------------------------------------

TOKEN = re.compile(r'\s*((?:sum|by|rate|and|on)\b|[0-9]+(?:\.[0-9]+)?s|[a-zA-Z_:][a-zA-Z0-9_:]*|"(?:[^"\\]|\\.)*"|=~|!=|!~|[(){}\[\],=/])')


def tokens(expr):
    position, out = 0, []
    while position < len(expr):
        if expr[position:].strip() == "":
            break
        match = TOKEN.match(expr, position)
        if not match:
            raise ValueError(f"cannot read {expr[position:]!r} in `{expr}`")
        out.append(match.group(1))
        position = match.end()
    return out


class Parser:
    def __init__(self, expr):
        self.expr, self.tokens, self.at = expr, tokens(expr), 0

    def take(self, expected=None):
        token = self.tokens[self.at] if self.at < len(self.tokens) else None
        if token is None or (expected is not None and token != expected):
            raise ValueError(f"expected {expected or 'more'} at {token!r} in `{self.expr}`")
        self.at += 1
        return token

    def peek(self):
        return self.tokens[self.at] if self.at < len(self.tokens) else None

    def parse(self):
        node = self.division()
        if self.peek() is not None:
            raise ValueError(f"unexpected {self.peek()!r} in `{self.expr}`")
        return node

    def division(self):
        node = self.term()
        while self.peek() in ("/", "and"):
            if self.take() == "/":
                node = ("div", node, self.term())
                continue
            self.take("on")
            node = ("and", self.labels(), node, self.term())
        return node

    def labels(self):
        self.take("(")
        labels = []
        while self.peek() != ")":
            labels.append(self.take())
            if self.peek() == ",":
                self.take()
        self.take(")")
        return tuple(labels)

    def term(self):
        token = self.peek()
        if token == "sum":
            self.take()
            self.take("by")
            labels = self.labels()
            self.take("(")
            inner = self.division()
            self.take(")")
            return ("sum", tuple(labels), inner)
        if token == "rate":
            self.take()
            self.take("(")
            selector = self.selector()
            self.take("[")
            window = self.take()
            self.take("]")
            self.take(")")
            return ("rate", selector, window)
        return self.selector()

    def selector(self):
        name = self.take()
        matchers = []
        if self.peek() == "{":
            self.take("{")
            while self.peek() != "}":
                label, op, value = self.take(), self.take(), self.take()
                matchers.append((label, op, json.loads(value)))
                if self.peek() == ",":
                    self.take()
            self.take("}")
        return ("select", name, tuple(matchers))


def matches(labels, matchers):
    for label, op, value in matchers:
        actual = labels.get(label, "")
        if op == "=" and actual != value:
            return False
        if op == "=~" and not re.fullmatch(value, actual):
            return False
        if op in ("!=", "!~"):
            raise ValueError(f"{op} is not evaluated here")
    return True


def evaluate(node, scrapes, index):
    """The instant vector {frozenset(labels): value} at scrape `index`."""
    kind = node[0]
    if kind == "select":
        _, name, matchers = node
        _, samples = scrapes[index]
        return {labels: v for (n, labels), v in samples.items()
                if n == name and matches(dict(labels), matchers)}
    if kind == "rate":
        _, selector, window = node
        seconds = float(window.rstrip("s"))
        now = scrapes[index][0]
        inside = [i for i in range(index + 1) if now - scrapes[i][0] <= seconds]
        first, last = inside[0], inside[-1]
        if first == last:
            return {}
        older, newer = evaluate(selector, scrapes, first), evaluate(selector, scrapes, last)
        span = scrapes[last][0] - scrapes[first][0]
        return {labels: max(0.0, newer[labels] - older[labels]) / span
                for labels in newer if labels in older}
    if kind == "sum":
        _, by, inner = node
        out = {}
        for labels, value in evaluate(inner, scrapes, index).items():
            key = frozenset((k, v) for k, v in labels if k in by)
            out[key] = out.get(key, 0.0) + value
        return out
    if kind == "and":
        _, on, left, right = node
        keep = {frozenset((k, v) for k, v in labels if k in on) for labels in evaluate(right, scrapes, index)}
        return {labels: value for labels, value in evaluate(left, scrapes, index).items()
                if frozenset((k, v) for k, v in labels if k in on) in keep}
    if kind == "div":
        left, right = evaluate(node[1], scrapes, index), evaluate(node[2], scrapes, index)
        return {labels: value / right[labels] for labels, value in left.items()
                if right.get(labels)}
    raise ValueError(kind)


def query_series(expr, scrapes):
    """{labels: ([t], [v])} of one query over every scrape."""
    expr = (expr.replace('"$instance"', '".*"').replace('"$tenant"', '".*"')
            .replace("$__rate_interval", f"{RATE_INTERVAL:g}s"))
    tree = Parser(expr).parse()
    series = {}
    for index in range(len(scrapes)):
        for labels, value in evaluate(tree, scrapes, index).items():
            times, values = series.setdefault(labels, ([], []))
            times.append(scrapes[index][0])
            values.append(value)
    return series


def legend(format_, labels):
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), format_)


# ---- drawing ------------------------------------------------------------------

UNIT_SCALE = {"bytes": (2 ** 20, "MiB"), "s": (1e-3, "ms"), "percentunit": (0.01, "%"), "none": (1, "")}


def main(bin_dir, seconds, svg_path, md_path, command):
    dashboard = json.load(open("deploy/grafana/dilu.json"))
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="dilu-dashboard-") as scratch:
        daemon, tenants, address = start(bin_dir, seconds, scratch)
        try:
            raw = scrape_for(address, seconds)
        finally:
            for process in tenants + [daemon]:
                process.kill()
                process.wait()
    scrapes = [(t, parse_metrics(text, "nodemgr")) for t, text in raw]

    panels = sorted(dashboard["panels"], key=lambda p: (p["gridPos"]["y"], p["gridPos"]["x"]))
    rows = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in panels) // 8
    figure = plt.figure(figsize=(18, 4.6 * rows), layout="constrained")
    # Grafana's 24 columns, in its half-width steps.
    grid = figure.add_gridspec(rows, 2)
    table = []
    for panel in panels:
        g = panel["gridPos"]
        axes = figure.add_subplot(grid[g["y"] // 8, g["x"] // 12:(g["x"] + g["w"]) // 12])
        unit = panel["fieldConfig"]["defaults"].get("unit", "none")
        scale, suffix = UNIT_SCALE.get(unit, (1, unit))
        drawn = 0
        for target in panel["targets"]:
            series = query_series(target["expr"], scrapes)
            if not series:
                table.append((panel["title"], f"`{target['expr']}`", None, ""))
            for labels, (times, values) in sorted(series.items(), key=lambda kv: sorted(kv[0])):
                name = legend(target.get("legendFormat", ""), dict(labels))
                axes.plot(times, [v / scale for v in values], label=name, linewidth=1.4)
                drawn += 1
                table.append((panel["title"], name, values[-1] / scale, suffix))
        axes.set_title(panel["title"], fontsize=11, loc="left")
        axes.set_xlabel("seconds since the first scrape", fontsize=8)
        if suffix:
            axes.set_ylabel(suffix, fontsize=8)
        # The panel's own axis range, as Grafana draws it.
        defaults = panel["fieldConfig"]["defaults"]
        if "min" in defaults:
            axes.set_ylim(bottom=defaults["min"] / scale)
        if "max" in defaults:
            axes.set_ylim(top=defaults["max"] / scale * 1.05)
        axes.set_xlim(0, scrapes[-1][0])
        axes.grid(alpha=0.3)
        if drawn:
            axes.legend(fontsize=7, loc="upper right", framealpha=0.8)
        else:
            axes.text(0.5, 0.5, "no data", ha="center", va="center", transform=axes.transAxes)
    figure.suptitle(f"{dashboard['title']}: deploy/grafana/dilu.json over {len(scrapes)} scrapes of a live node manager",
                    fontsize=13)
    figure.savefig(svg_path, metadata={"Date": None})
    text = open(svg_path).read()
    header = f"<!-- written by {command}: deploy/grafana/dilu.json's queries over /metrics of a live node manager -->\n"
    open(svg_path, "w").write(text.replace("\n", "\n" + header, 1))

    with open(md_path, "w") as out:
        out.write(f"<!-- written by {command} -->\n# The Grafana dashboard over a live node manager\n\n")
        out.write(
            "`deploy/grafana/dilu.json`'s queries, evaluated over "
            f"{len(scrapes)} scrapes ({SCRAPE_INTERVAL:g} s apart) of `/metrics` from a `dilu nodemgr` "
            "(controller `dilu-colo`) on simgpu with three tenants: `infer` (inference server, "
            "120 req/s, SLO 10 ms, co-location primary, request 40%), `train` (deep-queue batch "
            "filler, request 20%) and `idle` (512 MiB allocated, never launches; "
            "`scale_in_after_s = 10`). Evaluated by `scripts/dashboard_render.py`'s own reading "
            "of the queries, not by Prometheus; rate windows are "
            f"{RATE_INTERVAL:g} s. Binaries: `{bin_dir}`; the machine's 1-minute load average "
            f"at the start was {load:.1f} on {os.cpu_count()} CPUs (latencies on simgpu stretch "
            "with the host's load).\n\n![dashboard](dashboard.svg)\n\n"
            "Last value of every series (a query with no series here is one whose metric the "
            "node manager had no sample of in this run):\n\n| panel | series | last value |\n|---|---|---|\n")
        for title, name, value, suffix in table:
            shown = "no series" if value is None else f"{value:.3g} {suffix}".strip()
            out.write(f"| {title} | {name} | {shown} |\n")


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5])
