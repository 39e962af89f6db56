//! What a request's structured-output fields ask for ([`OutputConstraint`]), and the set of
//! tokens a compiled constraint allows next ([`AllowedTokens`]). The compiling is
//! [`crate::grammar`]'s, which depends on this module and not the other way round.

use std::borrow::Cow;

use serde_json::Value;

use crate::sample::SamplingParams;
use crate::{Error, Result};

/// The constraint a request puts on its output: at most one of `json_schema`, `regex` and
/// `grammar` of [`SamplingParams`].
#[derive(Clone, Debug, PartialEq)]
pub enum OutputConstraint<'a> {
    /// A JSON Schema document (an object or a boolean).
    JsonSchema(Cow<'a, Value>),
    /// A regular expression the whole output matches (Rust `regex` syntax, no look-around).
    Regex(&'a str),
    /// A grammar in llguidance's Lark syntax; its `start` rule is the output.
    Grammar(&'a str),
}

impl OutputConstraint<'_> {
    /// The sampling parameter it comes from.
    pub fn field(&self) -> &'static str {
        match self {
            OutputConstraint::JsonSchema(_) => "json_schema",
            OutputConstraint::Regex(_) => "regex",
            OutputConstraint::Grammar(_) => "grammar",
        }
    }
}

impl SamplingParams {
    /// The structured-output constraint, if any: an error when more than one of `json_schema`,
    /// `regex` and `grammar` is given, or when `json_schema` is not a schema document (whether
    /// the constraint compiles is checked by [`crate::grammar::GrammarCompiler::compile`]).
    pub fn output_constraint(&self) -> Result<Option<OutputConstraint<'_>>> {
        let given: Vec<&'static str> = [
            ("json_schema", self.json_schema.is_some()),
            ("regex", self.regex.is_some()),
            ("grammar", self.grammar.is_some()),
        ]
        .iter()
        .filter(|(_, given)| *given)
        .map(|(field, _)| *field)
        .collect();
        if let [first, second, ..] = given[..] {
            return Err(Error::InvalidParameter {
                field: first,
                reason: format!("{first} and {second} are both given; a request takes at most one of them"),
            });
        }
        if let Some(schema) = &self.json_schema {
            let schema = match schema {
                serde_json::Value::String(text) => {
                    Cow::Owned(serde_json::from_str(text).map_err(|e| Error::InvalidParameter {
                        field: "json_schema",
                        reason: format!("the text is not JSON: {e}"),
                    })?)
                }
                value => Cow::Borrowed(value),
            };
            if !(schema.is_object() || schema.is_boolean()) {
                return Err(Error::InvalidParameter {
                    field: "json_schema",
                    reason: "a JSON Schema is an object or a boolean".into(),
                });
            }
            return Ok(Some(OutputConstraint::JsonSchema(schema)));
        }
        Ok(self
            .regex
            .as_deref()
            .map(OutputConstraint::Regex)
            .or(self.grammar.as_deref().map(OutputConstraint::Grammar)))
    }
}

/// The tokens a structured-output constraint allows next: bit `id % 32` of word `id / 32`
/// (llguidance's layout); ids past the words are not allowed.
#[derive(Clone, Copy, Debug)]
pub struct AllowedTokens<'a> {
    words: &'a [u32],
}

impl<'a> AllowedTokens<'a> {
    /// The set whose bits are `words`.
    pub fn new(words: &'a [u32]) -> Self {
        AllowedTokens { words }
    }

    /// Whether `token` is allowed.
    pub fn allows(&self, token: u32) -> bool {
        self.words.get(token as usize / 32).is_some_and(|word| word >> (token % 32) & 1 == 1)
    }
}
