//! Unit tests on small hand-made vocabularies, where the expected tokens can be worked out by
//! hand from llama.cpp's algorithm. The two real vocabularies are tested against llama.cpp's
//! own output in `tests/tests/tokenize.rs`.

use super::*;

fn strings(texts: &[&str]) -> Vec<String> {
    texts.iter().map(|text| text.to_string()).collect()
}

/// A SentencePiece vocabulary: 0 <unk>, 1 <s>, 2 </s>, the 256 byte tokens, then `pieces`
/// with their scores, then `extra` tokens of the given kinds (score 0).
struct SpmVocabulary {
    tokens: Vec<String>,
    types: Vec<i32>,
    scores: Vec<f32>,
}

const BYTE_BASE: u32 = 3;

impl SpmVocabulary {
    fn new(pieces: &[(&str, f32)], extra: &[(&str, TokenKind)]) -> Self {
        let mut tokens = strings(&["<unk>", "<s>", "</s>"]);
        let mut types = vec![2, 3, 3];
        let mut scores = vec![0.0; 3];
        for byte in 0..=255u8 {
            tokens.push(format!("<0x{byte:02X}>"));
            types.push(6);
            scores.push(0.0);
        }
        for &(piece, score) in pieces {
            tokens.push(piece.to_string());
            types.push(1);
            scores.push(score);
        }
        for &(text, kind) in extra {
            tokens.push(text.to_string());
            types.push(match kind {
                TokenKind::Control => 3,
                TokenKind::UserDefined => 4,
                TokenKind::Unused => 5,
                _ => 1,
            });
            scores.push(0.0);
        }
        SpmVocabulary { tokens, types, scores }
    }

    fn tokenizer(&self, add_space_prefix: bool) -> Tokenizer {
        Tokenizer::from_spec(TokenizerSpec {
            model: "llama",
            pre: None,
            tokens: &self.tokens,
            token_types: Some(&self.types),
            scores: Some(self.scores.clone()),
            merges: None,
            bos: Some(1),
            eos: Some(2),
            eot: None,
            eom: None,
            unknown: Some(0),
            add_bos: None,
            add_eos: None,
            add_space_prefix: Some(add_space_prefix),
        })
        .unwrap()
    }
}

fn id(tokenizer: &Tokenizer, text: &str) -> TokenId {
    tokenizer.token_id(text).unwrap_or_else(|| panic!("{text:?} is not a token"))
}

#[test]
fn sentence_piece_merges_the_best_scoring_pair_first() {
    // "abc": candidates "ab" (-1) and "bc" (-2); "ab" wins and "abc" is not a token, so the
    // result is "ab" "c". With "bc" scoring higher it is "a" "bc".
    let vocabulary =
        SpmVocabulary::new(&[("a", -5.0), ("b", -5.0), ("c", -5.0), ("ab", -1.0), ("bc", -2.0)], &[]);
    let tokenizer = vocabulary.tokenizer(false);
    assert_eq!(tokenizer.encode("abc", false, false), [id(&tokenizer, "ab"), id(&tokenizer, "c")]);

    let vocabulary =
        SpmVocabulary::new(&[("a", -5.0), ("b", -5.0), ("c", -5.0), ("ab", -2.0), ("bc", -1.0)], &[]);
    let tokenizer = vocabulary.tokenizer(false);
    assert_eq!(tokenizer.encode("abc", false, false), [id(&tokenizer, "a"), id(&tokenizer, "bc")]);
}

#[test]
fn sentence_piece_breaks_score_ties_leftmost_and_merges_in_stages() {
    // "aaaa": the three "aa" pairs tie; leftmost first gives "aa" "aa", then "aaaa".
    let vocabulary = SpmVocabulary::new(&[("a", -5.0), ("aa", -1.0), ("aaaa", -0.5)], &[]);
    let tokenizer = vocabulary.tokenizer(false);
    assert_eq!(tokenizer.encode("aaaa", false, false), [id(&tokenizer, "aaaa")]);
    // Five: "aa" "aa" "a", then "aaaa" "a".
    assert_eq!(tokenizer.encode("aaaaa", false, false), [id(&tokenizer, "aaaa"), id(&tokenizer, "a")]);
    // Three: "aa" "a" (the leftmost pair merged; "aaa" is not a token).
    assert_eq!(tokenizer.encode("aaa", false, false), [id(&tokenizer, "aa"), id(&tokenizer, "a")]);
}

#[test]
fn sentence_piece_writes_unknown_characters_as_utf8_byte_tokens() {
    let vocabulary = SpmVocabulary::new(&[("x", -1.0)], &[]);
    let tokenizer = vocabulary.tokenizer(false);
    // 'é' is C3 A9, '🤖' is F0 9F A4 96.
    let byte = |value: u32| BYTE_BASE + value;
    assert_eq!(
        tokenizer.encode("xé🤖", false, false),
        [id(&tokenizer, "x"), byte(0xC3), byte(0xA9), byte(0xF0), byte(0x9F), byte(0xA4), byte(0x96)]
    );
    assert_eq!(tokenizer.decode(&tokenizer.encode("xé🤖", false, false), false).unwrap(), "xé🤖");
}

#[test]
fn sentence_piece_escapes_spaces_and_adds_the_prefix_after_specials() {
    let vocabulary = SpmVocabulary::new(
        &[("▁", -3.0), ("h", -5.0), ("i", -5.0), ("▁h", -2.0), ("▁hi", -1.0), ("hi", -1.5)],
        &[("<ctl>", TokenKind::Control)],
    );
    let with_prefix = vocabulary.tokenizer(true);
    let hi = id(&with_prefix, "▁hi");
    let control = id(&with_prefix, "<ctl>");
    // The prefix space is added at the start and after a special token, not after text.
    assert_eq!(with_prefix.encode("hi hi", false, false), [hi, hi]);
    assert_eq!(with_prefix.encode("hi<ctl>hi", false, true), [hi, control, hi]);
    // Decoding drops the space the prefix added, once, at the start.
    assert_eq!(with_prefix.decode(&[hi, hi], false).unwrap(), "hi hi");
    assert_eq!(with_prefix.decode(&[hi, control, hi], false).unwrap(), "hi<ctl> hi");

    let without_prefix = vocabulary.tokenizer(false);
    assert_eq!(without_prefix.encode("hi hi", false, false), [id(&without_prefix, "hi"), hi]);
    assert_eq!(without_prefix.decode(&[hi, hi], false).unwrap(), " hi hi");
}

#[test]
fn bos_and_eos_follow_the_metadata() {
    let vocabulary = SpmVocabulary::new(&[("a", -1.0)], &[]);
    let tokenizer = vocabulary.tokenizer(false);
    // SentencePiece adds BOS unless the file says otherwise; EOS only when it says so.
    assert!(tokenizer.add_bos() && !tokenizer.add_eos());
    let a = id(&tokenizer, "a");
    assert_eq!(tokenizer.encode("a", true, false), [1, a]);
    assert_eq!(tokenizer.encode("", true, false), [1]);
    assert_eq!(tokenizer.encode("", false, false), Vec::<TokenId>::new());
    assert_eq!(tokenizer.encode("a", false, false), [a]);

    let spec = |add_bos: Option<bool>, add_eos: Option<bool>, bos: Option<u32>| TokenizerSpec {
        model: "llama",
        pre: None,
        tokens: &vocabulary.tokens,
        token_types: Some(&vocabulary.types),
        scores: Some(vocabulary.scores.clone()),
        merges: None,
        bos,
        eos: Some(2),
        eot: None,
        eom: None,
        unknown: Some(0),
        add_bos,
        add_eos,
        add_space_prefix: Some(false),
    };
    let both = Tokenizer::from_spec(spec(Some(false), Some(true), Some(1))).unwrap();
    assert_eq!(both.encode("a", true, false), [a, 2]);
    assert_eq!((both.bos(), both.eos()), (Some(1), Some(2)));
    // An id outside the vocabulary falls back to the default (1), as in llama.cpp.
    let fallback = Tokenizer::from_spec(spec(None, None, Some(1_000_000))).unwrap();
    assert_eq!(fallback.bos(), Some(1));
}

#[test]
fn decode_skips_control_tokens_only_when_asked() {
    let vocabulary = SpmVocabulary::new(
        &[("a", -1.0)],
        &[("<ctl>", TokenKind::Control), ("<ud>", TokenKind::UserDefined)],
    );
    let tokenizer = vocabulary.tokenizer(false);
    let ids = tokenizer.encode("<ctl>a<ud>", true, true);
    assert_eq!(ids, [1, id(&tokenizer, "<ctl>"), id(&tokenizer, "a"), id(&tokenizer, "<ud>")]);
    assert_eq!(tokenizer.decode(&ids, false).unwrap(), "<s><ctl>a<ud>");
    // User-defined tokens are text: kept even when special tokens are skipped.
    assert_eq!(tokenizer.decode(&ids, true).unwrap(), "a<ud>");
}

#[test]
fn special_tokens_are_found_longest_first_and_control_only_when_parsing_specials() {
    let vocabulary = SpmVocabulary::new(
        &[("<", -5.0), (">", -5.0), ("a", -5.0), ("b", -5.0), ("c", -5.0), ("x", -5.0)],
        &[("<ab>", TokenKind::Control), ("abc", TokenKind::UserDefined), ("xa", TokenKind::UserDefined)],
    );
    let tokenizer = vocabulary.tokenizer(false);
    let [lt, gt, a, b, x] = ["<", ">", "a", "b", "x"].map(|text| id(&tokenizer, text));
    let [control, abc] = ["<ab>", "abc"].map(|text| id(&tokenizer, text));
    // The longer "abc" is found before "xa", although "xa" starts further left: "x" | "abc"
    // (leftmost-longest matching would give "xa" "b" "c").
    assert_eq!(tokenizer.encode("xabc", false, false), [x, abc]);
    // Control tokens only count when special tokens are parsed; user-defined ones always.
    assert_eq!(tokenizer.encode("<ab>xabc", false, true), [control, x, abc]);
    assert_eq!(tokenizer.encode("<ab>", false, false), [lt, a, b, gt]);
}

#[test]
fn a_token_given_twice_is_an_error() {
    let vocabulary = SpmVocabulary::new(&[("a", -1.0), ("a", -2.0)], &[]);
    let error = Tokenizer::from_spec(TokenizerSpec {
        model: "llama",
        pre: None,
        tokens: &vocabulary.tokens,
        token_types: Some(&vocabulary.types),
        scores: Some(vocabulary.scores.clone()),
        merges: None,
        bos: Some(1),
        eos: Some(2),
        eot: None,
        eom: None,
        unknown: Some(0),
        add_bos: None,
        add_eos: None,
        add_space_prefix: None,
    })
    .unwrap_err();
    assert!(error.to_string().contains("\"a\" appears twice (ids 259 and 260)"), "{error}");
}

/// A byte-level BPE vocabulary: the 256 byte stand-ins (in byte order, so id = byte), then
/// the merged tokens of `merges` in order, then `extra` control tokens.
struct BpeVocabulary {
    tokens: Vec<String>,
    types: Vec<i32>,
    merges: Vec<String>,
}

impl BpeVocabulary {
    fn new(merges: &[(&str, &str)], extra: &[&str]) -> Self {
        let mut tokens: Vec<String> = (0..=255u8).map(|byte| bpe::byte_char(byte).to_string()).collect();
        let mut types = vec![1; 256];
        for (left, right) in merges {
            let merged = format!("{left}{right}");
            if !tokens.contains(&merged) {
                tokens.push(merged);
                types.push(1);
            }
        }
        for text in extra {
            tokens.push(text.to_string());
            types.push(3);
        }
        let merges = merges.iter().map(|(left, right)| format!("{left} {right}")).collect();
        BpeVocabulary { tokens, types, merges }
    }

    fn tokenizer(&self, pre: &str) -> Result<Tokenizer> {
        Tokenizer::from_spec(TokenizerSpec {
            model: "gpt2",
            pre: Some(pre),
            tokens: &self.tokens,
            token_types: Some(&self.types),
            scores: None,
            merges: Some(&self.merges),
            bos: None,
            eos: None,
            eot: None,
            eom: None,
            unknown: None,
            add_bos: Some(false),
            add_eos: None,
            add_space_prefix: None,
        })
    }
}

#[test]
fn byte_level_stand_ins_round_trip_every_byte() {
    let mut seen = std::collections::HashSet::new();
    for byte in 0..=255u8 {
        let stand_in = bpe::byte_char(byte);
        assert!(seen.insert(stand_in), "byte {byte:#04x} shares its stand-in");
        assert_eq!(bpe::char_byte(stand_in), Some(byte));
    }
    assert_eq!(bpe::byte_char(b' '), 'Ġ');
    assert_eq!(bpe::byte_char(b'\n'), 'Ċ');
    assert_eq!(bpe::char_byte('\u{144}'), None);
}

#[test]
fn bpe_merges_by_rank_within_words() {
    // Ranks: "Ġ t" first, then "h e", then "Ġt he". " the" is one word (" ?\p{L}+").
    let vocabulary = BpeVocabulary::new(&[("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("t", "h")], &[]);
    let tokenizer = vocabulary.tokenizer("gpt-2").unwrap();
    let the = id(&tokenizer, "Ġthe");
    assert_eq!(tokenizer.encode(" the the", false, false), [the, the]);
    // Without the leading space "the" merges "t h" (rank 3) only after "h e" (rank 1):
    // "t" "he", and no rule joins those.
    assert_eq!(tokenizer.encode("the", false, false), [u32::from(b't'), id(&tokenizer, "he")]);
    assert_eq!(tokenizer.decode(&[the, the], false).unwrap(), " the the");
}

#[test]
fn smollm_pre_tokenizer_splits_digits_and_contractions() {
    let vocabulary = BpeVocabulary::new(&[("1", "2"), ("'", "s"), ("Ġ", "Ġ")], &[]);
    let smollm = vocabulary.tokenizer("smollm").unwrap();
    let gpt2 = vocabulary.tokenizer("gpt-2").unwrap();
    // SmolLM splits every digit before GPT-2's regex runs, so "12" never merges.
    assert_eq!(smollm.encode("12", false, false), [u32::from(b'1'), u32::from(b'2')]);
    assert_eq!(gpt2.encode("12", false, false), [id(&gpt2, "12")]);
    // "'s" is a word of its own; "  x": the first space is a word ("\s+(?!\S)"), the second
    // joins "x", so "Ġ Ġ" cannot merge.
    assert_eq!(smollm.encode("it's", false, false), [u32::from(b'i'), u32::from(b't'), id(&smollm, "'s")]);
    assert_eq!(smollm.encode("  x", false, false), [u32::from(b' '), u32::from(b' '), u32::from(b'x')]);
    assert_eq!(smollm.encode("   ", false, false), [id(&smollm, "ĠĠ"), u32::from(b' ')]);
}

#[test]
fn every_supported_pre_tokenizer_compiles_and_an_unknown_one_is_named() {
    let vocabulary = BpeVocabulary::new(&[], &[]);
    for name in
        ["default", "gpt-2", "gpt2", "smollm", "llama-bpe", "llama3", "qwen2", "dbrx", "falcon", "starcoder"]
    {
        let tokenizer = vocabulary.tokenizer(name).unwrap_or_else(|error| panic!("{name}: {error}"));
        let text = "Hello, world! 12345 it's  \n\n x";
        assert_eq!(tokenizer.decode(&tokenizer.encode(text, false, false), false).unwrap(), text, "{name}");
    }
    let error = vocabulary.tokenizer("klingon-bpe").unwrap_err().to_string();
    assert!(error.contains("unknown pre-tokenizer 'klingon-bpe'") && error.contains("smollm"), "{error}");
}

#[test]
fn llama3_pre_tokenizer_groups_three_digits_and_takes_whole_word_tokens() {
    // "ignore_merges": a word that is a token is taken whole even when no merge rule builds it.
    let mut vocabulary = BpeVocabulary::new(&[("1", "2")], &[]);
    vocabulary.tokens.push("Ġhello".into());
    vocabulary.types.push(1);
    let tokenizer = vocabulary.tokenizer("llama-bpe").unwrap();
    assert_eq!(tokenizer.encode(" hello", false, false), [id(&tokenizer, "Ġhello")]);
    // "1234" is "123" "4"; "123" is "12" "3" after merging.
    assert_eq!(
        tokenizer.encode("1234", false, false),
        [id(&tokenizer, "12"), u32::from(b'3'), u32::from(b'4')]
    );
}

#[test]
fn unknown_tokenizer_models_and_missing_merges_are_errors() {
    let vocabulary = BpeVocabulary::new(&[], &[]);
    let spec = |model, merges| TokenizerSpec {
        model,
        pre: None,
        tokens: &vocabulary.tokens,
        token_types: None,
        scores: None,
        merges,
        bos: None,
        eos: None,
        eot: None,
        eom: None,
        unknown: None,
        add_bos: None,
        add_eos: None,
        add_space_prefix: None,
    };
    let error =
        Tokenizer::from_spec(spec("bert", Some(vocabulary.merges.as_slice()))).unwrap_err().to_string();
    assert!(error.contains("tokenizer 'bert' is not supported"), "{error}");
    let error = Tokenizer::from_spec(spec("gpt2", None)).unwrap_err().to_string();
    assert!(error.contains("tokenizer.ggml.merges") && error.contains("missing"), "{error}");
}

#[test]
fn end_of_turn_is_found_by_text_and_made_a_control_token() {
    let vocabulary = BpeVocabulary::new(&[], &["<|endoftext|>"]);
    let mut tokens = vocabulary.tokens.clone();
    let mut types = vocabulary.types.clone();
    // A chat model whose converter typed <|im_end|> as normal text.
    tokens.push("<|im_end|>".into());
    types.push(1);
    let tokenizer = Tokenizer::from_spec(TokenizerSpec {
        model: "gpt2",
        pre: Some("gpt-2"),
        tokens: &tokens,
        token_types: Some(&types),
        scores: None,
        merges: Some(&vocabulary.merges),
        bos: Some(256),
        eos: Some(256),
        eot: None,
        eom: None,
        unknown: None,
        add_bos: None,
        add_eos: None,
        add_space_prefix: None,
    })
    .unwrap();
    let im_end = id(&tokenizer, "<|im_end|>");
    assert_eq!(tokenizer.eot(), Some(im_end));
    assert_eq!(tokenizer.token_kind(im_end), Some(TokenKind::Control));
    assert_eq!(tokenizer.end_of_generation(), [256, im_end]);
    assert!(tokenizer.is_end_of_generation(im_end) && !tokenizer.is_end_of_generation(0));
    // Now a control token: text when not parsing specials, a token when parsing them.
    assert_eq!(tokenizer.encode("<|im_end|>", false, true), [im_end]);
    assert_eq!(tokenizer.encode("<|im_end|>", false, false).len(), "<|im_end|>".len());
}

#[test]
fn ids_outside_the_vocabulary_are_errors() {
    let vocabulary = SpmVocabulary::new(&[("a", -1.0)], &[]);
    let tokenizer = vocabulary.tokenizer(false);
    let size = tokenizer.vocab_size() as u32;
    let error = tokenizer.decode(&[1, size], false).unwrap_err();
    assert!(matches!(error, Error::TokenOutOfVocabulary { id, .. } if id == size), "{error}");
    let mut detokenizer = Detokenizer::new(false);
    assert!(detokenizer.push(&tokenizer, u32::MAX).is_err());
    // The failed push left nothing behind.
    assert_eq!(detokenizer.push(&tokenizer, id(&tokenizer, "a")).unwrap(), "a");
}

#[test]
fn detokenizer_holds_back_incomplete_characters_and_replaces_invalid_bytes() {
    let vocabulary = SpmVocabulary::new(&[("x", -1.0)], &[]);
    let tokenizer = vocabulary.tokenizer(false);
    let byte = |value: u32| BYTE_BASE + value;
    let x = id(&tokenizer, "x");
    let mut detokenizer = Detokenizer::new(false);
    // 🤖 = F0 9F A4 96, one byte token at a time: nothing until the last byte.
    let pushes: Vec<String> = [x, byte(0xF0), byte(0x9F), byte(0xA4), byte(0x96), x]
        .iter()
        .map(|&id| detokenizer.push(&tokenizer, id).unwrap())
        .collect();
    assert_eq!(pushes, ["x", "", "", "", "🤖", "x"]);
    assert_eq!(detokenizer.finish(), "");

    // A lead byte followed by a non-continuation: U+FFFD as soon as that is certain, then the
    // next character; a stray continuation byte is one U+FFFD; an unfinished end is one U+FFFD.
    let ids = [byte(0xE6), x, byte(0x80), byte(0xF0), byte(0x9F)];
    let pushes: Vec<String> = ids.iter().map(|&id| detokenizer.push(&tokenizer, id).unwrap()).collect();
    assert_eq!(pushes, ["", "\u{FFFD}x", "\u{FFFD}", "", ""]);
    assert_eq!(detokenizer.finish(), "\u{FFFD}");
    assert_eq!(tokenizer.decode(&ids, false).unwrap(), "\u{FFFD}x\u{FFFD}\u{FFFD}");
}

#[test]
fn tokenizers_and_detokenizers_can_be_shared_across_threads() {
    fn shareable<T: Send + Sync>() {}
    shareable::<Tokenizer>();
    shareable::<Detokenizer>();
}
