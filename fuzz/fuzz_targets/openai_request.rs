//! `flint serve`'s request parser on arbitrary bodies, for both endpoints: a body is parsed
//! and planned into an engine request, or refused with a 400 naming what is wrong, never a
//! panic. A planned request's sampling parameters are then checked as the engine checks them.
#![no_main]

use flint_core::openai::Endpoint;
use flint_fuzz::openai::{parse_request, plan};
use flint_fuzz::vocabularies;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let vocabulary = &vocabularies()[0];
    for endpoint in [Endpoint::Chat, Endpoint::Completion] {
        let Ok(request) = parse_request::<flint_core::openai::OpenAiRequest>(data) else { return };
        let Ok(plan) = plan(request, endpoint, vocabulary, "fuzz".into()) else { continue };
        let _ = plan.request.sampling.validate(vocabulary.tokenizer.vocab_size());
    }
});
