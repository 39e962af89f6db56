#!/usr/bin/env python3
"""How close llama.cpp comes to its own reference data (tests/reference) when nothing but
its attention path or KV-cache precision changes: the floor under any bound that a test of
flint against that data can demand. Prints a markdown table.

    scripts/reference-variance.sh     # the venv comes from scripts/llama-cpp.sh

The reference was made with flash attention off and an f16 KV cache (its first row must agree
exactly); the other rows are the same build, weights and inputs with flash attention on, or
with an f32 KV cache. The measures are those of tests/tests/model_reference.rs: teacher-forced
top-1 agreement over logprobs.json, the largest |difference| of the actual next token's
log-probability, and perplexity as the reference README defines it (consecutive windows of
`ctx` tokens from an empty cache, every token of a window but its first scored).
"""
import argparse
import json
import math
import os
from pathlib import Path

import numpy as np
from llama_cpp import Llama

GGML_TYPE_F32 = 0
CONFIGS = [
    ("reference: flash attention off, f16 KV", dict(flash_attn=False)),
    ("flash attention on, f16 KV", dict(flash_attn=True)),
    ("flash attention off, f32 KV", dict(flash_attn=False, type_k=GGML_TYPE_F32, type_v=GGML_TYPE_F32)),
]


def log_softmax(row):
    row = np.asarray(row, dtype=np.float64)
    top = row.max()
    return row - (top + math.log(np.exp(row - top).sum()))


def teacher_forced(llm, cases):
    """(positions agreeing on the top token, positions, worst |logprob difference|)."""
    agree = total = 0
    worst = 0.0
    for case in cases:
        llm.reset()
        llm.eval(case["ids"])
        for i, top5 in enumerate(case["top5"]):
            row = log_softmax(llm.scores[i])
            total += 1
            agree += int(np.argmax(row) == top5[0][0])
            if i < len(case["next_token_logprob"]):
                worst = max(worst, abs(row[case["ids"][i + 1]] - case["next_token_logprob"][i]))
    return agree, total, worst


def perplexity(llm, ids, ctx, windows):
    nll, scored = 0.0, 0
    for w in range(windows):
        window = ids[w * ctx:(w + 1) * ctx]
        if len(window) < 2:
            break
        llm.reset()
        llm.eval(window)
        for i in range(len(window) - 1):
            nll -= log_softmax(llm.scores[i])[window[i + 1]]
            scored += 1
    return math.exp(nll / scored), scored


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reference", default=str(Path(__file__).resolve().parents[1] / "tests" / "reference"))
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    parser.add_argument("--models", default=os.environ.get("FLINT_MODEL_DIR", str(cache / "flint/models")))
    parser.add_argument("--text", default="/usr/share/common-licenses/Apache-2.0")
    args = parser.parse_args()
    models = [
        ("smollm2-135m-q4_1", "SmolLM2-135M-Instruct.Q4_1.gguf"),
        ("gemma3-270m-q4_k_m", "gemma-3-270m-q4_k_m.gguf"),
    ]
    text = Path(args.text).read_text()
    threads = os.cpu_count() or 1
    print("| model | llama.cpp configuration | top-1 agreement | max abs logprob diff | perplexity | vs reference |")
    print("| --- | --- | --- | --- | --- | --- |")
    for folder, file in models:
        reference = Path(args.reference) / folder
        cases = json.loads((reference / "logprobs.json").read_text())
        expected = json.loads((reference / "perplexity.json").read_text())
        longest = max(len(case["ids"]) for case in cases)
        for name, config in CONFIGS:
            n_ctx = max(longest, expected["ctx"])
            llm = Llama(model_path=str(Path(args.models) / file), n_ctx=n_ctx, n_batch=n_ctx, n_threads=threads,
                        logits_all=True, verbose=False, **config)
            agree, total, worst = teacher_forced(llm, cases)
            tokens = llm.tokenize(text.encode(), add_bos=False, special=False)
            ppl, scored = perplexity(llm, tokens, expected["ctx"], expected["windows"])
            assert scored == expected["scored_tokens"], (scored, expected["scored_tokens"])
            relative = (ppl - expected["ppl"]) / expected["ppl"] * 100
            print(f"| {folder} | {name} | {agree}/{total} ({agree / total:.0%}) | {worst:.3f} | {ppl:.3f} | {relative:+.2f}% |",
                  flush=True)
            del llm


if __name__ == "__main__":
    main()
