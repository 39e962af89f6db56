//! Tool calls: each format's grammar run through llguidance byte by byte (what it accepts and
//! refuses), and the parser, whole and streamed in every split, on each format's output.

use super::*;
use crate::chat::{ChatMessage, ChatTemplate};
use crate::grammar::GrammarCompiler;
use crate::sample::SamplingParams;

/// End of generation in [`tokenizer`].
const EOS: u32 = 2;

/// A byte-level vocabulary with the control tokens `[TOOL_CALLS]` and `<|python_tag|>`: 0 <unk>,
/// 1 <s>, 2 </s>, 3 [TOOL_CALLS], 4 <|python_tag|>, then the 256 byte tokens.
fn tokenizer() -> Tokenizer {
    tokenizer_with(&[])
}

/// [`tokenizer`] with more control tokens, from id 5 on (before the byte tokens).
fn tokenizer_with(controls: &[&str]) -> Tokenizer {
    let base = ["<unk>", "<s>", "</s>", "[TOOL_CALLS]", "<|python_tag|>"];
    let controls: Vec<&str> = base.iter().chain(controls).copied().collect();
    crate::tokenizer::testing::byte_level(&controls, &[], Some(1), EOS)
}

/// One piece of output: text written byte by byte, or a control token.
enum Piece<'a> {
    Text(&'a str),
    Token(u32),
}

/// Whether `grammar` accepts `pieces` and then the end of generation.
fn accepts(tokenizer: &Tokenizer, grammar: &str, pieces: &[Piece]) -> bool {
    let compiler = GrammarCompiler::new(tokenizer, tokenizer.vocab_size()).unwrap();
    let params = SamplingParams { grammar: Some(grammar.to_string()), ..Default::default() };
    let mut constraint = compiler.compile(&params).unwrap_or_else(|e| panic!("{e}\n{grammar}")).unwrap();
    let ids = pieces.iter().flat_map(|piece| match piece {
        Piece::Text(text) => {
            text.bytes().map(|byte| tokenizer.token_id(&format!("<0x{byte:02X}>")).unwrap()).collect()
        }
        Piece::Token(id) => vec![*id],
    });
    // The grammar ends at the end of generation, or by itself after the last piece when
    // nothing may follow.
    let ids: Vec<u32> = ids.collect();
    for (at, &id) in ids.iter().chain([&EOS]).enumerate() {
        if !constraint.allowed().unwrap().allows(id) {
            return false;
        }
        if constraint.commit(id).unwrap() {
            return at + 1 >= ids.len();
        }
    }
    false
}

fn weather() -> ToolFunction {
    ToolFunction {
        name: "weather".into(),
        parameters: json!({"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
            "unit": {"enum": ["c", "f"]}}, "required": ["city"], "additionalProperties": false}),
    }
}

fn time() -> ToolFunction {
    ToolFunction {
        name: "time".into(),
        parameters: json!({"type": "object", "properties": {}, "additionalProperties": false}),
    }
}

const PARIS: &str = r#"{"name": "weather", "arguments": {"city": "Paris"}}"#;
const TIME: &str = r#"{"name": "time", "arguments": {}}"#;

#[test]
fn templates_name_their_format() {
    let hermes = include_str!("../../../../../tests/fixtures/chat_templates/chatml-tools.jinja");
    assert_eq!(ToolCallFormat::of_template(hermes), Some(ToolCallFormat::Hermes));
    assert_eq!(ToolCallFormat::of_template("{{ '[TOOL_CALLS] [' }}"), Some(ToolCallFormat::Mistral));
    let llama = "{%- if tools %}{{ '<|start_header_id|>ipython<|end_header_id|>' }}{% endif %}";
    assert_eq!(ToolCallFormat::of_template(llama), Some(ToolCallFormat::Llama3));
    assert_eq!(
        ToolCallFormat::of_template("{% for tool in tools %}{{ tool }}{% endfor %}"),
        Some(ToolCallFormat::Json)
    );
    assert_eq!(ToolCallFormat::of_template("{% for m in messages %}{{ m.content }}{% endfor %}"), None);
}

#[test]
fn hermes_required_calls_are_valid_calls_to_offered_functions() {
    let tokenizer = tokenizer();
    let grammar = ToolCallFormat::Hermes
        .grammar(&[weather(), time()], &ToolChoice::Required, true, &tokenizer)
        .unwrap();
    let call = |json: &str| format!("<tool_call>\n{json}\n</tool_call>");
    let yes = [
        call(PARIS),
        call(TIME),
        format!("{}\n{}", call(PARIS), call(TIME)),
        call(r#"{"name": "weather", "arguments": {"city": "Oslo", "unit": "c"}}"#),
    ];
    for text in &yes {
        assert!(accepts(&tokenizer, &grammar, &[Piece::Text(text)]), "refused {text}");
    }
    let no = [
        String::new(),
        "Sure.".to_string(),
        call(r#"{"name": "wether", "arguments": {"city": "Paris"}}"#),
        call(r#"{"name": "weather", "arguments": {"town": "Paris"}}"#),
        call(r#"{"name": "weather", "arguments": {"city": "Paris", "unit": "k"}}"#),
        call(r#"{"name": "weather", "arguments": {"city": "Llanfairpwllgwyngyll"}}"#),
        call(r#"{"name": "weather", "arguments": {}}"#),
        format!("{}text", call(PARIS)),
    ];
    for text in &no {
        assert!(!accepts(&tokenizer, &grammar, &[Piece::Text(text)]), "accepted {text}");
    }
    let single = ToolCallFormat::Hermes
        .grammar(&[weather(), time()], &ToolChoice::Required, false, &tokenizer)
        .unwrap();
    assert!(!accepts(&tokenizer, &single, &[Piece::Text(&format!("{}\n{}", call(PARIS), call(TIME)))]));
    let named = ToolCallFormat::Hermes
        .grammar(&[time()], &ToolChoice::Function("time".into()), true, &tokenizer)
        .unwrap();
    assert!(accepts(&tokenizer, &named, &[Piece::Text(&call(TIME))]));
    assert!(!accepts(&tokenizer, &named, &[Piece::Text(&call(PARIS))]));
    assert_eq!(ToolCallFormat::Hermes.grammar(&[time()], &ToolChoice::None, true, &tokenizer), None);
}

#[test]
fn hermes_auto_leaves_text_free_and_constrains_a_call_once_it_opens() {
    let tokenizer = tokenizer();
    let grammar = ToolCallFormat::Hermes.grammar(&[weather()], &ToolChoice::Auto, true, &tokenizer).unwrap();
    let yes = [
        String::new(),
        "Paris is sunny <tool and {braces}.\nBye".to_string(),
        format!("<tool_call>\n{PARIS}\n</tool_call>"),
        format!("Let me look.\n<tool_call>\n{PARIS}\n</tool_call>"),
    ];
    for text in &yes {
        assert!(accepts(&tokenizer, &grammar, &[Piece::Text(text)]), "refused {text}");
    }
    let no = [
        "Let me look. <tool_call>\n{\"name\": \"nothing\"}".to_string(),
        format!("<tool_call>\n{TIME}\n</tool_call>"),
        format!("<tool_call>\n{PARIS}\n</tool_call> and text"),
    ];
    for text in &no {
        assert!(!accepts(&tokenizer, &grammar, &[Piece::Text(text)]), "accepted {text}");
    }
}

#[test]
fn hermes_calls_open_with_the_control_token_where_the_vocabulary_has_one() {
    let tokenizer = tokenizer_with(&["<tool_call>"]);
    let body = format!("\n{PARIS}\n</tool_call>");
    let auto = ToolCallFormat::Hermes.grammar(&[weather()], &ToolChoice::Auto, true, &tokenizer).unwrap();
    assert!(accepts(&tokenizer, &auto, &[Piece::Text("Looking."), Piece::Token(5), Piece::Text(&body)]));
    assert!(accepts(&tokenizer, &auto, &[Piece::Token(5), Piece::Text(&body)]));
    assert!(accepts(&tokenizer, &auto, &[]), "an empty answer");
    let wrong = format!("\n{TIME}\n</tool_call>");
    assert!(
        !accepts(&tokenizer, &auto, &[Piece::Token(5), Piece::Text(&wrong)]),
        "a call to a function not offered"
    );
    let required =
        ToolCallFormat::Hermes.grammar(&[weather()], &ToolChoice::Required, true, &tokenizer).unwrap();
    assert!(!accepts(&tokenizer, &required, &[Piece::Text("Looking."), Piece::Token(5), Piece::Text(&body)]));
    assert!(accepts(&tokenizer, &required, &[Piece::Token(5), Piece::Text(&body)]));
}

#[test]
fn mistral_calls_open_with_its_control_token() {
    let tokenizer = tokenizer();
    let array =
        r#" [{"name": "weather", "arguments": {"city": "Paris"}}, {"name": "time", "arguments": {}}]"#;
    let required = ToolCallFormat::Mistral
        .grammar(&[weather(), time()], &ToolChoice::Required, true, &tokenizer)
        .unwrap();
    assert!(accepts(&tokenizer, &required, &[Piece::Token(3), Piece::Text(array)]));
    assert!(
        !accepts(&tokenizer, &required, &[Piece::Text("[TOOL_CALLS]"), Piece::Text(array)]),
        "the text is not the token"
    );
    let auto =
        ToolCallFormat::Mistral.grammar(&[weather(), time()], &ToolChoice::Auto, true, &tokenizer).unwrap();
    assert!(accepts(&tokenizer, &auto, &[Piece::Text("It is sunny.")]));
    assert!(accepts(&tokenizer, &auto, &[]), "an empty answer");
    assert!(accepts(&tokenizer, &auto, &[Piece::Token(3), Piece::Text(array)]));
    assert!(!accepts(&tokenizer, &auto, &[Piece::Token(3), Piece::Text(" [{\"name\": \"time\"}]")]));
}

#[test]
fn llama3_calls_are_the_whole_answer_with_parameters() {
    let tokenizer = tokenizer();
    let call = r#"{"name": "weather", "parameters": {"city": "Paris"}}"#;
    let required =
        ToolCallFormat::Llama3.grammar(&[weather()], &ToolChoice::Required, false, &tokenizer).unwrap();
    assert!(accepts(&tokenizer, &required, &[Piece::Text(call)]));
    assert!(!accepts(&tokenizer, &required, &[Piece::Text(PARIS)]), "`arguments` is not Llama's key");
    let auto = ToolCallFormat::Llama3.grammar(&[weather()], &ToolChoice::Auto, false, &tokenizer).unwrap();
    assert!(accepts(&tokenizer, &auto, &[Piece::Text("Sunny, {mostly}.")]));
    assert!(accepts(&tokenizer, &auto, &[Piece::Text(call)]));
    assert!(!accepts(&tokenizer, &auto, &[Piece::Text(" {\"name\": \"x\"}")]));
}

/// `text` parsed whole, and streamed split at every byte boundary and one character at a time:
/// the streams say the same as the whole parse.
fn parse_every_way(format: ToolCallFormat, text: &str) -> ParsedReply {
    let whole = format.parse(text);
    let collect = |pieces: Vec<&str>| {
        let mut parser = format.parser();
        let mut events: Vec<ToolCallEvent> =
            pieces.into_iter().flat_map(|piece| parser.push(piece)).collect();
        events.extend(parser.finish());
        events
    };
    let reference = collect(vec![text]);
    let characters: Vec<&str> = text.char_indices().map(|(at, c)| &text[at..at + c.len_utf8()]).collect();
    let by_character = rebuild(collect(characters));
    assert_eq!(by_character, whole, "streamed a character at a time");
    for split in (0..=text.len()).filter(|&at| text.is_char_boundary(at)) {
        let events = collect(vec![&text[..split], &text[split..]]);
        assert_eq!(rebuild(events), whole, "split at {split}");
    }
    assert_eq!(rebuild(reference), whole);
    whole
}

/// Events folded into a reply, checking that calls start in order and before their arguments.
fn rebuild(events: Vec<ToolCallEvent>) -> ParsedReply {
    let mut reply = ParsedReply::default();
    for event in events {
        match &event {
            ToolCallEvent::Call { index, .. } => assert_eq!(*index, reply.calls.len()),
            ToolCallEvent::Arguments { index, .. } => assert!(*index < reply.calls.len()),
            ToolCallEvent::Content(_) => {}
        }
        reply.add(event);
    }
    reply
}

fn call(name: &str, arguments: &str) -> ParsedCall {
    ParsedCall { name: name.into(), arguments: arguments.into() }
}

#[test]
fn hermes_output_is_read_as_text_then_calls() {
    let text = format!(
        "Let me look. {{not a call}}\n<tool_call>\n{PARIS}\n</tool_call>\n<tool_call>\n{TIME}\n</tool_call>"
    );
    let reply = parse_every_way(ToolCallFormat::Hermes, &text);
    assert_eq!(reply.content, "Let me look. {not a call}\n");
    assert_eq!(reply.calls, [call("weather", r#"{"city": "Paris"}"#), call("time", "{}")]);

    let plain = parse_every_way(ToolCallFormat::Hermes, "No call: <tool_ca and é");
    assert_eq!((plain.content.as_str(), plain.calls.len()), ("No call: <tool_ca and é", 0));
    // Arguments before the name, nested, with strings holding braces and escaped quotes.
    let odd =
        r#"<tool_call>{"arguments": {"q": "}\"{", "n": [1, {"x": null}]}, "name": "search"}</tool_call>"#;
    let reply = parse_every_way(ToolCallFormat::Hermes, odd);
    assert_eq!(reply.calls, [call("search", r#"{"q": "}\"{", "n": [1, {"x": null}]}"#)]);
    // Arguments as a JSON string are given decoded; a call with none has `{}`.
    let stringly = r#"<tool_call>{"name": "f", "arguments": "{\"a\": 1}"}</tool_call><tool_call>{"name": "g"}</tool_call>"#;
    let reply = parse_every_way(ToolCallFormat::Hermes, stringly);
    assert_eq!(reply.calls, [call("f", r#"{"a": 1}"#), call("g", "{}")]);
    // What follows the calls and is not one is text.
    let reply = parse_every_way(ToolCallFormat::Hermes, &format!("<tool_call>\n{TIME}\n</tool_call>\nDone."));
    assert_eq!((reply.content.as_str(), reply.calls.len()), ("Done.", 1));
    // A call whose name was given stays one when the text stops being JSON: the rest is text.
    let broken = r#"[TOOL_CALLS] [{"name": "f", "arguments": {1}", "/name": "g"}]"#;
    let reply = parse_every_way(ToolCallFormat::Mistral, broken);
    assert_eq!(reply.calls, [call("f", "{1}")]);
    assert_eq!(reply.content, r#"/name": "g"}]"#, "the text from where the object went wrong");
    let reply = parse_every_way(ToolCallFormat::Hermes, r#"<tool_call>{"name": "f" x"#);
    assert_eq!((reply.calls, reply.content.as_str()), (vec![call("f", "{}")], "x"));
    let reply = parse_every_way(ToolCallFormat::Hermes, "<tool_call>\n[1, 2]</tool_call>");
    assert_eq!((reply.content.as_str(), reply.calls.len()), ("1, 2]</tool_call>", 0));
}

#[test]
fn an_unfinished_call_keeps_what_was_written() {
    let reply = parse_every_way(
        ToolCallFormat::Hermes,
        "<tool_call>\n{\"name\": \"weather\", \"arguments\": {\"city\": \"Pa",
    );
    assert_eq!(reply.calls, [call("weather", r#"{"city": "Pa"#)]);
    let reply = parse_every_way(ToolCallFormat::Hermes, "<tool_call>\n{\"name\": \"wea");
    assert_eq!(reply, ParsedReply::default());
}

#[test]
fn the_other_formats_read_calls_from_the_answers_start() {
    let llama =
        parse_every_way(ToolCallFormat::Llama3, r#"  {"name": "weather", "parameters": {"city": "Paris"}}"#);
    assert_eq!(
        (llama.content.as_str(), &llama.calls[..]),
        ("", &[call("weather", r#"{"city": "Paris"}"#)][..])
    );
    let tagged =
        parse_every_way(ToolCallFormat::Llama3, r#"<|python_tag|>{"name": "time", "parameters": {}}"#);
    assert_eq!(tagged.calls, [call("time", "{}")]);
    let text = parse_every_way(ToolCallFormat::Llama3, " It is {sunny}.");
    assert_eq!((text.content.as_str(), text.calls.len()), (" It is {sunny}.", 0));
    // Mistral's `[TOOL_CALLS]` is a control token, gone from the text.
    let array =
        r#" [{"name": "weather", "arguments": {"city": "Paris"}}, {"name": "time", "arguments": {}}]"#;
    let mistral = parse_every_way(ToolCallFormat::Mistral, array);
    assert_eq!(mistral.calls, [call("weather", r#"{"city": "Paris"}"#), call("time", "{}")]);
    let written = parse_every_way(ToolCallFormat::Mistral, &format!("[TOOL_CALLS]{array}"));
    assert_eq!(written.calls.len(), 2);
    let json = parse_every_way(ToolCallFormat::Json, PARIS);
    assert_eq!(json.calls, [call("weather", r#"{"city": "Paris"}"#)]);
    let list = parse_every_way(ToolCallFormat::Json, "[1, 2]");
    assert_eq!((list.content.as_str(), list.calls.len()), ("1, 2]", 0));
    assert_eq!(parse_every_way(ToolCallFormat::Json, "  ").content, "  ");
}

#[test]
fn the_fixture_template_renders_tools_calls_and_results() {
    let source = include_str!("../../../../../tests/fixtures/chat_templates/chatml-tools.jinja");
    let template = ChatTemplate::new(source, "", "<|im_end|>").unwrap();
    assert_eq!(template.tool_format(), Some(ToolCallFormat::Hermes));
    let tool = json!({"type": "function", "function": {"name": "weather", "description": "a < b",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}});
    let calls = vec![ToolCall {
        id: "call_1".into(),
        name: "weather".into(),
        arguments: r#"{"city":"Paris"}"#.into(),
    }];
    let messages = [
        ChatMessage::user("Weather in Paris?"),
        ChatMessage::assistant_calls("", calls),
        ChatMessage::tool("call_1", "sunny"),
    ];
    let prompt = template.render_with_tools(&messages, &[tool], true).unwrap();
    let expected = concat!(
        "<|im_start|>system\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n",
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n",
        r#"{"type": "function", "function": {"name": "weather", "description": "a < b", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}"#,
        "\n</tools>\n\nFor each function call, return a json object with function name and arguments within ",
        "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n",
        "</tool_call><|im_end|>\n",
        "<|im_start|>user\nWeather in Paris?<|im_end|>\n",
        "<|im_start|>assistant\n<tool_call>\n{\"name\": \"weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call><|im_end|>\n",
        "<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>\n",
        "<|im_start|>assistant\n",
    );
    assert_eq!(prompt, expected);
    // Without tools, the same template is plain ChatML.
    let plain = template.render(&[ChatMessage::user("Hi")], true).unwrap();
    assert_eq!(plain, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
}

#[test]
fn history_calls_serialize_as_openai_writes_them() {
    let call = ToolCall { id: "c".into(), name: "f".into(), arguments: r#"{"a": 1}"#.into() };
    let json = serde_json::to_value(&call).unwrap();
    assert_eq!(
        json,
        json!({"id": "c", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}})
    );
    let back: ToolCall = serde_json::from_value(json).unwrap();
    assert_eq!(back.arguments, r#"{"a":1}"#);
    let text = ToolCall { arguments: "not json".into(), ..call };
    assert_eq!(serde_json::to_value(&text).unwrap()["function"]["arguments"], "not json");
}
