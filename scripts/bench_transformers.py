"""PyTorch with Hugging Face `transformers` on the same GGUF file and the same work as `flint bench`:
the model is loaded from the GGUF (transformers dequantizes it), the prompt is the text `flint bench`
uses (Debian's copy of the Apache License 2.0) tokenized without special tokens and repeated to
--prompt-tokens, then greedy decoding of --gen-tokens tokens, the first of them from the prefill.
Decode tokens/s counts the other gen_tokens - 1 steps, as `flint bench` does; figures are medians
over --repeats runs after a warm-up.

The roofline is flint's: the bytes of weights one decode step reads (every parameter once, at the
dtype it runs in) times steps/s, over the faster of a device-to-device copy and a read-only sum
measured on the same GPU. Greedy tokens for a reference prompt are printed beside llama.cpp's
(--reference, a greedy.json from tests/reference) so the speed is known to be of a correct model.

    python3 scripts/bench_transformers.py --model SmolLM2-135M-Instruct.Q4_1.gguf [--dtype bfloat16]
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

PROMPT_TEXT = Path("/usr/share/common-licenses/Apache-2.0")


def synchronized_seconds(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def memory_bandwidth(device: torch.device) -> dict:
    """Bytes per second of a large copy (read + write) and of a read-only sum, best of ten each."""
    elements = 512 * 1024 * 1024 // 4  # 512 MiB of f32: far past any cache
    source = torch.rand(elements, device=device)
    target = torch.empty_like(source)
    copy_s, sum_s = [], []
    for _ in range(12):
        started = synchronized_seconds(device)
        target.copy_(source)
        copy_s.append(synchronized_seconds(device) - started)
        started = synchronized_seconds(device)
        source.sum()
        sum_s.append(synchronized_seconds(device) - started)
    nbytes = source.numel() * source.element_size()
    return {"copy_bytes_per_s": 2 * nbytes / min(copy_s[2:]), "read_bytes_per_s": nbytes / min(sum_s[2:])}


@torch.inference_mode()
def one_run(model, prompt: torch.Tensor, gen_tokens: int) -> dict:
    """One prefill and greedy decode with the model's KV cache."""
    device = prompt.device
    started = synchronized_seconds(device)
    out = model(input_ids=prompt, use_cache=True)
    token = out.logits[:, -1].argmax(-1, keepdim=True)
    token.item()
    prefill_s = synchronized_seconds(device) - started
    past = out.past_key_values
    decode_started = synchronized_seconds(device)
    for _ in range(gen_tokens - 1):
        out = model(input_ids=token, past_key_values=past, use_cache=True)
        past = out.past_key_values
        token = out.logits[:, -1].argmax(-1, keepdim=True)
        token.item()  # a token is known to the host every step, as a server needs it
    decode_s = synchronized_seconds(device) - decode_started
    return {
        "prefill_tokens_per_s": prompt.shape[1] / prefill_s,
        "time_to_first_token_s": prefill_s,
        "decode_tokens_per_s": (gen_tokens - 1) / decode_s,
    }


@torch.inference_mode()
def greedy(model, ids: list[int], tokens: int, device: torch.device) -> list[int]:
    out = model.generate(
        torch.tensor([ids], device=device), max_new_tokens=tokens, min_new_tokens=tokens,
        do_sample=False, num_beams=1,
    )
    return out[0, len(ids):].tolist()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, required=True, help="the GGUF file")
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--gen-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="bfloat16")
    parser.add_argument("--reference", type=Path, help="llama.cpp's greedy.json for this model")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args()
    if not args.model.is_file():
        print(f"bench_transformers: no model at {args.model}", file=sys.stderr)
        return 1
    if args.prompt_tokens < 1 or args.gen_tokens < 2 or args.repeats < 1:
        print("bench_transformers: --prompt-tokens >= 1, --gen-tokens >= 2, --repeats >= 1", file=sys.stderr)
        return 1

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = getattr(torch, args.dtype)
    started = time.perf_counter()
    folder, name = str(args.model.parent), args.model.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=dtype).to(device).eval()
    synchronized_seconds(device)
    load_s = time.perf_counter() - started

    report = {
        "engine": f"transformers {transformers.__version__}, torch {torch.__version__}, {args.dtype}, eager",
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "model": name,
        "load_s": load_s,
    }
    if args.reference is not None:
        checks = []
        for case in json.loads(args.reference.read_text()):
            ids = greedy(model, case["prompt_ids"], len(case["greedy_ids"]), device)
            same = next((i for i, (a, b) in enumerate(zip(ids, case["greedy_ids"])) if a != b), len(ids))
            checks.append({"prompt": case["prompt"], "tokens": len(ids), "same_as_llama_cpp": same,
                           "text": tokenizer.decode(ids)})
        report["greedy_against_llama_cpp"] = checks

    text = PROMPT_TEXT.read_text() if PROMPT_TEXT.is_file() else "The quick brown fox jumps over the lazy dog. " * 64
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    prompt = torch.tensor([[ids[i % len(ids)] for i in range(args.prompt_tokens)]], device=device)
    one_run(model, prompt, min(args.gen_tokens, 8))  # warm-up: kernels chosen, caches allocated
    runs = [one_run(model, prompt, args.gen_tokens) for _ in range(args.repeats)]
    for key in runs[0]:
        report[key] = statistics.median(run[key] for run in runs)

    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    bandwidth = memory_bandwidth(device)
    roofline = max(bandwidth.values())
    report.update(bandwidth)
    report["weight_bytes_per_step"] = weight_bytes
    report["roofline_fraction"] = weight_bytes * report["decode_tokens_per_s"] / roofline

    if args.json:
        print(json.dumps(report, indent=1))
        return 0
    print(f"{report['engine']} on {report['device']}, {name}: load {load_s:.2f} s")
    for check in report.get("greedy_against_llama_cpp", []):
        print(f"  greedy {check['prompt']!r}: first {check['same_as_llama_cpp']} of {check['tokens']} tokens "
              f"equal llama.cpp's: {check['text']!r}")
    print(f"  prefill {report['prefill_tokens_per_s']:.1f} tokens/s ({args.prompt_tokens} tokens), "
          f"time to first token {report['time_to_first_token_s'] * 1e3:.1f} ms")
    print(f"  decode {report['decode_tokens_per_s']:.1f} tokens/s ({args.gen_tokens} tokens), "
          f"{weight_bytes / 1e6:.1f} MB of weights a step: {report['roofline_fraction']:.1%} of "
          f"{roofline / 1e9:.0f} GB/s (copy {bandwidth['copy_bytes_per_s'] / 1e9:.0f}, "
          f"read {bandwidth['read_bytes_per_s'] / 1e9:.0f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
