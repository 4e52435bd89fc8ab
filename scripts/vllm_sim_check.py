"""vLLM offline generation on simgpu (run by scripts/vllm-sim-check.sh under
`dilu run --sim --mem ...`). Prints one JSON line per step
{"step", "ok", "detail", ...}; every step is tried even when an earlier one
failed.

    python vllm_sim_check.py eager|graphs UTILISATION MAX_TOKENS [BARRIER_DIR N]

With BARRIER_DIR and N, generation starts only once N processes have
reached it (each leaves a file there), so that engines which took different
times to start generate at the same time.

The model is made on the spot: a config for a 2-layer Llama-style model in a
temporary directory, weights from `load_format="dummy"`, no tokenizer
(prompts are token ids). simgpu computes no kernel results, so the tokens
generated are not meaningful: what is checked is that vLLM starts, sizes its
KV cache, captures and replays graphs, and finishes.
"""

import json
import os
import sys
import tempfile
import time
import traceback

# 2 layers, 4 KV heads of 64, bf16: bytes of K and V per token.
LAYERS, KV_HEADS, HEAD_DIM, DTYPE_BYTES = 2, 4, 64, 2
KV_BYTES_PER_TOKEN = 2 * LAYERS * KV_HEADS * HEAD_DIM * DTYPE_BYTES


def report(step, ok, detail="", **extra):
    print(json.dumps({"step": step, "ok": bool(ok), "detail": str(detail), **extra}), flush=True)


def failure(e):
    tb = traceback.format_exc().strip().splitlines()
    where = tb[-3].strip() if len(tb) > 2 else ""
    return f"{type(e).__name__}: {e}".strip()[:600] + (f" (at {where})" if where else "")


def tiny_model():
    path = tempfile.mkdtemp(prefix="dilu-vllm-model-")
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": KV_HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "vocab_size": 1024,
        "max_position_embeddings": 256,
        "rms_norm_eps": 1e-5,
        "torch_dtype": "bfloat16",
        "bos_token_id": 1,
        "eos_token_id": 2,
        "tie_word_embeddings": False,
    }
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f)
    return path


def nvml_total():
    """GPU 0's memory as NVML reports it in this (parent) process, before
    vLLM starts its engine, as vLLM itself asks."""
    import pynvml

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    return pynvml.nvmlDeviceGetMemoryInfo(handle).total


def barrier(directory, n, limit_s=900):
    """Leaves this process's mark in `directory`, then waits for `n` marks."""
    open(os.path.join(directory, f"ready-{os.getpid()}"), "w").close()
    deadline = time.monotonic() + limit_s
    while len(os.listdir(directory)) < n:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(os.listdir(directory))} of {n} processes reached the barrier")
        time.sleep(0.05)


def main():
    mode, utilisation, max_tokens = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
    import torch
    import vllm

    report("versions", True, f"vllm {vllm.__version__}, torch {torch.__version__} (CUDA {torch.version.cuda})")
    try:
        total = nvml_total()
        report("NVML in the parent", True, f"GPU 0 total {total} B", nvml_total=total)
    except BaseException as e:  # noqa: BLE001 - every failure is reported
        report("NVML in the parent", False, failure(e))

    from vllm import LLM, SamplingParams

    started = time.monotonic()
    try:
        llm = LLM(
            model=tiny_model(),
            load_format="dummy",
            skip_tokenizer_init=True,
            enforce_eager=(mode == "eager"),
            gpu_memory_utilization=utilisation,
            max_model_len=128,
            max_num_seqs=4,
            dtype="bfloat16",
            seed=0,
        )
    except BaseException as e:  # noqa: BLE001
        report("engine start", False, failure(e), seconds=round(time.monotonic() - started, 1))
        return
    report("engine start", True, f"{mode}, gpu_memory_utilization {utilisation}",
           seconds=round(time.monotonic() - started, 1))
    try:
        cache = llm.llm_engine.vllm_config.cache_config
        blocks, block_size = cache.num_gpu_blocks, cache.block_size
        kv_bytes = blocks * block_size * KV_BYTES_PER_TOKEN
        report("KV cache", True, f"{blocks} blocks of {block_size} tokens", kv_bytes=kv_bytes)
    except BaseException as e:  # noqa: BLE001
        report("KV cache", False, failure(e))

    prompts = [{"prompt_token_ids": [1, 5 + i, 9, 13 + i]} for i in range(4)]
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, detokenize=False)
    try:
        if len(sys.argv) > 5:
            barrier(sys.argv[4], int(sys.argv[5]))
        # CLOCK_MONOTONIC, the clock of simgpu's trace.
        started = time.monotonic_ns()
        outputs = llm.generate(prompts, params, use_tqdm=False)
        ended = time.monotonic_ns()
        counts = [len(o.outputs[0].token_ids) for o in outputs]
        ok = counts == [max_tokens] * len(prompts)
        report("generate", ok, f"{len(prompts)} prompts x {max_tokens} tokens: {counts}",
               seconds=round((ended - started) / 1e9, 1), start_ns=started, end_ns=ended)
    except BaseException as e:  # noqa: BLE001
        report("generate", False, failure(e))


if __name__ == "__main__":
    main()
