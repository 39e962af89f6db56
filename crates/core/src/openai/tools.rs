//! Tools in OpenAI's chat requests: the functions offered (`tools`), whether the model must call
//! one (`tool_choice`, `parallel_tool_calls`), and what that asks of the prompt, of the output's
//! grammar and of reading the output back ([`ToolUse`]).

use std::collections::HashSet;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::chat::{ToolCallFormat, ToolChoice, ToolFunction};
use crate::error::{Error, Result};
use crate::tokenizer::Tokenizer;

use super::OpenAiRequest;

/// A tool a request offers: `{"type": "function", "function": {...}}`.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Tool {
    /// What kind of tool: `function`, the one kind there is.
    #[serde(rename = "type")]
    pub kind: ToolKind,
    /// The function.
    pub function: FunctionDefinition,
}

/// The kinds of tool: functions.
#[derive(Debug, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolKind {
    /// A function the model calls with JSON arguments.
    Function,
}

/// A function the model may call.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FunctionDefinition {
    /// Its name, which calls give.
    pub name: String,
    /// What it does, which the template shows the model.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The JSON Schema of its arguments; without one, it takes none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parameters: Option<Value>,
    /// OpenAI's strict mode: accepted and ignored, since flint always holds calls to the schema.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub strict: Option<bool>,
}

/// `tool_choice`: `"none"`, `"auto"`, `"required"`, or `{"type": "function", "function":
/// {"name": ...}}`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum ToolChoiceParam {
    /// `none`, `auto` or `required`.
    Mode(String),
    /// A call to this function.
    Named(NamedToolChoice),
}

/// `tool_choice` naming a function.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NamedToolChoice {
    /// `function`.
    #[serde(rename = "type")]
    pub kind: ToolKind,
    /// The function.
    pub function: FunctionName,
}

/// A function's name.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FunctionName {
    /// The name.
    pub name: String,
}

/// What a chat request's tools ask of its prompt, its output and reading its answer.
#[derive(Debug, Default)]
pub struct ToolUse {
    /// The tools as the chat template takes them (as the request gave them).
    pub tools: Vec<Value>,
    /// The grammar the output follows (llguidance's Lark), when calls are possible.
    pub grammar: Option<String>,
    /// How to read calls out of the output, when the model may make some.
    pub format: Option<ToolCallFormat>,
}

impl OpenAiRequest {
    /// What the request's tools ask for, on a model whose chat template writes calls in
    /// `format` (`None`: its template renders no tools) with `tokenizer`. Errors name the field
    /// at fault: a function named twice or without a valid schema, a `tool_choice` naming a
    /// function not offered, tools on a template without them, tools with `response_format`.
    pub fn tool_use(&self, format: Option<ToolCallFormat>, tokenizer: &Tokenizer) -> Result<ToolUse> {
        let tools = self.tools.as_deref().unwrap_or_default();
        let choice = self.tool_choice()?;
        let invalid = |field: &'static str, reason: String| Error::InvalidParameter { field, reason };
        if tools.is_empty() {
            return match choice {
                ToolChoice::None | ToolChoice::Auto => Ok(ToolUse::default()),
                _ => Err(invalid("tool_choice", "calls need 'tools' to call".into())),
            };
        }
        let mut functions = Vec::with_capacity(tools.len());
        let mut names = HashSet::new();
        for tool in tools {
            let function = &tool.function;
            if function.name.is_empty() || !names.insert(function.name.as_str()) {
                let reason = format!("each function needs a name of its own; '{}' is not one", function.name);
                return Err(invalid("tools", reason));
            }
            let parameters = match &function.parameters {
                None => json!({"type": "object", "properties": {}, "additionalProperties": false}),
                Some(schema @ Value::Object(_)) => schema.clone(),
                Some(_) => {
                    let reason =
                        format!("the parameters of '{}' are not a JSON Schema object", function.name);
                    return Err(invalid("tools", reason));
                }
            };
            functions.push(ToolFunction { name: function.name.clone(), parameters });
        }
        let rendered = tools.iter().map(|tool| serde_json::to_value(tool).unwrap_or_default()).collect();
        if choice == ToolChoice::None {
            return Ok(ToolUse { tools: rendered, grammar: None, format: None });
        }
        let Some(format) = format else {
            return Err(invalid(
                "tools",
                "this model's chat template does not render tools; give the model a template that does"
                    .into(),
            ));
        };
        if self.response_format.as_ref().and_then(|format| format.json_schema()).is_some() {
            return Err(invalid(
                "response_format",
                "a JSON response_format cannot be combined with tools (unless tool_choice is 'none')".into(),
            ));
        }
        if let ToolChoice::Function(name) = &choice {
            if !names.contains(name.as_str()) {
                return Err(invalid(
                    "tool_choice",
                    format!("it names '{name}', which 'tools' does not offer"),
                ));
            }
            functions.retain(|function| &function.name == name);
        }
        let parallel = self.parallel_tool_calls.unwrap_or(true);
        let grammar = format.grammar(&functions, &choice, parallel, tokenizer);
        Ok(ToolUse { tools: rendered, grammar, format: Some(format) })
    }

    /// `tool_choice`; `auto` when not given.
    fn tool_choice(&self) -> Result<ToolChoice> {
        match &self.tool_choice {
            None => Ok(ToolChoice::Auto),
            Some(ToolChoiceParam::Mode(mode)) => match mode.as_str() {
                "none" => Ok(ToolChoice::None),
                "auto" => Ok(ToolChoice::Auto),
                "required" => Ok(ToolChoice::Required),
                other => Err(Error::InvalidParameter {
                    field: "tool_choice",
                    reason: format!("'{other}' is not one of 'none', 'auto', 'required' or a named function"),
                }),
            },
            Some(ToolChoiceParam::Named(named)) => Ok(ToolChoice::Function(named.function.name.clone())),
        }
    }
}
