//! Tool calls: how each chat family writes a call to a function that a request offers, the
//! grammar that makes a model write one validly (its arguments valid against the function's
//! JSON Schema), and the parser that reads calls back out of the output, whole or as it streams.
//!
//! The family is read from the chat template ([`ToolCallFormat::of_template`]): a template that
//! renders tools shows the syntax it taught the model.
//!
//! ```
//! use flint_core::chat::ToolCallFormat;
//!
//! let text = "Let me look.<tool_call>\n{\"name\": \"weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
//! let reply = ToolCallFormat::Hermes.parse(text);
//! assert_eq!(reply.content, "Let me look.");
//! assert_eq!((reply.calls[0].name.as_str(), reply.calls[0].arguments.as_str()), ("weather", r#"{"city": "Paris"}"#));
//! ```

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::grammar::JSON_LAYOUT;
use crate::tokenizer::{TokenKind, Tokenizer};

/// How a chat family writes tool calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolCallFormat {
    /// Hermes and Qwen: any text, then `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`
    /// for each call, one per line.
    Hermes,
    /// Llama 3.1 and later: the whole answer is `{"name": ..., "parameters": {...}}` (after
    /// `<|python_tag|>` when the model writes one).
    Llama3,
    /// Mistral: the whole answer is `[TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]`.
    Mistral,
    /// Any other template that renders tools: the whole answer is
    /// `{"name": ..., "arguments": {...}}`.
    Json,
}

/// Which format a template shows, the first match winning: (text in the template's source,
/// format). A template that mentions `tools` but none of these gets [`ToolCallFormat::Json`].
const FORMATS: &[(&str, ToolCallFormat)] = &[
    ("<tool_call>", ToolCallFormat::Hermes),
    ("[TOOL_CALLS]", ToolCallFormat::Mistral),
    ("<|python_tag|>", ToolCallFormat::Llama3),
    ("ipython", ToolCallFormat::Llama3),
];

/// Any text, in Lark. A text that must not match a pattern is this and `~/pattern/`: the
/// complement alone would also match bytes that are not UTF-8, among them control tokens.
const ANY_TEXT: &str = r"/(.|\n)*/";

/// The texts that open calls, in any format; between calls they are skipped like separators.
const MARKERS: &[&str] = &["<tool_call>", "</tool_call>", "[TOOL_CALLS]", "<|python_tag|>"];

/// A function a request offers the model.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolFunction {
    /// Its name, which calls give.
    pub name: String,
    /// The JSON Schema its arguments must be valid against.
    pub parameters: Value,
}

/// Whether the model may, must or must not call a function.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToolChoice {
    /// Never call: the output is text.
    None,
    /// Text, or calls: the model decides; a call it starts is constrained to completion.
    Auto,
    /// At least one call, to any of the functions.
    Required,
    /// A call to the function of this name.
    Function(String),
}

/// A call in a conversation's history: an assistant's earlier call, which the template renders
/// back (its arguments as the JSON object templates expect, when they are one).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolCall {
    /// The call's id, which the tool's answer names (`tool_call_id`).
    pub id: String,
    /// The function called.
    pub name: String,
    /// Its arguments, as JSON text.
    pub arguments: String,
}

/// A call as OpenAI writes it in a message: `{"id", "type": "function", "function": {"name",
/// "arguments"}}`.
#[derive(Serialize, Deserialize)]
struct WireToolCall {
    id: String,
    #[serde(rename = "type")]
    kind: String,
    function: WireFunction,
}

#[derive(Serialize, Deserialize)]
struct WireFunction {
    name: String,
    arguments: Value,
}

impl Serialize for ToolCall {
    /// Arguments that are a JSON object are given as the object (templates write them with
    /// `tojson`); others as their text.
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let arguments = serde_json::from_str::<Value>(&self.arguments)
            .ok()
            .filter(Value::is_object)
            .unwrap_or_else(|| Value::String(self.arguments.clone()));
        let function = WireFunction { name: self.name.clone(), arguments };
        WireToolCall { id: self.id.clone(), kind: "function".into(), function }.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for ToolCall {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let wire = WireToolCall::deserialize(deserializer)?;
        let arguments = match wire.function.arguments {
            Value::String(text) => text,
            other => other.to_string(),
        };
        Ok(ToolCall { id: wire.id, name: wire.function.name, arguments })
    }
}

/// A call read from a model's output.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParsedCall {
    /// The function called.
    pub name: String,
    /// Its arguments as the model wrote them (JSON text).
    pub arguments: String,
}

/// A whole output read as text and calls.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ParsedReply {
    /// The text that is not calls.
    pub content: String,
    /// The calls, in order.
    pub calls: Vec<ParsedCall>,
}

impl ParsedReply {
    /// Adds what `event` says: its text to the content, a new call, or more of a call's
    /// arguments. Folding a parser's events in order gives [`ToolCallFormat::parse`]'s reply.
    pub fn add(&mut self, event: ToolCallEvent) {
        match event {
            ToolCallEvent::Content(text) => self.content.push_str(&text),
            ToolCallEvent::Call { name, .. } => {
                self.calls.push(ParsedCall { name, arguments: String::new() })
            }
            ToolCallEvent::Arguments { index, fragment } => {
                if let Some(call) = self.calls.get_mut(index) {
                    call.arguments.push_str(&fragment);
                }
            }
        }
    }
}

/// What a stretch of streamed output says, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToolCallEvent {
    /// Text that is not a call.
    Content(String),
    /// A call starts: the `index`-th of the output, to the function `name`.
    Call {
        /// The call's position among the output's calls.
        index: usize,
        /// The function called.
        name: String,
    },
    /// More of call `index`'s arguments (the fragments concatenate to their JSON text).
    Arguments {
        /// The call's position among the output's calls.
        index: usize,
        /// The next bytes of the arguments' JSON text.
        fragment: String,
    },
}

impl ToolCallFormat {
    /// The format `template_source` teaches, or `None` when the template does not render tools.
    pub fn of_template(template_source: &str) -> Option<ToolCallFormat> {
        let format =
            FORMATS.iter().find(|(mark, _)| template_source.contains(mark)).map(|&(_, format)| format);
        format.or_else(|| template_source.contains("tools").then_some(ToolCallFormat::Json))
    }

    /// The key of a call's arguments.
    fn arguments_key(self) -> &'static str {
        match self {
            ToolCallFormat::Llama3 => "parameters",
            _ => "arguments",
        }
    }

    /// The grammar (llguidance's Lark syntax) that `choice` puts on the output, or `None` when
    /// it puts none (`ToolChoice::None`). `tools` are those the choice allows (the named one
    /// alone for [`ToolChoice::Function`]); without `parallel`, at most one call. Markers that
    /// `tokenizer` has as control tokens are those tokens, not their text.
    pub fn grammar(
        self,
        tools: &[ToolFunction],
        choice: &ToolChoice,
        parallel: bool,
        tokenizer: &Tokenizer,
    ) -> Option<String> {
        let forced = match choice {
            ToolChoice::None => return None,
            ToolChoice::Auto => false,
            ToolChoice::Required | ToolChoice::Function(_) => true,
        };
        let call = format!("call: %json {}", self.call_schema(tools));
        let repeat = |call: &str| if parallel { format!("({call})*") } else { String::new() };
        let rules = match self {
            ToolCallFormat::Hermes => {
                let (open, open_is_token) = marker("<tool_call>", tokenizer);
                let one = format!(r#"{open} "\n" call "\n</tool_call>""#);
                let calls =
                    format!(r#"calls: "\n" call "\n</tool_call>" {}"#, repeat(&format!(r#""\n" {one}"#)));
                let start = match (forced, open_is_token) {
                    (true, _) => format!("start: {open} calls"),
                    // Text never holds a control token: a text, then perhaps the token.
                    (false, true) => format!("start: TEXT? | TEXT? {open} calls\nTEXT: /(.|\\n)+/"),
                    // Text that never holds the marker; the shortest text that ends with it
                    // opens the calls.
                    (false, false) => format!(
                        "start: TEXT | opening calls\nTEXT: {ANY_TEXT} & ~/(.|\\n)*{0}(.|\\n)*/\nopening[lazy]: /(.|\\n)*{0}/",
                        regex_escape("<tool_call>")
                    ),
                };
                format!("{start}\n{calls}")
            }
            ToolCallFormat::Mistral => {
                let (open, open_is_token) = marker("[TOOL_CALLS]", tokenizer);
                let calls = format!(r#"calls: {open} " [" call {} "]""#, repeat(r#"", " call"#));
                let start = match (forced, open_is_token) {
                    (true, _) => "start: calls".to_string(),
                    (false, true) => "start: TEXT? | calls\nTEXT: /(.|\\n)+/".to_string(),
                    (false, false) => {
                        format!(
                            "start: TEXT | calls\nTEXT: {ANY_TEXT} & ~/{}(.|\\n)*/",
                            regex_escape("[TOOL_CALLS]")
                        )
                    }
                };
                format!("{start}\n{calls}")
            }
            // One call as the whole answer; a text answer does not start like JSON.
            ToolCallFormat::Llama3 | ToolCallFormat::Json => match forced {
                true => "start: call".to_string(),
                false => format!("start: TEXT | call\nTEXT: {ANY_TEXT} & ~/[ \\t\\r\\n]*[\\[{{](.|\\n)*/"),
            },
        };
        Some(format!("{rules}\n{call}\n"))
    }

    /// The JSON Schema of one call to any of `tools`: its name, and arguments valid against the
    /// function's parameters; laid out as other JSON output is.
    fn call_schema(self, tools: &[ToolFunction]) -> Value {
        let key = self.arguments_key();
        let mut variants: Vec<Value> = tools
            .iter()
            .map(|tool| {
                json!({
                    "type": "object",
                    "properties": {"name": {"const": tool.name}, key: tool.parameters},
                    "required": ["name", key],
                    "additionalProperties": false,
                })
            })
            .collect();
        let mut schema = if variants.len() == 1 { variants.remove(0) } else { json!({"anyOf": variants}) };
        if let (Value::Object(fields), Ok(layout)) = (&mut schema, serde_json::from_str::<Value>(JSON_LAYOUT))
        {
            fields.insert("x-guidance".into(), layout);
        }
        schema
    }

    /// A parser of this format's output as it streams.
    pub fn parser(self) -> ToolCallParser {
        ToolCallParser {
            format: self,
            text: String::new(),
            consumed: 0,
            phase: Phase::Opening,
            calls: Vec::new(),
            open_call: None,
        }
    }

    /// `text`, a whole output, as text and calls: what a [`ToolCallParser`] fed all of it says.
    pub fn parse(self, text: &str) -> ParsedReply {
        let mut parser = self.parser();
        let mut reply = ParsedReply::default();
        parser.push(text).into_iter().chain(parser.finish()).for_each(|event| reply.add(event));
        reply
    }
}

/// `text` in a grammar: the control token `<[id]>` when the tokenizer has it as one (with
/// whether it is), else the literal text.
fn marker(text: &str, tokenizer: &Tokenizer) -> (String, bool) {
    match tokenizer.token_id(text) {
        Some(id) if matches!(tokenizer.token_kind(id), Some(TokenKind::Control)) => {
            (format!("<[{id}]>"), true)
        }
        _ => (Value::from(text).to_string(), false),
    }
}

/// `text` as a regular expression that matches it literally, inside Lark's `/.../`.
fn regex_escape(text: &str) -> String {
    let mut escaped = String::new();
    for character in text.chars() {
        if "\\.+*?()|[]{}^$#&-~/".contains(character) {
            escaped.push('\\');
        }
        escaped.push(character);
    }
    escaped
}

/// Where a [`ToolCallParser`] is in the output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Before any call: text, or the start of the calls.
    Opening,
    /// Among the calls.
    Calls,
    /// Text to the end (what follows is not a call).
    Text,
}

/// Reads an output's text and calls as it streams: [`ToolCallParser::push`] each new piece of
/// text, [`ToolCallParser::finish`] at the end. Text that may be the start of a call is held
/// back until it is known; a call's name is given once whole, its arguments as they come.
#[derive(Clone, Debug)]
pub struct ToolCallParser {
    format: ToolCallFormat,
    /// The output so far.
    text: String,
    /// The bytes of `text` read: given as content, or as calls whole.
    consumed: usize,
    phase: Phase,
    /// For each call given, how many bytes of its arguments were.
    calls: Vec<usize>,
    /// The call being read, once its name was given.
    open_call: Option<usize>,
}

impl ToolCallParser {
    /// Reads `piece`, the output's next text: what it says that is now known.
    pub fn push(&mut self, piece: &str) -> Vec<ToolCallEvent> {
        self.text.push_str(piece);
        let mut events = Vec::new();
        self.advance(false, &mut events);
        events
    }

    /// The output has ended: what the text held back says.
    pub fn finish(&mut self) -> Vec<ToolCallEvent> {
        let mut events = Vec::new();
        self.advance(true, &mut events);
        events
    }

    /// Whether a call has been given.
    pub fn has_calls(&self) -> bool {
        !self.calls.is_empty()
    }

    fn advance(&mut self, ended: bool, events: &mut Vec<ToolCallEvent>) {
        loop {
            let rest = &self.text[self.consumed..];
            match self.phase {
                Phase::Text => {
                    push_content(events, rest);
                    self.consumed = self.text.len();
                    return;
                }
                Phase::Opening if self.format == ToolCallFormat::Hermes => {
                    if let Some(at) = rest.find("<tool_call>") {
                        push_content(events, &rest[..at]);
                        self.consumed += at;
                        self.phase = Phase::Calls;
                        continue;
                    }
                    let held = if ended { 0 } else { partial_marker_len(rest, "<tool_call>") };
                    push_content(events, &rest[..rest.len() - held]);
                    self.consumed += rest.len() - held;
                    return;
                }
                Phase::Opening => {
                    // The other formats call from the answer's start.
                    let start = rest.trim_start();
                    if start.starts_with(['{', '[']) || MARKERS.iter().any(|m| start.starts_with(m)) {
                        self.phase = Phase::Calls;
                    } else if !ended && (start.is_empty() || MARKERS.iter().any(|m| m.starts_with(start))) {
                        return;
                    } else {
                        self.phase = Phase::Text;
                    }
                }
                Phase::Calls => {
                    let skipped = separators_len(rest, ended);
                    let after = &rest[skipped..];
                    if after.is_empty() || (!ended && MARKERS.iter().any(|m| m.starts_with(after))) {
                        // More separators may come; at the end they are nothing.
                        if ended {
                            self.consumed = self.text.len();
                        }
                        return;
                    }
                    if !after.starts_with('{') {
                        self.consumed += skipped;
                        self.phase = Phase::Text;
                        continue;
                    }
                    let scan = scan_call(after);
                    let object_start = self.consumed + skipped;
                    let object = &self.text[object_start..];
                    if let (Some(name), None) = (&scan.name, self.open_call) {
                        self.calls.push(0);
                        self.open_call = Some(self.calls.len() - 1);
                        events.push(ToolCallEvent::Call { index: self.calls.len() - 1, name: name.clone() });
                    }
                    if let Some(index) = self.open_call {
                        self.calls[index] = give_arguments(&scan, object, index, self.calls[index], events);
                    }
                    let not_a_call = match (scan.invalid_at, scan.end) {
                        // A call whose name was given ends where the text stops being one.
                        (Some(at), _) if self.open_call.is_some() => Some(object_start + at),
                        (Some(_), _) | (None, Some(_)) if self.open_call.is_none() => Some(object_start),
                        _ => None,
                    };
                    if let Some(text_start) = not_a_call {
                        // Text from here on.
                        self.open_call = None;
                        self.consumed = text_start;
                        self.phase = Phase::Text;
                        continue;
                    }
                    match scan.end {
                        Some(end) => {
                            self.consumed = object_start + end;
                            self.open_call = None;
                        }
                        None => return,
                    }
                }
            }
        }
    }
}

/// Gives what is new of a call's arguments, `given` bytes of which were given before, from
/// `scan` of `object` (the text from the call's opening brace). Returns how many are given now.
fn give_arguments(
    scan: &CallScan,
    object: &str,
    index: usize,
    given: usize,
    events: &mut Vec<ToolCallEvent>,
) -> usize {
    match scan.arguments {
        Some((start, end)) if object[start..].starts_with('"') => {
            // Arguments written as a JSON string: given whole, decoded, once complete.
            match end {
                Some(end) if given == 0 => {
                    let text = serde_json::from_str::<String>(&object[start..end]).unwrap_or_default();
                    push_arguments(events, index, &text);
                    end - start
                }
                _ => given,
            }
        }
        Some((start, end)) => {
            let available = end.unwrap_or(object.len()) - start;
            push_arguments(events, index, &object[start + given..start + available]);
            available
        }
        // A call that ended (or stopped being JSON) without arguments has none.
        None if (scan.end.is_some() || scan.invalid_at.is_some()) && given == 0 => {
            push_arguments(events, index, "{}");
            2
        }
        None => given,
    }
}

fn push_content(events: &mut Vec<ToolCallEvent>, text: &str) {
    if !text.is_empty() {
        events.push(ToolCallEvent::Content(text.to_string()));
    }
}

fn push_arguments(events: &mut Vec<ToolCallEvent>, index: usize, fragment: &str) {
    if !fragment.is_empty() {
        events.push(ToolCallEvent::Arguments { index, fragment: fragment.to_string() });
    }
}

/// The length of the longest end of `text` that `marker` starts with (the marker may be coming).
fn partial_marker_len(text: &str, marker: &str) -> usize {
    (1..marker.len().min(text.len() + 1))
        .rev()
        .find(|&len| text.is_char_boundary(text.len() - len) && marker.starts_with(&text[text.len() - len..]))
        .unwrap_or(0)
}

/// The length of the separators `text` starts with: whitespace, `,` `;` `[` `]` and markers;
/// unless the output `ended`, not the start of a marker that may be coming.
fn separators_len(text: &str, ended: bool) -> usize {
    let mut at = 0;
    loop {
        let rest = &text[at..];
        if !ended && MARKERS.iter().any(|m| m.len() > rest.len() && m.starts_with(rest)) {
            return at;
        }
        if let Some(marker) = MARKERS.iter().find(|m| rest.starts_with(*m)) {
            at += marker.len();
        } else if let Some(character) =
            rest.chars().next().filter(|c| c.is_whitespace() || ",;[]".contains(*c))
        {
            at += character.len_utf8();
        } else {
            return at;
        }
    }
}

/// What the start of a call's JSON object says so far.
#[derive(Debug, Default)]
struct CallScan {
    /// The function's name, once its string is whole.
    name: Option<String>,
    /// Where the arguments' value starts, and ends once it is whole.
    arguments: Option<(usize, Option<usize>)>,
    /// Where the object ends, once it is whole.
    end: Option<usize>,
    /// Where the text stops being a JSON object, if it does.
    invalid_at: Option<usize>,
}

/// Scans `text`, which starts with `{`, as much of a call object as it holds.
fn scan_call(text: &str) -> CallScan {
    let bytes = text.as_bytes();
    let mut scan = CallScan::default();
    let mut at = 1;
    loop {
        at = skip_whitespace(bytes, at);
        match bytes.get(at) {
            None => return scan,
            Some(b'}') => {
                scan.end = Some(at + 1);
                return scan;
            }
            Some(b',') => {
                at += 1;
                continue;
            }
            Some(b'"') => {}
            Some(_) => {
                scan.invalid_at = Some(at);
                return scan;
            }
        }
        let Some(key_end) = value_end(bytes, at) else { return scan };
        let key = serde_json::from_str::<String>(&text[at..key_end]).unwrap_or_default();
        at = skip_whitespace(bytes, key_end);
        match bytes.get(at) {
            None => return scan,
            Some(b':') => {}
            Some(_) => {
                scan.invalid_at = Some(at);
                return scan;
            }
        }
        at = skip_whitespace(bytes, at + 1);
        if at == bytes.len() {
            return scan;
        }
        let end = value_end(bytes, at);
        if (key == "arguments" || key == "parameters") && scan.arguments.is_none() {
            scan.arguments = Some((at, end));
        }
        let Some(end) = end else { return scan };
        // The first name counts: a stream gives it as soon as it is whole.
        if key == "name" && scan.name.is_none() {
            scan.name = serde_json::from_str::<String>(&text[at..end]).ok();
        }
        at = end;
    }
}

fn skip_whitespace(bytes: &[u8], mut at: usize) -> usize {
    while bytes.get(at).is_some_and(|b| b.is_ascii_whitespace()) {
        at += 1;
    }
    at
}

/// The end of the JSON value that starts at `at`, or `None` when `bytes` end first.
fn value_end(bytes: &[u8], at: usize) -> Option<usize> {
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    for (offset, &byte) in bytes[at..].iter().enumerate() {
        let position = at + offset;
        if in_string {
            match byte {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => {
                    in_string = false;
                    if depth == 0 {
                        return Some(position + 1);
                    }
                }
                _ => {}
            }
            continue;
        }
        match byte {
            b'"' => in_string = true,
            b'{' | b'[' => depth += 1,
            b'}' | b']' if depth > 0 => {
                depth -= 1;
                if depth == 0 {
                    return Some(position + 1);
                }
            }
            // A number, `true`, `false` or `null` ends where a delimiter starts.
            b',' | b'}' | b']' | b' ' | b'\t' | b'\r' | b'\n' if depth == 0 => return Some(position),
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests;
