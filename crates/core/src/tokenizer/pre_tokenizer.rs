//! Pre-tokenizers of byte-level BPE: the regexes that cut text into words before merging,
//! chosen by `tokenizer.ggml.pre` as llama.cpp chooses them (`llm_tokenizer_bpe` in
//! `llama-vocab.cpp`; the regex strings are llama.cpp's, character for character).
//!
//! Several regexes are applied in turn, each to every piece the previous one left: the
//! matches and the text between them both become pieces (`unicode_regex_split`). llama.cpp
//! runs the GPT-2 and Llama 3 regexes through hand-written matchers; on assigned code points
//! they agree with the regexes run here (its matcher splits off unassigned code points one by
//! one where the regex keeps them with neighbouring symbols).

use std::ops::Range;

use fancy_regex::Regex;

use crate::{Error, Result};

/// GPT-2's regex (without the final `|\s+`: llama.cpp's list lacks it, and a lone whitespace
/// character before a word then falls between matches and becomes a piece of its own, the
/// same split).
const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";

/// Llama 3's regex with its case-insensitive contractions spelled out.
const LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Qwen 2's regex: Llama 3's with single digits.
const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// One family of `tokenizer.ggml.pre` names: its regexes and the flags llama.cpp sets with them.
struct PreTokenizerFamily {
    /// The `tokenizer.ggml.pre` values of this family.
    names: &'static [&'static str],
    /// Applied in order.
    regexes: &'static [&'static str],
    /// A word that is a whole token is taken as is, without merging (Llama 3's tokenizer).
    ignore_merges: bool,
    /// Whether a BOS token is added when `tokenizer.ggml.add_bos_token` does not say.
    add_bos: bool,
}

const FAMILIES: &[PreTokenizerFamily] = &[
    PreTokenizerFamily {
        names: &["default"],
        regexes: &[r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", "[0-9][0-9][0-9]"],
        ignore_merges: false,
        add_bos: false,
    },
    PreTokenizerFamily {
        // "gpt2" is not a llama.cpp name; it is accepted as the obvious spelling of "gpt-2".
        names: &["gpt-2", "gpt2", "phi-2", "mpt", "olmo", "jais", "exaone4"],
        regexes: &[GPT2],
        ignore_merges: false,
        add_bos: false,
    },
    PreTokenizerFamily {
        names: &["smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b"],
        regexes: &[r"\p{N}", GPT2],
        ignore_merges: false,
        add_bos: false,
    },
    PreTokenizerFamily {
        names: &["llama3", "llama-v3", "llama-bpe", "falcon3", "pixtral"],
        regexes: &[LLAMA3],
        ignore_merges: true,
        add_bos: true,
    },
    PreTokenizerFamily {
        names: &["dbrx", "smaug-bpe"],
        regexes: &[LLAMA3],
        ignore_merges: false,
        add_bos: false,
    },
    PreTokenizerFamily {
        names: &["qwen2", "deepseek-r1-qwen", "megrez", "stablelm2"],
        regexes: &[QWEN2],
        ignore_merges: false,
        add_bos: false,
    },
    PreTokenizerFamily {
        names: &["falcon"],
        regexes: &[r"[\p{P}\$\+<=>\^~\|`]+", GPT2, "[0-9][0-9][0-9]"],
        ignore_merges: false,
        add_bos: false,
    },
];

/// The word splitter of a byte-level BPE tokenizer.
pub(crate) struct PreTokenizer {
    regexes: Vec<Regex>,
    /// See [`PreTokenizerFamily::ignore_merges`].
    pub(crate) ignore_merges: bool,
    /// See [`PreTokenizerFamily::add_bos`].
    pub(crate) add_bos: bool,
}

impl PreTokenizer {
    /// The pre-tokenizer `tokenizer.ggml.pre` names; a missing or empty name means "default",
    /// as in llama.cpp. An unknown name is an error that lists the known ones.
    pub(crate) fn named(name: Option<&str>) -> Result<Self> {
        let name = name.filter(|name| !name.is_empty()).unwrap_or("default");
        let family = FAMILIES.iter().find(|family| family.names.contains(&name)).ok_or_else(|| {
            let known: Vec<&str> = FAMILIES.iter().flat_map(|family| family.names.iter().copied()).collect();
            Error::Gguf {
                context: "metadata key 'tokenizer.ggml.pre'".into(),
                reason: format!(
                    "unknown pre-tokenizer '{name}'; flint knows {} (a model converted with another \
                     pre-tokenizer needs its regexes added in tokenizer/pre_tokenizer.rs)",
                    known.join(", ")
                ),
            }
        })?;
        let regexes = family
            .regexes
            .iter()
            .map(|pattern| {
                Regex::new(pattern).map_err(|error| Error::Gguf {
                    context: "metadata key 'tokenizer.ggml.pre'".into(),
                    reason: format!("regex {pattern:?} of pre-tokenizer '{name}' does not compile: {error}"),
                })
            })
            .collect::<Result<_>>()?;
        Ok(PreTokenizer { regexes, ignore_merges: family.ignore_merges, add_bos: family.add_bos })
    }

    /// Cuts `text` into words: byte ranges that tile it, in order.
    pub(crate) fn split(&self, text: &str) -> Vec<Range<usize>> {
        let whole_text = 0..text.len();
        let mut pieces = Vec::from([whole_text]);
        for regex in &self.regexes {
            let mut next = Vec::with_capacity(pieces.len());
            for piece in pieces {
                split_piece(regex, text, piece, &mut next);
            }
            pieces = next;
        }
        pieces
    }
}

/// Splits one piece by one regex: matches and the gaps between them, in order. The regex sees
/// the piece alone, so look-ahead stops at its end, as in llama.cpp.
fn split_piece(regex: &Regex, text: &str, piece: Range<usize>, out: &mut Vec<Range<usize>>) {
    let base = piece.start;
    let mut done = 0;
    for found in regex.find_iter(&text[piece.clone()]) {
        // An error means the backtracking limit was hit on pathological input: the rest of
        // the piece stays whole rather than failing the whole encode.
        let Ok(found) = found else { break };
        if found.start() > done {
            out.push(base + done..base + found.start());
        }
        if found.end() > found.start() {
            out.push(base + found.start()..base + found.end());
        }
        done = found.end();
    }
    if done < piece.len() {
        out.push(base + done..piece.end);
    }
}
