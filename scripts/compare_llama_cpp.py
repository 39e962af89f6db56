"""Times llama.cpp and `flint bench` on the same model, alternating, and prints both with their
ratios. Two llama.cpp backends: `--backend cpu` is llama-cpp-python built for this CPU
(scripts/compare-llama-cpp.sh), `--backend vulkan` the prebuilt Vulkan backend of the
cyllama-vulkan wheel with every layer on the GPU, the device flint runs on
(scripts/compare-llama-cpp-vulkan.sh; on lavapipe with GGML_VK_VISIBLE_DEVICES=0).

Both engines get the same prompt: the text `flint bench` uses (Debian's copy of the Apache
License 2.0), tokenized without special tokens and repeated to --prompt-tokens; then greedy
decoding of --gen-tokens tokens, the first of them from the prefill. Decode tokens/s counts the
other gen_tokens - 1 steps, as `flint bench` does. Figures are medians over --repeats runs.
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

PROMPT_TEXT = Path("/usr/share/common-licenses/Apache-2.0")


def default_model() -> Path:
    cache = os.environ.get("FLINT_MODEL_DIR")
    if cache is None:
        cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "flint" / "models"
    return Path(cache) / "SmolLM2-135M-Instruct.Q4_1.gguf"


class CpuLlama:
    """llama.cpp's CPU backend through llama-cpp-python, with as many threads as cores."""

    def __init__(self, model: Path, n_ctx: int, n_batch: int):
        from llama_cpp import Llama, __version__

        threads = os.cpu_count() or 1
        self.llm = Llama(
            model_path=str(model), n_ctx=n_ctx, n_batch=n_batch,
            n_threads=threads, n_threads_batch=threads, verbose=False,
        )
        self.description = f"llama-cpp-python {__version__}, CPU, {threads} threads"

    def tokenize(self, text: str) -> list[int]:
        return self.llm.tokenize(text.encode(), add_bos=False, special=False)

    def reset(self) -> None:
        self.llm.reset()

    def eval_greedy(self, tokens: list[int]) -> int:
        """Evaluates `tokens` after those before; returns the greedy next token."""
        import numpy as np

        self.llm.eval(tokens)
        logits = np.ctypeslib.as_array(self.llm._ctx.get_logits(), shape=(self.llm.n_vocab(),))
        return int(np.argmax(logits))


class VulkanLlama:
    """llama.cpp's Vulkan backend from the cyllama-vulkan wheel, every layer offloaded. Its
    context and greedy sampler come from cyllama's `LLM` (private helpers of the pinned
    version: scripts/compare-llama-cpp-vulkan.sh pins it)."""

    def __init__(self, model: Path, n_ctx: int, n_batch: int):
        from importlib.metadata import version

        from cyllama.api import LLM, GenerationConfig
        from cyllama.llama.llama_cpp import ggml_backend_dev_info, llama_batch_get_one

        self.config = GenerationConfig(n_gpu_layers=99, temperature=0.0, n_ctx=n_ctx, n_batch=n_batch)
        self.llm = LLM(str(model), config=self.config, verbose=False)
        self.batch = llama_batch_get_one
        gpus = [d["description"] for d in ggml_backend_dev_info() if d["type"] == "GPU"]
        if not gpus:
            raise SystemExit("compare-llama-cpp: llama.cpp's Vulkan backend found no device")
        self.description = f"cyllama-vulkan {version('cyllama-vulkan')}, Vulkan on {gpus[0]}, all layers"
        self.position = 0

    def tokenize(self, text: str) -> list[int]:
        return self.llm.vocab.tokenize(text, add_special=False, parse_special=False)

    def reset(self) -> None:
        self.ctx = self.llm._ensure_context(self.config.n_ctx, self.config)
        self.sampler = self.llm._ensure_sampler(self.config)
        self.ctx.kv_cache_clear()
        self.position = 0

    def eval_greedy(self, tokens: list[int]) -> int:
        self.ctx.decode(self.batch(tokens, self.position))
        self.position += len(tokens)
        return self.sampler.sample(self.ctx, -1)


def llama_cpp_run(llm, prompt: list[int], gen_tokens: int) -> dict:
    """One prefill and greedy decode; the same work `flint bench` times."""
    llm.reset()
    started = time.perf_counter()
    token = llm.eval_greedy(prompt)
    prefill_s = time.perf_counter() - started
    decode_started = time.perf_counter()
    for _ in range(gen_tokens - 1):
        token = llm.eval_greedy([token])
    decode_s = time.perf_counter() - decode_started
    return {
        "prefill_tokens_per_s": len(prompt) / prefill_s,
        "time_to_first_token_s": prefill_s,
        "decode_tokens_per_s": (gen_tokens - 1) / decode_s,
    }


def flint_run(flint: str, model: Path, prompt_tokens: int, gen_tokens: int) -> dict:
    """One `flint bench` process: load, a warm-up, one timed run."""
    command = [
        flint, "--quiet", "bench", "--model", str(model),
        "--prompt-tokens", str(prompt_tokens), "--gen-tokens", str(gen_tokens),
        "--repeats", "1", "--json",
    ]
    done = subprocess.run(command, check=True, capture_output=True, text=True)
    return json.loads(done.stdout)


def median(runs: list[dict], key: str) -> float:
    return statistics.median(run[key] for run in runs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--flint", required=True, help="the flint binary")
    parser.add_argument("--model", type=Path, default=default_model())
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--gen-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--backend", choices=["cpu", "vulkan"], default="cpu")
    args = parser.parse_args()
    if not args.model.is_file():
        print(f"compare-llama-cpp: no model at {args.model}; run scripts/fetch-models.sh", file=sys.stderr)
        return 1
    if args.prompt_tokens < 1 or args.gen_tokens < 2 or args.repeats < 1:
        print("compare-llama-cpp: --prompt-tokens >= 1, --gen-tokens >= 2, --repeats >= 1", file=sys.stderr)
        return 1

    threads = os.cpu_count() or 1
    engine = VulkanLlama if args.backend == "vulkan" else CpuLlama
    started = time.perf_counter()
    llm = engine(args.model, args.prompt_tokens + args.gen_tokens + 16, max(args.prompt_tokens, 32))
    llama_load_s = time.perf_counter() - started
    text = PROMPT_TEXT.read_text() if PROMPT_TEXT.is_file() else "The quick brown fox jumps over the lazy dog. " * 64
    ids = llm.tokenize(text)
    prompt = [ids[i % len(ids)] for i in range(args.prompt_tokens)]

    llama_cpp_run(llm, prompt, min(args.gen_tokens, 8))  # warm-up, as flint bench does its own
    llama_runs, flint_runs = [], []
    for repeat in range(args.repeats):
        print(f"run {repeat + 1} of {args.repeats}: llama.cpp", file=sys.stderr)
        llama_runs.append(llama_cpp_run(llm, prompt, args.gen_tokens))
        print(f"run {repeat + 1} of {args.repeats}: flint", file=sys.stderr)
        flint_runs.append(flint_run(args.flint, args.model, args.prompt_tokens, args.gen_tokens))

    adapter = flint_runs[-1]["adapter"]
    print(f"Model {args.model.name}, {args.prompt_tokens} prompt tokens, {args.gen_tokens} generated, "
          f"median of {args.repeats} alternating runs. Machine: {platform.machine()}, {threads} cores. "
          f"llama.cpp: {llm.description}. flint: {adapter}.\n")
    print("| | llama.cpp | flint | flint / llama.cpp |")
    print("| --- | --- | --- | --- |")
    rows = [
        ("prefill tokens/s", "prefill_tokens_per_s", "{:.1f}"),
        ("decode tokens/s", "decode_tokens_per_s", "{:.2f}"),
        ("time to first token (s)", "time_to_first_token_s", "{:.3f}"),
    ]
    for label, key, fmt in rows:
        ours, theirs = median(flint_runs, key), median(llama_runs, key)
        print(f"| {label} | {fmt.format(theirs)} | {fmt.format(ours)} | {ours / theirs:.3f} |")
    flint_load = median(flint_runs, "load_s")
    print(f"| load (s) | {llama_load_s:.3f} | {flint_load:.3f} | {flint_load / llama_load_s:.3f} |")
    print(f"\nflint's decode reads weights at {median(flint_runs, 'roofline_fraction'):.1%} of the "
          f"bandwidth its probe kernels measured ({median(flint_runs, 'roofline_bytes_per_s') / 1e9:.2f} GB/s), "
          f"with {median(flint_runs, 'dispatches_per_layer'):.1f} dispatches per layer.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
