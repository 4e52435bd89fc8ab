"""Offline vLLM batch generation as a co-location filler (run by
scripts/llm_bench.py under `dilu run`): the same model as the server, a
batch of prompts generated again and again until told to stop.

    python llm_offline_filler.py --model DIR --ready-file F --stop-file F
                                 [--batch N] [--prompt-tokens N] [--output-tokens N]
                                 [--memory-utilization X]

It writes the ready file once its engine is up and one batch has run
(warm), then generates until the stop file exists, and prints one JSON
line: when each batch ended (`step_end_ns`, monotonic ns) and the tokens a
batch generates (`tokens_per_step`).
"""

import argparse
import json
import os
import random
import time


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="a folder with the model's config.json (random weights)")
    parser.add_argument("--ready-file", required=True)
    parser.add_argument("--stop-file", required=True)
    parser.add_argument("--batch", type=int, default=16, help="prompts per batch (default 16)")
    parser.add_argument("--prompt-tokens", type=int, default=256, help="tokens per prompt (default 256)")
    parser.add_argument("--output-tokens", type=int, default=64, help="tokens generated per prompt (default 64)")
    parser.add_argument("--memory-utilization", type=float, default=0.8,
                        help="vLLM's --gpu-memory-utilization, of the memory dilu shows (default 0.8)")
    parser.add_argument("--max-model-len", type=int, default=1024)
    args = parser.parse_args()
    if args.batch < 1 or args.prompt_tokens < 1 or args.output_tokens < 1:
        parser.error("--batch, --prompt-tokens and --output-tokens must be at least 1")

    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(model=args.model, load_format="dummy", skip_tokenizer_init=True, enforce_eager=True,
              gpu_memory_utilization=args.memory_utilization, max_model_len=args.max_model_len)
    draw = random.Random(7)
    prompts = [TokensPrompt(prompt_token_ids=[draw.randrange(3, 32000) for _ in range(args.prompt_tokens)])
               for _ in range(args.batch)]
    params = SamplingParams(max_tokens=args.output_tokens, min_tokens=args.output_tokens, ignore_eos=True,
                            temperature=0, detokenize=False)
    llm.generate(prompts, params, use_tqdm=False)  # warm: not counted
    open(args.ready_file, "w").close()
    ends = []
    while not os.path.exists(args.stop_file):
        outputs = llm.generate(prompts, params, use_tqdm=False)
        generated = sum(len(o.outputs[0].token_ids) for o in outputs)
        if generated != args.batch * args.output_tokens:
            raise SystemExit(f"a batch generated {generated} tokens, not {args.batch * args.output_tokens}")
        ends.append(time.monotonic_ns())
    print(json.dumps({"step_end_ns": ends, "tokens_per_step": args.batch * args.output_tokens}), flush=True)


if __name__ == "__main__":
    main()
