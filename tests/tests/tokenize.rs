//! The tokenizers of the two real models against llama.cpp's reference ids, and the
//! properties every tokenizer must have: encode/decode round trips on random Unicode, an
//! incremental detokenizer that agrees with `decode` and never splits a character, errors for
//! ids outside the vocabulary.
//!
//! How the reference was made (checked against its content): llama-cpp-python's
//! `Llama.tokenize(text, add_bos, special=False)`, i.e. llama.cpp's
//! `llama_tokenize(add_special, parse_special = false)`: SmolLM2's `<|im_start|>` in
//! `tokenize.json` comes out as the characters `<`, `|`, `im`, ... So `ids_plain` is
//! `encode(text, false, false)` and `ids_with_special` is `encode(text, true, false)`.

use std::time::Instant;

use flint_core::gguf::GgufFile;
use flint_core::tokenizer::{Detokenizer, TokenId, TokenKind, Tokenizer};
use flint_e2e::{GEMMA3, MODELS, ReferenceModel, SMOLLM2};

fn tokenizer(model: ReferenceModel) -> Tokenizer {
    let file = GgufFile::open(model.path()).unwrap();
    let start = Instant::now();
    let tokenizer = Tokenizer::from_gguf(&file).unwrap();
    eprintln!(
        "{}: tokenizer of {} tokens built in {:?}",
        model.reference_name,
        tokenizer.vocab_size(),
        start.elapsed()
    );
    tokenizer
}

fn reference(model: ReferenceModel, file: &str) -> serde_json::Value {
    let path = model.reference_dir().join(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|err| panic!("{}: {err}", path.display()));
    serde_json::from_str(&text).unwrap()
}

fn ids(value: &serde_json::Value) -> Vec<TokenId> {
    value.as_array().unwrap().iter().map(|id| id.as_u64().unwrap() as TokenId).collect()
}

#[test]
fn token_ids_match_llama_cpp_for_every_reference_text() {
    for model in MODELS {
        let tokenizer = tokenizer(model);
        let cases = reference(model, "tokenize.json");
        let cases = cases.as_array().unwrap();
        assert_eq!(cases.len(), 11, "tokenize.json changed: update this test");
        for case in cases {
            let text = case["text"].as_str().unwrap();
            let what = format!("{}: {text:?}", model.reference_name);
            assert_eq!(tokenizer.encode(text, false, false), ids(&case["ids_plain"]), "{what} without BOS");
            assert_eq!(
                tokenizer.encode(text, true, false),
                ids(&case["ids_with_special"]),
                "{what} with BOS"
            );
            assert_eq!(tokenizer.decode(&ids(&case["ids_plain"]), false).unwrap(), text, "{what} decoded");
        }
    }
}

#[test]
fn prompt_ids_match_llama_cpp_in_the_generation_references() {
    for model in MODELS {
        let tokenizer = tokenizer(model);
        let greedy = reference(model, "greedy.json");
        let logprobs = reference(model, "logprobs.json");
        let cases = greedy
            .as_array()
            .unwrap()
            .iter()
            .map(|case| (&case["prompt"], &case["prompt_ids"]))
            .chain(logprobs.as_array().unwrap().iter().map(|case| (&case["text"], &case["ids"])));
        let mut count = 0;
        for (text, expected) in cases {
            let text = text.as_str().unwrap();
            assert_eq!(
                tokenizer.encode(text, true, false),
                ids(expected),
                "{}: {text:?}",
                model.reference_name
            );
            count += 1;
        }
        assert!(
            count >= 5,
            "{}: only {count} prompts in greedy.json and logprobs.json",
            model.reference_name
        );
    }
}

#[test]
fn special_tokens_and_flags_come_from_the_metadata() {
    let smollm2 = tokenizer(SMOLLM2);
    assert_eq!((smollm2.bos(), smollm2.eos(), smollm2.eot()), (Some(1), Some(2), Some(2)));
    assert!(!smollm2.add_bos() && !smollm2.add_eos());
    assert_eq!(smollm2.end_of_generation(), [0, 2]);
    assert_eq!(smollm2.token_kind(1), Some(TokenKind::Control));

    let gemma3 = tokenizer(GEMMA3);
    assert_eq!((gemma3.bos(), gemma3.eos(), gemma3.eot()), (Some(2), Some(1), Some(106)));
    assert!(gemma3.add_bos() && !gemma3.add_eos());
    assert_eq!(gemma3.end_of_generation(), [1, 106]);
    assert_eq!(gemma3.token_text(106), Some("<end_of_turn>"));
    assert_eq!(gemma3.token_kind(138), Some(TokenKind::UserDefined));
}

#[test]
fn control_tokens_in_text_are_tokens_only_when_parsing_specials() {
    let smollm2 = tokenizer(SMOLLM2);
    let chat = "<|im_start|>user\nHi<|im_end|>";
    // "user", "\n", "Hi" as in tokenize.json, between the two control tokens.
    assert_eq!(smollm2.encode(chat, false, true), [1, 4093, 198, 26843, 2]);
    assert_eq!(smollm2.decode(&smollm2.encode(chat, false, true), false).unwrap(), chat);
    assert_eq!(smollm2.decode(&smollm2.encode(chat, false, true), true).unwrap(), "user\nHi");

    let gemma3 = tokenizer(GEMMA3);
    let chat = "<start_of_turn>user\nHi<end_of_turn>\n";
    assert_eq!(gemma3.encode(chat, true, true), [2, 105, 2364, 107, 10979, 106, 107]);
    assert_eq!(gemma3.decode(&gemma3.encode(chat, true, true), true).unwrap(), "user\nHi\n");
    // Without parsing, the text of a control token is text; decoding gives it back.
    let plain = gemma3.encode(chat, false, false);
    assert!(!plain.contains(&105) && !plain.contains(&106), "{plain:?}");
    assert_eq!(gemma3.decode(&plain, false).unwrap(), chat);
}

/// A seeded random source: a fresh seed each run (or `FLINT_TEST_SEED`), printed so a failure
/// can be replayed. SplitMix64: this crate has no `rand`.
struct Rng(u64);

impl Rng {
    fn new(what: &str) -> Self {
        let seed =
            std::env::var("FLINT_TEST_SEED").ok().and_then(|seed| seed.parse().ok()).unwrap_or_else(|| {
                std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64
            });
        eprintln!("{what}: FLINT_TEST_SEED={seed}");
        Rng(seed)
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, n)`.
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

/// Pieces random texts are made of: every script and shape of text a tokenizer trips on.
const PIECES: &[&str] = &[
    "a",
    "Z",
    "hello",
    " world",
    "it's",
    "I'LL",
    "  ",
    "   ",
    "\t",
    "\n",
    "\n\n\n",
    "\r\n",
    " \n ",
    "0",
    "42",
    "3.14",
    "-1e10",
    ",",
    ".",
    "!?",
    "...",
    "()",
    "{}",
    "<",
    ">",
    "</s>",
    "<s>",
    "<0x41>",
    "<table>",
    "▁",
    "Ġ",
    "Ċ",
    "é",
    "e\u{301}",
    "ñ",
    "ß",
    "Ω",
    "Ж",
    "日本語",
    "中文",
    "한국어",
    "ไทย",
    "עברית",
    "العربية",
    "हिन्दी",
    "🤖",
    "🚀",
    "👍🏽",
    "👨‍👩‍👧",
    "🇫🇷",
    "\u{200b}",
    "\u{200d}",
    "\u{feff}",
    "\u{a0}",
    "\u{3000}",
    "\u{fffd}",
    "\u{e000}",
    "\u{10ffff}",
    "\u{fdd0}",
    "\u{1}",
    "\u{7f}",
    "\u{85}",
    "\u{2028}",
    "𝕏",
    "x\u{308}\u{301}",
    "<|im_start|>",
    "<|im_end|>",
    "<start_of_turn>",
    "<end_of_turn>",
    "<bos>",
    "{{ x }}",
];

fn random_text(rng: &mut Rng) -> String {
    let pieces = rng.below(12);
    (0..pieces).map(|_| *rng.pick(PIECES)).collect()
}

#[test]
fn encode_then_decode_gives_back_random_unicode_text() {
    let mut rng = Rng::new("encode_then_decode_gives_back_random_unicode_text");
    for model in MODELS {
        let tokenizer = tokenizer(model);
        for _ in 0..400 {
            let text = random_text(&mut rng);
            // SentencePiece writes spaces as U+2581 '▁', so a '▁' in the text comes back as a
            // space (in llama.cpp and SentencePiece alike).
            let expected = if model == GEMMA3 { text.replace('▁', " ") } else { text.clone() };
            for parse_special in [false, true] {
                let ids = tokenizer.encode(&text, false, parse_special);
                let decoded = tokenizer.decode(&ids, false).unwrap();
                assert_eq!(
                    decoded, expected,
                    "{}: parse_special {parse_special}, ids {ids:?}",
                    model.reference_name
                );
            }
            // Skipping special tokens drops the BOS again.
            let ids = tokenizer.encode(&text, true, false);
            assert_eq!(
                tokenizer.decode(&ids, true).unwrap(),
                expected,
                "{}: ids {ids:?}",
                model.reference_name
            );
        }
    }
}

/// SmolLM2's vocabulary has no token for 21 of the 256 bytes (0x04, 0x06, 0x13, 0x14, 0x16,
/// 0x1D, 0xC0, 0xC1, 0xF1, 0xF2, 0xF5 to 0xFF); llama.cpp drops such bytes when encoding, and
/// so does flint. Characters of planes 4 to 11 (lead bytes F1, F2) are lost with them.
#[test]
fn bytes_without_a_token_are_dropped_as_llama_cpp_drops_them() {
    let smollm2 = tokenizer(SMOLLM2);
    // "\u{4}" is a word of its own between "a" and "b", and yields no token.
    let [a, b] = ["a", "b"].map(|text| smollm2.encode(text, false, false)[0]);
    assert_eq!(smollm2.encode("a\u{4}b", false, false), [a, b]);
    // U+50000 is F1 90 80 80: without its lead byte, three stray continuation bytes remain.
    let ids = smollm2.encode("x\u{50000}y", false, false);
    assert_eq!(smollm2.decode(&ids, false).unwrap(), "x\u{fffd}\u{fffd}\u{fffd}y");
}

/// Feeds `ids` one at a time and checks the stream against `decode`.
fn assert_stream_equals_decode(tokenizer: &Tokenizer, ids: &[TokenId], skip_special: bool) -> Vec<String> {
    let mut detokenizer = Detokenizer::new(skip_special);
    let mut pieces: Vec<String> = ids.iter().map(|&id| detokenizer.push(tokenizer, id).unwrap()).collect();
    pieces.push(detokenizer.finish());
    let decoded = tokenizer.decode(ids, skip_special).unwrap();
    assert_eq!(pieces.concat(), decoded, "ids {ids:?}, skip_special {skip_special}");
    pieces
}

#[test]
fn streamed_text_equals_decode_for_random_ids() {
    let mut rng = Rng::new("streamed_text_equals_decode_for_random_ids");
    for model in MODELS {
        let tokenizer = tokenizer(model);
        let vocab_size = tokenizer.vocab_size();
        // Byte-fallback tokens (gemma3) and single-byte tokens (SmolLM2) carry partial UTF-8:
        // half the ids are drawn from them.
        let byte_ids: Vec<TokenId> = (0..vocab_size as TokenId)
            .filter(|&id| {
                tokenizer.token_kind(id) == Some(TokenKind::Byte)
                    || (tokenizer.token_kind(id) == Some(TokenKind::Normal)
                        && tokenizer.token_text(id).unwrap().chars().count() == 1)
            })
            .collect();
        assert!(byte_ids.len() >= 200, "{}: {} byte tokens", model.reference_name, byte_ids.len());
        for _ in 0..300 {
            let length = rng.below(40);
            let ids: Vec<TokenId> =
                (0..length)
                    .map(|_| {
                        if rng.below(2) == 0 {
                            *rng.pick(&byte_ids)
                        } else {
                            rng.below(vocab_size) as TokenId
                        }
                    })
                    .collect();
            assert_stream_equals_decode(&tokenizer, &ids, false);
            assert_stream_equals_decode(&tokenizer, &ids, true);
        }
    }
}

#[test]
fn streaming_never_splits_a_character() {
    let mut rng = Rng::new("streaming_never_splits_a_character");
    for model in MODELS {
        let tokenizer = tokenizer(model);
        let mut held_back = 0;
        for _ in 0..200 {
            let text = random_text(&mut rng);
            let ids = tokenizer.encode(&text, false, false);
            let pieces = assert_stream_equals_decode(&tokenizer, &ids, false);
            // The text is valid, so no piece may hold a replacement character it lacks.
            let replacements = |text: &str| text.matches('\u{fffd}').count();
            assert_eq!(
                pieces.iter().map(|piece| replacements(piece)).sum::<usize>(),
                replacements(&text),
                "{text:?}"
            );
            held_back += pieces.iter().filter(|piece| piece.is_empty()).count();
        }
        // Characters split across tokens do occur in these texts (emoji in byte tokens).
        assert!(held_back > 0, "{}: no token ever ended inside a character", model.reference_name);
    }
}

#[test]
fn ids_outside_the_vocabulary_are_errors() {
    for model in MODELS {
        let tokenizer = tokenizer(model);
        let outside = tokenizer.vocab_size() as TokenId;
        let error = tokenizer.decode(&[1, outside], false).unwrap_err().to_string();
        assert!(error.contains(&format!("token id {outside} is outside the vocabulary")), "{error}");
        assert!(Detokenizer::new(true).push(&tokenizer, outside).is_err());
        assert!(tokenizer.token_text(outside).is_none() && tokenizer.token_kind(outside).is_none());
    }
}

/// Throughput on a real document: the text `perplexity.json` was measured on.
#[test]
fn encodes_a_long_document_quickly_and_losslessly() {
    let path = "/usr/share/common-licenses/Apache-2.0";
    let Ok(text) = std::fs::read_to_string(path) else {
        panic!("{path} is missing: install Debian's base-files (it ships the license texts)");
    };
    for model in MODELS {
        let tokenizer = tokenizer(model);
        let start = Instant::now();
        let ids = tokenizer.encode(&text, false, false);
        let elapsed = start.elapsed();
        eprintln!(
            "{}: {} bytes -> {} tokens in {elapsed:?} ({:.1} MB/s)",
            model.reference_name,
            text.len(),
            ids.len(),
            text.len() as f64 / elapsed.as_secs_f64() / 1e6
        );
        assert!(
            ids.len() > 2000 && ids.len() < text.len() / 2,
            "{}: {} tokens",
            model.reference_name,
            ids.len()
        );
        assert_eq!(tokenizer.decode(&ids, false).unwrap(), text);
    }
}
