//! `flint chat`: a conversation on standard input and output, through the model's chat
//! template. Each turn sends the whole conversation again; the engine's prefix cache holds the
//! earlier turns' keys and values, so only the new message is computed.

use std::io::{BufRead, IsTerminal, Write};

use clap::Args;
use flint_native::{ChatMessage, GenerateRequest, Prompts};

use super::generate::{SamplingArgs, engine_options, stream_text};
use super::model::{ChatTemplateArg, ModelArg};

#[derive(Args)]
pub struct ChatArgs {
    #[command(flatten)]
    model: ModelArg,
    #[command(flatten)]
    chat_template: ChatTemplateArg,
    /// A system message that starts every conversation.
    #[arg(long, value_name = "TEXT")]
    system: Option<String>,
    #[command(flatten)]
    sampling: SamplingArgs,
}

const HELP: &str = "type a message; /reset starts a new conversation, /exit (or end of input) ends";

pub fn chat(args: &ChatArgs, quiet: bool) -> anyhow::Result<()> {
    let llm = args.model.load_llm(engine_options(), &args.chat_template, quiet)?;
    llm.chat_template()?;
    let interactive = std::io::stdin().is_terminal();
    if interactive && !quiet {
        eprintln!("{HELP}");
    }
    let opening: Vec<ChatMessage> = args.system.iter().map(|s| ChatMessage::system(s.as_str())).collect();
    let mut messages = opening.clone();
    let mut stdin = std::io::stdin().lock();
    let mut line = String::new();
    for line_number in 1.. {
        if interactive {
            eprint!("> ");
        }
        line.clear();
        let read = stdin.read_line(&mut line).map_err(|e| match e.kind() {
            std::io::ErrorKind::InvalidData => {
                anyhow::anyhow!("line {line_number} of standard input is not valid UTF-8")
            }
            _ => e.into(),
        })?;
        if read == 0 {
            break;
        }
        let message = line.trim();
        match message {
            "" => continue,
            "/exit" => break,
            "/reset" => {
                messages.clone_from(&opening);
                if !quiet {
                    eprintln!("(new conversation)");
                }
                continue;
            }
            command if command.starts_with('/') && !command.contains(char::is_whitespace) => {
                eprintln!("unknown command {command}: {HELP}");
                continue;
            }
            _ => {}
        }
        messages.push(ChatMessage::user(message));
        let request = GenerateRequest {
            input_ids: Some(Prompts::One(llm.encode_chat(&messages)?)),
            sampling: args.sampling.params(),
            ..GenerateRequest::default()
        };
        let mut out = std::io::stdout().lock();
        let (answer, meta) = stream_text(&llm, request, &mut out)?;
        writeln!(out)?;
        messages.push(ChatMessage::assistant(answer));
        if !quiet {
            eprintln!(
                "[{} tokens in {:.1} s; prompt {} tokens, {} from the prefix cache]",
                meta.completion_tokens, meta.e2e_latency, meta.prompt_tokens, meta.cached_tokens
            );
        }
    }
    Ok(())
}
