//! Structured output: a JSON Schema, a regular expression or a Lark grammar that a request's
//! output must match, enforced token by token with [llguidance].
//!
//! A [`GrammarCompiler`] is made once per engine from the model's tokenizer: it gives
//! llguidance the bytes every token id stands for (special tokens marked as llguidance expects)
//! and the end-of-generation tokens. It compiles a request's constraint before anything is
//! queued, so a bad schema or pattern is an error naming its field. Each constrained sequence
//! then owns a [`TokenConstraint`]: before a token is drawn, the set of tokens that keep the
//! output inside the grammar; after, the token is committed and the constraint says whether
//! the grammar is complete (the sequence then ends with `stop`).
//!
//! llguidance builds for wasm32 too (without its `referencing` feature, whose hashing needs
//! OS randomness), so structured output is there in the browser as well.

use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{ApproximateTokEnv, SimpleVob, TokEnv, TokRxInfo, TokTrie};
use llguidance::{Matcher, ParserFactory};
use serde_json::Value;

use crate::sample::{AllowedTokens, OutputConstraint, SamplingParams};
use crate::tokenizer::{TokenId, TokenKind, Tokenizer};
use crate::{Error, Result};

/// The separators of JSON output when the schema does not choose its own (through
/// llguidance's `x-guidance` key): one space after `,` and `:` and no other whitespace, so a
/// small model cannot spend its tokens on runs of blank lines and leave the JSON unfinished.
pub(crate) const JSON_LAYOUT: &str =
    r#"{"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "}"#;

/// Compiles constraints for one model's tokenizer.
pub struct GrammarCompiler {
    factory: ParserFactory,
}

impl GrammarCompiler {
    /// A compiler for `tokenizer`'s tokens, for a model whose logits rows are `vocab_size` wide
    /// (ids past the tokenizer's vocabulary are never allowed). The tokenizer must have an
    /// end-of-generation token: the grammar's end is where the model may stop.
    pub fn new(tokenizer: &Tokenizer, vocab_size: usize) -> Result<Self> {
        let unavailable = Error::Constraint;
        let &[first_end, ..] = tokenizer.end_of_generation() else {
            return Err(unavailable(
                "structured output needs an end-of-generation token, and this model's tokenizer has none"
                    .into(),
            ));
        };
        let words: Vec<Vec<u8>> = (0..vocab_size).map(|id| token_bytes(tokenizer, id as TokenId)).collect();
        let vocab = u32::try_from(vocab_size)
            .map_err(|_| unavailable(format!("a vocabulary of {vocab_size} tokens is too large")))?;
        let info = TokRxInfo::new(vocab, first_end);
        let trie = TokTrie::from(&info, &words).with_eos_tokens(tokenizer.end_of_generation());
        // Tokenizing text is only needed to force tokens, which flint does not do: the trie's
        // greedy tokenization (not canonical, so llguidance never relies on it) is enough.
        let env: TokEnv = Arc::new(ApproximateTokEnv::new(trie));
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| unavailable(e.to_string()))?;
        factory.quiet();
        Ok(GrammarCompiler { factory })
    }

    /// Compiles `params`' constraint, if it has one: `Ok(None)` when it has none, an error naming
    /// the field and what is wrong when it does not compile.
    pub fn compile(&self, params: &SamplingParams) -> Result<Option<TokenConstraint>> {
        let Some(constraint) = params.output_constraint()? else { return Ok(None) };
        let field = constraint.field();
        let grammar = match constraint {
            OutputConstraint::JsonSchema(schema) => {
                TopLevelGrammar::from_json_schema(with_json_layout(schema.into_owned()))
            }
            OutputConstraint::Regex(pattern) => TopLevelGrammar::from_regex(pattern),
            OutputConstraint::Grammar(lark) => TopLevelGrammar::from_lark(lark.to_string()),
        };
        let matcher = Matcher::new(self.factory.create_parser(grammar));
        if let Some(reason) = matcher.get_error() {
            return Err(Error::InvalidParameter { field, reason: format!("it does not compile: {reason}") });
        }
        Ok(Some(TokenConstraint { matcher, mask: None }))
    }
}

/// `schema` with flint's JSON layout, unless it sets its own `x-guidance` options.
fn with_json_layout(mut schema: Value) -> Value {
    if let Value::Object(fields) = &mut schema
        && !fields.contains_key("x-guidance")
        && let Ok(layout) = serde_json::from_str(JSON_LAYOUT)
    {
        fields.insert("x-guidance".into(), layout);
    }
    schema
}

/// The bytes token `id` stands for in generated text, as llguidance wants them: special tokens
/// (control, unknown) as the marker byte 0xFF then their text, so that no text matches them;
/// tokens that never appear in text (unused, undefined, ids past the vocabulary) as nothing.
fn token_bytes(tokenizer: &Tokenizer, id: TokenId) -> Vec<u8> {
    let (Some(kind), Some(text)) = (tokenizer.token_kind(id), tokenizer.token_text(id)) else {
        return Vec::new();
    };
    match kind {
        TokenKind::Control | TokenKind::Unknown => {
            let mut bytes = vec![TokTrie::SPECIAL_TOKEN_MARKER];
            bytes.extend_from_slice(text.as_bytes());
            bytes
        }
        TokenKind::Unused | TokenKind::Undefined => Vec::new(),
        TokenKind::Normal | TokenKind::UserDefined | TokenKind::Byte => {
            let mut bytes = Vec::new();
            // In the vocabulary, so the piece is there: an error cannot happen.
            let _ = tokenizer.append_piece(id, false, false, &mut bytes);
            bytes
        }
    }
}

/// One sequence's progress through its grammar.
pub struct TokenConstraint {
    matcher: Matcher,
    /// The tokens allowed next, once computed for the current state.
    mask: Option<SimpleVob>,
}

impl TokenConstraint {
    /// An independent copy for another sample of the same request, in the same state.
    pub fn fork(&self) -> Self {
        TokenConstraint { matcher: self.matcher.deep_clone(), mask: self.mask.clone() }
    }

    /// Computes the tokens allowed next, if not done since the last commit. This is the costly
    /// part (up to a millisecond or so): the engine does it while the GPU runs the step. A
    /// grammar with no token left to allow is an error.
    pub fn compute_mask(&mut self) -> Result<()> {
        if self.mask.is_some() {
            return Ok(());
        }
        let mask = self.matcher.compute_mask().map_err(|e| Error::Constraint(e.to_string()))?;
        if mask.is_zero() {
            return Err(Error::Constraint(
                "the grammar allows no next token (the vocabulary cannot spell what it requires)".into(),
            ));
        }
        self.mask = Some(mask);
        Ok(())
    }

    /// The tokens allowed next, computed now if need be.
    pub fn allowed(&mut self) -> Result<AllowedTokens<'_>> {
        self.compute_mask()?;
        match &self.mask {
            Some(mask) => Ok(AllowedTokens::new(mask.as_slice())),
            None => Err(Error::Constraint("the allowed tokens were not computed".into())),
        }
    }

    /// Advances the grammar over `token` (drawn from the allowed ones). Returns whether the
    /// grammar is now complete: it allows nothing more, or `token` ended the output at one of
    /// its accepting states.
    pub fn commit(&mut self, token: TokenId) -> Result<bool> {
        self.mask = None;
        self.matcher.consume_token(token).map_err(|e| Error::Constraint(e.to_string()))?;
        Ok(self.matcher.is_stopped())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A byte-level vocabulary: 0 <unk>, 1 <s>, 2 </s>, 256 byte tokens, then a few words.
    fn tokenizer() -> Tokenizer {
        let words = ["yes", "no", "maybe", "▁yes", "{\"", "\":"];
        crate::tokenizer::testing::byte_level(&["<unk>", "<s>", "</s>"], &words, Some(1), 2)
    }

    fn allowed_texts(tokenizer: &Tokenizer, constraint: &mut TokenConstraint) -> Vec<String> {
        let allowed = constraint.allowed().unwrap();
        (0..tokenizer.vocab_size() as u32)
            .filter(|&id| allowed.allows(id))
            .map(|id| tokenizer.token_text(id).unwrap().to_string())
            .collect()
    }

    #[test]
    fn a_grammar_of_words_allows_only_their_tokens_and_ends_after_one() {
        let tokenizer = tokenizer();
        let compiler = GrammarCompiler::new(&tokenizer, tokenizer.vocab_size() + 3).unwrap();
        let params = SamplingParams { grammar: Some(r#"start: "yes" | "no""#.into()), ..Default::default() };
        let mut constraint = compiler.compile(&params).unwrap().unwrap();
        let first = allowed_texts(&tokenizer, &mut constraint);
        assert_eq!(first, ["<0x6E>", "<0x79>", "yes", "no"]);
        let yes = tokenizer.token_id("yes").unwrap();
        assert!(constraint.commit(yes).unwrap(), "nothing can follow 'yes'");
    }

    #[test]
    fn a_regex_ends_at_end_of_generation_when_it_may() {
        let tokenizer = tokenizer();
        let compiler = GrammarCompiler::new(&tokenizer, tokenizer.vocab_size()).unwrap();
        let params = SamplingParams { regex: Some("(yes)+".into()), ..Default::default() };
        let mut constraint = compiler.compile(&params).unwrap().unwrap();
        let yes = tokenizer.token_id("yes").unwrap();
        assert!(!constraint.allowed().unwrap().allows(2), "</s> before any 'yes'");
        assert!(!constraint.commit(yes).unwrap());
        let after = constraint.allowed().unwrap();
        assert!(after.allows(2) && after.allows(yes) && !after.allows(tokenizer.token_id("no").unwrap()));
        assert!(constraint.commit(2).unwrap(), "</s> ends the output");
    }

    #[test]
    fn json_schema_output_is_laid_out_with_single_spaces() {
        let tokenizer = tokenizer();
        let compiler = GrammarCompiler::new(&tokenizer, tokenizer.vocab_size()).unwrap();
        let schema = serde_json::json!({"type": "object", "properties": {"a": {"type": "integer"}},
            "required": ["a"], "additionalProperties": false});
        let params = SamplingParams { json_schema: Some(schema), ..Default::default() };
        let mut constraint = compiler.compile(&params).unwrap().unwrap();
        let space = tokenizer.token_id("<0x20>").unwrap();
        // `{"a": 7}`: a space only after the colon.
        for text in ["{\"", "<0x61>", "\":", "<0x20>", "<0x37>", "<0x7D>"] {
            let id = tokenizer.token_id(text).unwrap();
            let allowed = constraint.allowed().unwrap();
            assert!(allowed.allows(id), "{text} is allowed");
            assert_eq!(allowed.allows(space), text == "<0x20>", "a space where {text} goes");
            constraint.commit(id).unwrap();
        }
    }

    #[test]
    fn bad_constraints_are_errors_naming_their_field() {
        let tokenizer = tokenizer();
        let compiler = GrammarCompiler::new(&tokenizer, tokenizer.vocab_size()).unwrap();
        let bad = [
            SamplingParams { regex: Some("(unclosed".into()), ..Default::default() },
            SamplingParams { grammar: Some("start: undefined_rule".into()), ..Default::default() },
            SamplingParams {
                json_schema: Some(serde_json::json!({"type": "object", "minProperties": "two"})),
                ..Default::default()
            },
        ];
        for (params, field) in bad.iter().zip(["regex", "grammar", "json_schema"]) {
            let error = compiler.compile(params).err().unwrap().to_string();
            assert!(error.contains(field), "{error}");
        }
        let none = SamplingParams::default();
        assert!(compiler.compile(&none).unwrap().is_none());
    }
}
