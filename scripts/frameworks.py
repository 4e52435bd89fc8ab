"""Two ordinary PyTorch programs for the real-model co-location benchmark
(scripts/frameworks.sh). Neither knows about dilu: each uses the GPU as any
PyTorch program does and prints one JSON line when it ends.

    python frameworks.py serve --seconds S --rate R --slo-ms MS [--seq N] [--batch B]
        An inference server of BERT-base (random weights from its config, no
        download): requests arrive as a Poisson process at R per second and
        are answered in arrival order, up to B waiting requests in one batch
        (default: DILU_BATCH, which `dilu run --profile` sets, else 1), N
        tokens each; each one's latency runs from its arrival to its result
        on the host.

    python frameworks.py measure [--seconds S] [--seq N]
        The same server's request path in a closed loop, for `dilu profile`:
        batches of DILU_BATCH requests back to back, each batch's latency
        reported to dilu (interposer/python/dilu_latency.py), until stopped.

    python frameworks.py train --seconds S [--batch B] [--image P] [--model M]
                               [--ready-file F] [--stop-file G]
        A training loop of a torchvision network (ResNet-50 by default,
        random weights and random data): forward, loss, backward, SGD step;
        the loss is read back every step, as a training loop that logs it
        does. Its timed steps start after the warm-up steps (it then creates
        F, if given) and end after S seconds or, with G, once G exists
        (checked after every step), whichever comes first.

    python frameworks.py finetune --seconds S [--batch B] [--seq N] [--layers L]
                                  [--width W] [--ready-file F] [--stop-file G]
        Fine-tuning of a small causal transformer language model (random
        weights, random tokens; AdamW, bf16 autocast), timed as train.

    python frameworks.py device-check
        Whether CUDA is usable here (exit 0) or not (exit 1, reason on stderr).
"""

import argparse
import json
import os
import random
import sys
import time

# dilu's helper for reporting request latencies (a no-op without dilu).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "interposer", "python"))


def bert_base(device):
    """BERT-base: transformers' BertModel from its default config (the
    BERT-base shape), or, without transformers, the same shape in plain
    torch.nn (12 encoder layers, 768 wide, 12 heads, 3072 inner)."""
    import torch

    try:
        from transformers import BertConfig, BertModel

        model = BertModel(BertConfig())
        name = "transformers BertModel (BERT-base config, random weights)"

        def forward(tokens):
            return model(input_ids=tokens).last_hidden_state

    except ImportError:
        layer = torch.nn.TransformerEncoderLayer(768, 12, 3072, batch_first=True, activation="gelu")
        encoder = torch.nn.TransformerEncoder(layer, 12, enable_nested_tensor=False)
        embedding = torch.nn.Embedding(30522, 768)
        model = torch.nn.Sequential(embedding, encoder)
        name = "torch.nn TransformerEncoder (BERT-base shape, random weights)"

        def forward(tokens):
            return model(tokens)

    model.to(device).eval()
    return forward, name


def serve(args):
    import torch

    batch = args.batch
    if batch < 1:
        sys.exit(f"serve: --batch {batch} must be at least 1")
    device = torch.device("cuda")
    forward, name = bert_base(device)
    # One tensor per batch size: a batch of k waiting requests is k rows.
    tokens = [torch.randint(0, 30000, (k, args.seq), device=device) for k in range(1, batch + 1)]
    with torch.inference_mode():
        for _ in range(args.warmup):
            for rows in tokens:
                forward(rows)
        torch.cuda.synchronize()
        # One warm request timed alone: the service time the SLO is set against.
        t = time.perf_counter()
        forward(tokens[0]).sum().item()
        service_ms = (time.perf_counter() - t) * 1000
        rng = random.Random(args.seed)
        window_start_ns = time.monotonic_ns()
        start = time.perf_counter()
        arrivals, at = [], 0.0
        while at < args.seconds:
            at += rng.expovariate(args.rate)
            arrivals.append(at)
        arrivals.pop()
        latencies, served, serving, batches, next_request = [], [], 0.0, 0, 0
        while next_request < len(arrivals):
            now = time.perf_counter() - start
            if now < arrivals[next_request]:
                time.sleep(arrivals[next_request] - now)
                now = time.perf_counter() - start
            # Every request waiting now, up to the batch size, in one batch.
            taken = next_request + 1
            while taken < len(arrivals) and taken - next_request < batch and arrivals[taken] <= now:
                taken += 1
            begun = time.perf_counter()
            forward(tokens[taken - next_request - 1]).sum().item()  # the answers, on the host
            done = time.perf_counter()
            serving += done - begun
            batches += 1
            latencies.extend((done - start - a) * 1000 for a in arrivals[next_request:taken])
            served.extend((round(a * 1e9), round((done - start - a) * 1e9)) for a in arrivals[next_request:taken])
            next_request = taken
        window_end_ns = time.monotonic_ns()
    latencies.sort()
    n = len(latencies)

    def pct(p):
        return latencies[min(n - 1, int(p * n))] if n else 0.0

    print(json.dumps({
        "program": "serve",
        "pid": os.getpid(),
        "model": name,
        "seq": args.seq,
        "batch": batch,
        "batches": batches,
        "rate": args.rate,
        "seconds": args.seconds,
        "slo_ms": args.slo_ms,
        "service_ms_alone_warm": round(service_ms, 3),
        "requests": n,
        "service_ms_mean": round(serving * 1000 / max(batches, 1), 3),
        "p50_ms": round(pct(0.50), 3),
        "p99_ms": round(pct(0.99), 3),
        "slo_violation_rate": round(sum(l > args.slo_ms for l in latencies) / max(n, 1), 5),
        # CLOCK_MONOTONIC, as simgpu's trace: the requests' window.
        "window_ns": [window_start_ns, window_end_ns],
        # Each request's arrival (from the window's start) and latency: the
        # report's as-if-alone bound replays them.
        "requests_ns": served,
    }), flush=True)


def measure(args):
    import dilu_latency
    import torch

    batch = int(os.environ.get("DILU_BATCH", "1"))
    if batch < 1:
        sys.exit(f"measure: DILU_BATCH={batch} must be at least 1")
    device = torch.device("cuda")
    forward, _name = bert_base(device)
    tokens = torch.randint(0, 30000, (batch, args.seq), device=device)
    if not dilu_latency.available():
        print("measure: not under dilu's interposer: latencies go nowhere", file=sys.stderr)
    with torch.inference_mode():
        forward(tokens).sum().item()
        start = time.perf_counter()
        while args.seconds is None or time.perf_counter() - start < args.seconds:
            begun = time.perf_counter()
            forward(tokens).sum().item()
            dilu_latency.report(time.perf_counter() - begun)


def timed_steps(args, step):
    """Runs `step` args.warmup times, then for args.seconds (or until
    args.stop_file appears); returns (start_ns, seconds, step_end_ns)."""
    import torch

    for _ in range(args.warmup):
        step()
    torch.cuda.synchronize()
    start_ns = time.monotonic_ns()
    start = time.perf_counter()
    if args.ready_file:
        open(args.ready_file, "w").close()
    step_end_ns = []
    while time.perf_counter() - start < args.seconds:
        step()
        step_end_ns.append(time.monotonic_ns())
        if args.stop_file and os.path.exists(args.stop_file):
            break
    return start_ns, time.perf_counter() - start, step_end_ns


def report_steps(fields, per_step, start_ns, elapsed, step_end_ns):
    steps = len(step_end_ns)
    print(json.dumps({
        **fields,
        "pid": os.getpid(),
        "steps": steps,
        "seconds": round(elapsed, 3),
        "steps_per_second": round(steps / elapsed, 3),
        **{f"{name}_per_second": round(steps * n / elapsed, 2) for name, n in per_step.items()},
        # CLOCK_MONOTONIC, as simgpu's trace: when the timed steps began and
        # when each one ended.
        "start_ns": start_ns,
        "step_end_ns": step_end_ns,
    }), flush=True)


def train(args):
    import torch
    import torchvision

    device = torch.device("cuda")
    model = getattr(torchvision.models, args.model)(weights=None).to(device).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    images = torch.randn(args.batch, 3, args.image, args.image, device=device)
    labels = torch.randint(0, 1000, (args.batch,), device=device)

    def step():
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(images), labels)
        loss.backward()
        optimizer.step()
        return loss.item()

    report_steps(
        {"program": "train", "model": f"torchvision {args.model} (random weights, random data)",
         "batch": args.batch, "image": args.image},
        {"images": args.batch}, *timed_steps(args, step))


def finetune(args):
    """Fine-tuning of a small causal transformer language model: token
    embedding, pre-norm decoder layers with a causal mask, a head over the
    vocabulary; AdamW, mixed precision (bf16 autocast); random token data."""
    import torch

    device = torch.device("cuda")
    layer = torch.nn.TransformerEncoderLayer(args.width, args.width // 64, 4 * args.width,
                                             batch_first=True, norm_first=True, activation="gelu")
    model = torch.nn.ModuleDict({
        "embed": torch.nn.Embedding(args.vocab, args.width),
        "layers": torch.nn.TransformerEncoder(layer, args.layers, enable_nested_tensor=False),
        "head": torch.nn.Linear(args.width, args.vocab),
    }).to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tokens = torch.randint(0, args.vocab, (args.batch, args.seq + 1), device=device)
    mask = torch.nn.Transformer.generate_square_subsequent_mask(args.seq, device=device)

    def step():
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            hidden = model["layers"](model["embed"](tokens[:, :-1]), mask=mask, is_causal=True)
            logits = model["head"](hidden)
        loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten())
        loss.backward()
        optimizer.step()
        return loss.item()

    report_steps(
        {"program": "finetune",
         "model": f"causal transformer LM ({args.layers} layers, width {args.width}, vocab {args.vocab}; random weights and tokens)",
         "batch": args.batch, "seq": args.seq},
        {"tokens": args.batch * args.seq}, *timed_steps(args, step))


def device_check(_args):
    try:
        import torch

        if not torch.cuda.is_available():
            print("torch.cuda.is_available() is False", file=sys.stderr)
            sys.exit(1)
        torch.zeros(1, device="cuda").sum().item()
    except Exception as e:  # noqa: BLE001 - the reason is the output
        print(f"{type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(1)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="BERT-base inference server, Poisson requests")
    s.add_argument("--seconds", type=float, required=True)
    s.add_argument("--rate", type=float, required=True, help="requests per second (Poisson)")
    s.add_argument("--slo-ms", type=float, required=True)
    s.add_argument("--seq", type=int, default=128, help="tokens per request (default 128)")
    s.add_argument("--warmup", type=int, default=3)
    s.add_argument("--seed", type=int, default=1)
    s.add_argument("--batch", type=int, default=int(os.environ.get("DILU_BATCH", "1")),
                   help="most waiting requests answered in one batch (default: DILU_BATCH, else 1)")
    s.set_defaults(run=serve)
    m = sub.add_parser("measure", help="the server's request path in a closed loop at DILU_BATCH, for dilu profile")
    m.add_argument("--seconds", type=float, default=None, help="stop after S seconds (default: run until stopped)")
    m.add_argument("--seq", type=int, default=128, help="tokens per request (default 128)")
    m.set_defaults(run=measure)
    t = sub.add_parser("train", help="torchvision training loop, random data")
    t.add_argument("--seconds", type=float, required=True)
    t.add_argument("--batch", type=int, default=8)
    t.add_argument("--image", type=int, default=224, help="image side in pixels (default 224)")
    t.add_argument("--model", default="resnet50", help="a torchvision.models constructor (default resnet50)")
    t.add_argument("--warmup", type=int, default=2)
    t.add_argument("--ready-file", help="created once the warm-up steps are done and the timed steps begin")
    t.add_argument("--stop-file", help="stop after the step during which this file appeared")
    t.set_defaults(run=train)
    f = sub.add_parser("finetune", help="fine-tuning of a small causal transformer LM, random tokens")
    f.add_argument("--seconds", type=float, required=True)
    f.add_argument("--batch", type=int, default=4)
    f.add_argument("--seq", type=int, default=128, help="tokens per sequence (default 128)")
    f.add_argument("--layers", type=int, default=4)
    f.add_argument("--width", type=int, default=512, help="model width, a multiple of 64 (default 512)")
    f.add_argument("--vocab", type=int, default=4096)
    f.add_argument("--warmup", type=int, default=2)
    f.add_argument("--ready-file", help="created once the warm-up steps are done and the timed steps begin")
    f.add_argument("--stop-file", help="stop after the step during which this file appeared")
    f.set_defaults(run=finetune)
    c = sub.add_parser("device-check", help="exit 0 when CUDA works here")
    c.set_defaults(run=device_check)
    args = parser.parse_args()
    args.run(args)


if __name__ == "__main__":
    main()
