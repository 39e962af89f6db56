//! SmolLM2's chat template (ChatML, as the model file has it) on conversations of hostile
//! messages (any roles, any contents, Jinja syntax and turn markers included): rendering gives
//! a prompt or an error, every content appears in the prompt literally (never evaluated), and
//! the prompt encodes.
#![no_main]

use flint_core::chat::ChatMessage;
use flint_fuzz::vocabularies;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&selector, bytes)) = data.split_first() else { return };
    let vocabulary = &vocabularies()[0];
    let template = vocabulary.template.as_ref().expect("SmolLM2 has a chat template");
    let text = String::from_utf8_lossy(bytes);
    // Fields separated by U+0001: role, content, role, content...
    let fields: Vec<&str> = text.split('\u{1}').collect();
    let messages: Vec<ChatMessage> =
        fields.chunks(2).map(|pair| ChatMessage::new(pair[0], pair.get(1).copied().unwrap_or(""))).collect();
    let add_generation_prompt = selector & 0x10 != 0;
    let Ok(prompt) = template.render(&messages, add_generation_prompt) else { return };
    for message in &messages {
        assert!(prompt.contains(&message.content), "{:?} not in {prompt:?}", message.content);
    }
    let ids = template.encode(&vocabulary.tokenizer, &messages).expect("it rendered once");
    assert!(!ids.is_empty());
});
