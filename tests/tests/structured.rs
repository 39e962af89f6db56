//! Structured output with the real SmolLM2 model on the GPU: whatever the model would rather
//! say, output under a JSON Schema parses and validates (checked by the `jsonschema` crate, not
//! by llguidance), output under a regex matches it (the `regex` crate), a grammar of a few words
//! produces only those words, and unconstrained requests batched with constrained ones get
//! the tokens they get alone.
//!
//! Every case runs at temperature 0 and at temperature 1 with several seeds, all of them
//! submitted together so that the engine batches them (decoding on lavapipe is slow one
//! stream at a time).

mod running;

use flint_core::engine::{
    Engine, EngineOptions, FinishReason, GenerateOutput, GenerateRequest, GenerationStream, Prompts,
    StopMatch,
};
use flint_core::sample::SamplingParams;
use futures::StreamExt;
use running::Running;
use serde_json::{Value, json};

/// An engine without the prefix cache (the free requests' tokens are compared with and without
/// neighbours, so nothing else may differ).
fn start() -> Running {
    Running::start(EngineOptions { prefix_cache: false, ..Default::default() })
}

/// Every KV block is free again once the batch is done.
fn finish(running: Running) {
    assert_eq!(running.idle_metrics().kv_blocks_used, 0);
    running.finish();
}

/// The chat prompt of `question` (the instruct model answers better inside its template).
fn chat(question: &str) -> String {
    format!("<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n")
}

fn request(prompt: &str, sampling: SamplingParams) -> GenerateRequest {
    GenerateRequest { text: Some(Prompts::One(prompt.into())), sampling, ..Default::default() }
}

fn only(stream: GenerationStream) -> GenerateOutput {
    let mut items: Vec<GenerateOutput> = futures::executor::block_on(stream.collect::<Vec<_>>())
        .into_iter()
        .map(|item| item.unwrap_or_else(|e| panic!("request failed: {e}")))
        .collect();
    assert_eq!(items.len(), 1, "{items:?}");
    items.remove(0)
}

/// Temperature 0, then temperature 1 with seeds 1, 2, 3: the draws each case is tried with.
fn draws(max_new_tokens: usize) -> Vec<SamplingParams> {
    let greedy = SamplingParams { temperature: 0.0, max_new_tokens, ..Default::default() };
    let mut all = vec![greedy];
    all.extend((1..=3).map(|seed| SamplingParams { seed: Some(seed), max_new_tokens, ..Default::default() }));
    all
}

/// Submits every (prompt, params) at once and returns the outputs in the same order.
fn run_all(engine: &Engine, requests: Vec<GenerateRequest>) -> Vec<GenerateOutput> {
    let streams: Vec<GenerationStream> = requests.into_iter().map(|r| engine.generate(r)).collect();
    streams.into_iter().map(only).collect()
}

/// The output ended because its grammar was complete (or the model stopped where it may).
fn assert_stopped(output: &GenerateOutput, what: &str) {
    assert!(
        matches!(output.meta_info.finish_reason, Some(FinishReason::Stop { matched: StopMatch::Token(_) })),
        "{what}: the output {:?} ended with {:?}, not at the end of its grammar",
        output.text,
        output.meta_info.finish_reason
    );
}

#[test]
fn json_schema_output_always_parses_and_validates() {
    let schemas = [
        // Nested objects, required and optional fields, an enum, bounded strings and numbers.
        (
            "Describe a person who lives in a city, as JSON.",
            json!({
                "type": "object",
                "properties": {
                    "name": {"type": "string", "maxLength": 16},
                    "age": {"type": "integer", "minimum": 0, "maximum": 120},
                    "address": {
                        "type": "object",
                        "properties": {
                            "city": {"type": "string", "maxLength": 16},
                            "zip": {"type": "string", "pattern": "^[0-9]{5}$"}
                        },
                        "required": ["city", "zip"],
                        "additionalProperties": false
                    },
                    "nickname": {"type": "string", "maxLength": 8}
                },
                "required": ["name", "age", "address"],
                "additionalProperties": false
            }),
        ),
        // Arrays with bounds, of enums.
        (
            "List some colors you like, as JSON.",
            json!({
                "type": "object",
                "properties": {
                    "colors": {
                        "type": "array",
                        "items": {"enum": ["red", "green", "blue", "yellow"]},
                        "minItems": 2,
                        "maxItems": 4
                    },
                    "favorite": {"enum": ["red", "green", "blue", "yellow"]}
                },
                "required": ["colors", "favorite"],
                "additionalProperties": false
            }),
        ),
        // Numbers, a boolean, and an array of small objects.
        (
            "Give the weather for two days as JSON.",
            json!({
                "type": "object",
                "properties": {
                    "sunny": {"type": "boolean"},
                    "days": {
                        "type": "array",
                        "minItems": 1,
                        "maxItems": 2,
                        "items": {
                            "type": "object",
                            "properties": {
                                "day": {"enum": ["monday", "tuesday", "friday"]},
                                "celsius": {"type": "integer", "minimum": -30, "maximum": 45},
                                "rain": {"type": "number", "minimum": 0, "maximum": 1}
                            },
                            "required": ["day", "celsius"],
                            "additionalProperties": false
                        }
                    }
                },
                "required": ["sunny", "days"],
                "additionalProperties": false
            }),
        ),
    ];
    let running = start();
    let engine = &running.engine;
    let mut requests = Vec::new();
    let mut expected = Vec::new();
    for (question, schema) in &schemas {
        for params in draws(96) {
            let what = format!("{question} (temperature {}, seed {:?})", params.temperature, params.seed);
            let params = SamplingParams { json_schema: Some(schema.clone()), ..params };
            requests.push(request(&chat(question), params));
            expected.push((what, schema));
        }
    }
    // A schema given as JSON text is the same schema.
    let (question, schema) = &schemas[1];
    let text =
        SamplingParams { json_schema: Some(Value::String(schema.to_string())), ..draws(96)[0].clone() };
    requests.push(request(&chat(question), text));
    expected.push((format!("{question} (schema as text)"), schema));

    let outputs = run_all(engine, requests);
    for (output, (what, schema)) in outputs.iter().zip(&expected) {
        assert_stopped(output, what);
        let value: Value = serde_json::from_str(&output.text)
            .unwrap_or_else(|e| panic!("{what}: {:?} is not JSON: {e}", output.text));
        let validator = jsonschema::validator_for(schema).unwrap();
        let errors: Vec<String> = validator.iter_errors(&value).map(|e| e.to_string()).collect();
        assert!(errors.is_empty(), "{what}: {} does not validate: {errors:?}", output.text);
    }
    // The schema as text and as a value constrain alike: the same greedy output.
    let greedy_colors = &outputs[4]; // the second schema's first draw

    assert_eq!(outputs.last().map(|o| &o.output_ids), Some(&greedy_colors.output_ids));
    finish(running);
}

#[test]
fn regex_output_always_matches() {
    let cases = [
        ("What is today's date?", r"[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"),
        ("Give me an e-mail address for Alice.", r"[a-z]{1,12}(\.[a-z]{1,8})?@[a-z]{2,10}\.(com|org|net)"),
    ];
    let running = start();
    let engine = &running.engine;
    let mut requests = Vec::new();
    let mut expected = Vec::new();
    for (question, pattern) in cases {
        for params in draws(40) {
            let what = format!("{question} (temperature {}, seed {:?})", params.temperature, params.seed);
            requests.push(request(&chat(question), SamplingParams { regex: Some(pattern.into()), ..params }));
            expected.push((what, regex::Regex::new(&format!("^(?:{pattern})$")).unwrap()));
        }
    }
    for (output, (what, pattern)) in run_all(engine, requests).iter().zip(&expected) {
        assert_stopped(output, what);
        assert!(pattern.is_match(&output.text), "{what}: {:?} does not match {pattern}", output.text);
    }
    finish(running);
}

#[test]
fn a_grammar_of_a_few_words_produces_only_those_words() {
    let grammar = r#"
start: color (", " color){0,3}
color: "red" | "green" | "blue"
"#;
    let running = start();
    let engine = &running.engine;
    let question = "Tell me a story about a dragon.";
    let requests = draws(24)
        .into_iter()
        .map(|params| request(&chat(question), SamplingParams { grammar: Some(grammar.into()), ..params }))
        .collect();
    for output in run_all(engine, requests) {
        let words: Vec<&str> = output.text.split(", ").collect();
        assert!(
            (1..=4).contains(&words.len()) && words.iter().all(|w| ["red", "green", "blue"].contains(w)),
            "{:?} is not a list of colors",
            output.text
        );
        assert_stopped(&output, &output.text);
    }
    finish(running);
}

#[test]
fn free_requests_batched_with_constrained_ones_get_the_tokens_they_get_alone() {
    let running = start();
    let engine = &running.engine;
    let free_prompts =
        ["The capital of France is", "Once upon a time, in a small village,", "def fibonacci(n):"];
    let free: Vec<GenerateRequest> = free_prompts
        .iter()
        .zip([
            SamplingParams { temperature: 0.0, max_new_tokens: 16, ..Default::default() },
            SamplingParams { seed: Some(7), max_new_tokens: 16, ..Default::default() },
            SamplingParams { top_k: 20, seed: Some(8), max_new_tokens: 16, ..Default::default() },
        ])
        .map(|(prompt, params)| request(prompt, params))
        .collect();
    let alone: Vec<Vec<u32>> = run_all(engine, free.clone()).into_iter().map(|o| o.output_ids).collect();

    let schema = json!({"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}},
        "required": ["answer"], "additionalProperties": false});
    let mut mixed = Vec::new();
    for (i, free_request) in free.into_iter().enumerate() {
        let constrained = [
            SamplingParams { json_schema: Some(schema.clone()), ..draws(16)[i % 4].clone() },
            SamplingParams {
                regex: Some("[0-9]{1,3}( [0-9]{1,3})*".into()),
                ..draws(16)[(i + 1) % 4].clone()
            },
        ];
        for params in constrained {
            mixed.push(request("Is the sky blue? Answer in JSON.", params));
        }
        mixed.push(free_request);
    }
    let outputs = run_all(engine, mixed);
    let together: Vec<Vec<u32>> = outputs.chunks(3).map(|chunk| chunk[2].output_ids.clone()).collect();
    assert_eq!(together, alone);
    for chunk in outputs.chunks(3) {
        let answer: Value = serde_json::from_str(&chunk[0].text).unwrap();
        assert!(answer["answer"] == "yes" || answer["answer"] == "no", "{answer}");
        assert!(chunk[1].text.chars().all(|c| c.is_ascii_digit() || c == ' '), "{:?}", chunk[1].text);
    }
    finish(running);
}

#[test]
fn bad_constraints_are_refused_and_a_dead_end_ends_with_an_error() {
    let running = start();
    let engine = &running.engine;
    let refused = [
        (SamplingParams { regex: Some("[0-9".into()), ..Default::default() }, "regex"),
        (SamplingParams { grammar: Some("start: missing".into()), ..Default::default() }, "grammar"),
        (
            SamplingParams { json_schema: Some(Value::String("{not json".into())), ..Default::default() },
            "json_schema",
        ),
        (
            SamplingParams { json_schema: Some(json!({"type": "nonsense"})), ..Default::default() },
            "json_schema",
        ),
        (
            SamplingParams {
                regex: Some("a".into()),
                grammar: Some("start: \"a\"".into()),
                ..Default::default()
            },
            "regex",
        ),
    ];
    for (params, field) in refused {
        let items = futures::executor::block_on(engine.generate(request("Hi", params)).collect::<Vec<_>>());
        match &items[..] {
            [Err(error)] => assert!(error.to_string().contains(field), "{error}"),
            other => panic!("expected one error naming {field}, got {other:?}"),
        }
    }
    // The grammar allows only "ab"; logit_bias bans the tokens that can start it: no token is
    // left to draw, and the request ends with an error saying so.
    let tokenizer = engine.tokenizer();
    let banned = ["a", "ab"].iter().filter_map(|t| tokenizer.token_id(t)).map(|id| (id, f32::NEG_INFINITY));
    let params = SamplingParams {
        grammar: Some(r#"start: "ab""#.into()),
        logit_bias: banned.collect(),
        temperature: 0.0,
        max_new_tokens: 4,
        ..Default::default()
    };
    let items = futures::executor::block_on(engine.generate(request("Say ab.", params)).collect::<Vec<_>>());
    match &items[..] {
        [Err(error)] => assert!(error.to_string().contains("grammar"), "{error}"),
        other => panic!("expected an error, got {other:?}"),
    }
    // The engine goes on serving.
    let after =
        only(engine.generate(request("Hi", SamplingParams { max_new_tokens: 2, ..Default::default() })));
    assert_eq!(after.output_ids.len(), 2);
    finish(running);
}
