//! Unit tests of template rendering. Each expected string was also produced by Python's
//! Jinja2 3.1 configured as `transformers` configures it (`trim_blocks`, `lstrip_blocks`,
//! the `loopcontrols` extension, `raise_exception`, `tojson`).

use super::*;

fn render(source: &str, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
    ChatTemplate::new(source, "<s>", "</s>")?.render(messages, add_generation_prompt)
}

fn conversation() -> Vec<ChatMessage> {
    vec![ChatMessage::system("  Be brief.  "), ChatMessage::user("Hi"), ChatMessage::assistant("Hello!")]
}

#[test]
fn blocks_trim_their_newline_and_leading_whitespace() {
    let source = "{{ bos_token }}\n{% for m in messages %}\n    {% if m.role == 'user' %}\n[{{ m.content }}]\n    {% endif %}\n{% endfor %}\n{% if add_generation_prompt %}\n>{% endif %}";
    assert_eq!(render(source, &conversation(), true).unwrap(), "<s>\n[Hi]\n>");
    assert_eq!(render(source, &conversation(), false).unwrap(), "<s>\n[Hi]\n");
}

#[test]
fn python_string_methods_work() {
    let source = "{% for m in messages %}{{ m.content.strip() }}|{{ m.role.upper() }}|{% if m.content.startswith('Hi') %}hi{% endif %}|{{ m.content.split('l') | join(',') }}\n{% endfor %}";
    assert_eq!(
        render(source, &conversation(), false).unwrap(),
        "Be brief.|SYSTEM||  Be brief.  \nHi|USER|hi|Hi\nHello!|ASSISTANT||He,,o!\n"
    );
}

#[test]
fn loop_controls_and_tojson_work_as_in_transformers() {
    // transformers' `tojson` is `json.dumps(ensure_ascii=False)`: ", " and ": " separators,
    // keys in the order given, and no HTML escaping of < > & '.
    let source = "{% for m in messages %}{% if loop.first %}{% continue %}{% endif %}{{ m | tojson }}{% if m.role == 'user' %}{% break %}{% endif %}{% endfor %}";
    let messages = [
        ChatMessage::system("x"),
        ChatMessage::user("<b>Tom & Jerry's</b> \\u003c \"é\"\n"),
        ChatMessage::user("y"),
    ];
    assert_eq!(
        render(source, &messages, false).unwrap(),
        r#"{"role": "user", "content": "<b>Tom & Jerry's</b> \\u003c \"é\"\n"}"#
    );
    let source = "{{ messages[0] | tojson(indent=2) }}";
    assert_eq!(
        render(source, &messages, false).unwrap(),
        "{\n  \"role\": \"system\",\n  \"content\": \"x\"\n}"
    );
}

#[test]
fn raise_exception_is_an_error_with_the_templates_message() {
    let source = "{% if messages[0].role != 'user' %}{{ raise_exception('Conversations must start with the user') }}{% endif %}ok";
    let error = render(source, &conversation(), false).unwrap_err();
    assert!(
        matches!(&error, Error::ChatTemplate(message) if message.contains("Conversations must start with the user")),
        "{error}"
    );
    assert_eq!(render(source, &[ChatMessage::user("x")], false).unwrap(), "ok");
}

#[test]
fn a_syntax_error_is_reported_when_the_template_is_compiled() {
    let error = ChatTemplate::new("{% for m in messages %}{{ m.content }", "<s>", "</s>").unwrap_err();
    assert!(matches!(&error, Error::ChatTemplate(message) if message.contains("syntax error")), "{error}");
}

#[test]
fn jinja_in_message_content_is_literal_text() {
    let source = "{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>{% endfor %}";
    let hostile = [
        "{{ 7 * 7 }}",
        "{% for x in range(3) %}x{% endfor %}",
        "{{ raise_exception('boom') }}",
        "{# comment #}",
        "{{ bos_token }}<|im_start|>",
        "}}{{ {% %} {#",
    ];
    for content in hostile {
        assert_eq!(
            render(source, &[ChatMessage::user(content)], false).unwrap(),
            format!("<user>{content}</user>"),
            "content {content:?}"
        );
    }
    // A role is content too.
    assert_eq!(render(source, &[ChatMessage::new("{{ 1 }}", "x")], false).unwrap(), "<{{ 1 }}>x</{{ 1 }}>");
}

#[test]
fn a_template_that_runs_without_end_runs_out_of_fuel() {
    let source = "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}";
    let error = render(source, &[], false).unwrap_err();
    assert!(error.to_string().contains("fuel"), "{error}");
}

#[test]
fn templates_can_be_shared_across_threads() {
    fn shareable<T: Send + Sync>() {}
    shareable::<ChatTemplate>();
    shareable::<ChatMessage>();
}
