//! The tool-call parser on any text, in every format: it never panics, and the text streamed in
//! pieces (split where the input's first bytes say) reads as the same content and calls as the
//! whole text.
#![no_main]

use flint_core::chat::{ParsedReply, ToolCallEvent, ToolCallFormat};
use libfuzzer_sys::fuzz_target;

const FORMATS: [ToolCallFormat; 4] =
    [ToolCallFormat::Hermes, ToolCallFormat::Llama3, ToolCallFormat::Mistral, ToolCallFormat::Json];

fuzz_target!(|data: &[u8]| {
    let Some((&selector, bytes)) = data.split_first() else { return };
    let format = FORMATS[usize::from(selector) % FORMATS.len()];
    let text = String::from_utf8_lossy(bytes);
    let whole = format.parse(&text);

    // Pieces of 1 to 8 characters, their lengths taken from the selector's bits.
    let ends: Vec<usize> = text.char_indices().skip(1).map(|(at, _)| at).chain([text.len()]).collect();
    let mut parser = format.parser();
    let mut events = Vec::new();
    let (mut start, mut taken, mut step) = (0, 0, 0u32);
    while taken < ends.len() {
        taken = (taken + 1 + ((u32::from(selector) >> (step % 6)) & 7) as usize).min(ends.len());
        let end = ends[taken - 1];
        events.extend(parser.push(&text[start..end]));
        start = end;
        step += 1;
    }
    events.extend(parser.finish());

    let mut streamed = ParsedReply::default();
    for event in events {
        match &event {
            ToolCallEvent::Call { index, .. } => assert_eq!(*index, streamed.calls.len()),
            ToolCallEvent::Arguments { index, .. } => assert!(*index < streamed.calls.len()),
            ToolCallEvent::Content(_) => {}
        }
        streamed.add(event);
    }
    assert_eq!(streamed, whole, "{format:?} on {text:?}");
});
