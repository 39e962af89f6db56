#!/usr/bin/env python3
"""Writes the seed corpus of the `gguf` fuzz target: three small GGUF v3 files with the shape of
real models (metadata keys, tokenizers, chat templates, tensors) but tiny vocabularies and
weights, so that mutations reach every part of the reader and of what is built from the
metadata (tokenizer, chat template, model configuration).

    python3 fuzz/seeds/make_gguf_seeds.py fuzz/seeds/gguf

Only the Python standard library; the output is the same byte for byte on every run.
"""
import struct
import sys
from pathlib import Path

U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
SCALAR = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f", BOOL: "<?",
          U64: "<Q", I64: "<q", F64: "<d"}
GGML_F32, GGML_Q8_0 = 0, 8


def string(text):
    data = text.encode()
    return struct.pack("<Q", len(data)) + data


def value(kind, v):
    if kind == STRING:
        return string(v)
    if kind == ARRAY:
        element, items = v
        out = struct.pack("<IQ", element, len(items))
        return out + b"".join(value(element, item) for item in items)
    return struct.pack(SCALAR[kind], v)


def gguf(metadata, tensors, alignment=32):
    """metadata: [(key, type, value)]; tensors: [(name, dims, ggml type, bytes)]."""
    out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(metadata))
    for key, kind, v in metadata:
        out += string(key) + struct.pack("<I", kind) + value(kind, v)
    offset, data = 0, b""
    for name, dims, ggml_type, payload in tensors:
        out += string(name) + struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims)
        out += struct.pack("<IQ", ggml_type, offset)
        data += payload + b"\0" * (-len(payload) % alignment)
        offset = len(data)
    out += b"\0" * (-len(out) % alignment)
    return out + data


def f32_tensor(name, dims):
    count = 1
    for d in dims:
        count *= d
    return (name, dims, GGML_F32, struct.pack(f"<{count}f", *[(i % 7) / 7 for i in range(count)]))


def byte_level_tokens():
    """GPT-2's printable stand-ins for the 256 bytes."""
    printable = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    stand_in, extra = {}, 0
    for b in range(256):
        if b in printable:
            stand_in[b] = chr(b)
        else:
            stand_in[b] = chr(256 + extra)
            extra += 1
    return [stand_in[b] for b in range(256)]


CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] "
          "+ '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
          "{% endif %}")
GEMMA = ("{{ bos_token }}{% for message in messages %}{% if message['role'] == 'assistant' %}{% set role = "
         "'model' %}{% else %}{% set role = message['role'] %}{% endif %}{{ '<start_of_turn>' + role + '\n' "
         "+ message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}{% if add_generation_prompt %}"
         "{{'<start_of_turn>model\n'}}{% endif %}")


def llama_bpe():
    tokens = byte_level_tokens() + ["Ġt", "he", "Ġthe", "in", "<|im_start|>", "<|im_end|>", "<|endoftext|>"]
    types = [1] * (len(tokens) - 3) + [3, 3, 3]
    embedding, vocab = 32, len(tokens)
    metadata = [
        ("general.architecture", STRING, "llama"),
        ("general.name", STRING, "seed"),
        ("llama.block_count", U32, 1),
        ("llama.context_length", U32, 64),
        ("llama.embedding_length", U32, embedding),
        ("llama.feed_forward_length", U32, 64),
        ("llama.attention.head_count", U32, 4),
        ("llama.attention.head_count_kv", U32, 2),
        ("llama.rope.freq_base", F32, 10000.0),
        ("llama.attention.layer_norm_rms_epsilon", F32, 1e-5),
        ("llama.vocab_size", U32, vocab),
        ("llama.rope.dimension_count", U32, 8),
        ("tokenizer.ggml.model", STRING, "gpt2"),
        ("tokenizer.ggml.pre", STRING, "smollm"),
        ("tokenizer.ggml.tokens", ARRAY, (STRING, tokens)),
        ("tokenizer.ggml.token_type", ARRAY, (I32, types)),
        ("tokenizer.ggml.merges", ARRAY, (STRING, ["Ġ t", "h e", "Ġt he", "i n"])),
        ("tokenizer.ggml.bos_token_id", U32, vocab - 3),
        ("tokenizer.ggml.eos_token_id", U32, vocab - 2),
        ("tokenizer.ggml.add_bos_token", BOOL, False),
        ("tokenizer.chat_template", STRING, CHATML),
    ]
    tensors = [("token_embd.weight", [embedding, vocab], GGML_Q8_0, bytes(34 * vocab)),
               f32_tensor("output_norm.weight", [embedding])]
    return gguf(metadata, tensors)


def gemma3_spm():
    tokens = ["<pad>", "<eos>", "<bos>", "<unk>"] + [f"<0x{b:02X}>" for b in range(256)]
    tokens += ["▁", "▁the", "he", "th", "<start_of_turn>", "<end_of_turn>"]
    types = [3, 3, 3, 2] + [6] * 256 + [1, 1, 1, 1, 3, 3]
    scores = [0.0] * 260 + [-1.0, -2.0, -3.0, -4.0, 0.0, 0.0]
    embedding, vocab = 32, len(tokens)
    metadata = [
        ("general.architecture", STRING, "gemma3"),
        ("gemma3.block_count", U32, 1),
        ("gemma3.context_length", U32, 128),
        ("gemma3.embedding_length", U32, embedding),
        ("gemma3.feed_forward_length", U32, 64),
        ("gemma3.attention.head_count", U32, 2),
        ("gemma3.attention.head_count_kv", U32, 1),
        ("gemma3.attention.key_length", U32, 16),
        ("gemma3.attention.value_length", U32, 16),
        ("gemma3.attention.sliding_window", U32, 32),
        ("gemma3.rope.freq_base", F32, 1000000.0),
        ("gemma3.attention.layer_norm_rms_epsilon", F32, 1e-6),
        ("tokenizer.ggml.model", STRING, "llama"),
        ("tokenizer.ggml.tokens", ARRAY, (STRING, tokens)),
        ("tokenizer.ggml.scores", ARRAY, (F32, scores)),
        ("tokenizer.ggml.token_type", ARRAY, (I32, types)),
        ("tokenizer.ggml.bos_token_id", U32, 2),
        ("tokenizer.ggml.eos_token_id", U32, 1),
        ("tokenizer.ggml.unknown_token_id", U32, 3),
        ("tokenizer.ggml.add_space_prefix", BOOL, False),
        ("tokenizer.chat_template", STRING, GEMMA),
    ]
    tensors = [("token_embd.weight", [embedding, vocab], GGML_Q8_0, bytes(34 * vocab)),
               f32_tensor("output_norm.weight", [embedding])]
    return gguf(metadata, tensors)


def every_value_type():
    metadata = [
        ("general.architecture", STRING, "llama"),
        ("general.alignment", U32, 64),
        ("test.u8", U8, 200), ("test.i8", I8, -100), ("test.u16", U16, 60000), ("test.i16", I16, -30000),
        ("test.u32", U32, 4000000000), ("test.i32", I32, -2000000000), ("test.f32", F32, -1.5e-5),
        ("test.bool", BOOL, True), ("test.string", STRING, "héllo ✓"), ("test.u64", U64, 2**64 - 2),
        ("test.i64", I64, -2**63 + 1), ("test.f64", F64, 3.141592653589793),
        ("test.array_u8", ARRAY, (U8, [0, 1, 255])),
        ("test.array_string", ARRAY, (STRING, ["a", "", "<|im_end|>"])),
        ("test.array_nested", ARRAY, (ARRAY, [(U16, [1, 2]), (BOOL, [True, False])])),
    ]
    tensors = [f32_tensor("a", [3]), ("b", [32, 2], GGML_Q8_0, bytes(68)), f32_tensor("c", [2, 1, 1, 2])]
    return gguf(metadata, tensors, alignment=64)


def main():
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    for name, build in [("llama-bpe", llama_bpe), ("gemma3-spm", gemma3_spm), ("every-value-type", every_value_type)]:
        (out / f"{name}.gguf").write_bytes(build())


if __name__ == "__main__":
    main()
