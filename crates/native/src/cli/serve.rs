//! `flint serve`: the OpenAI-compatible server ([`flint_native::server`]) on a tokio runtime,
//! until Ctrl-C or SIGTERM.

use std::net::SocketAddr;

use clap::Args;
use flint_native::server::Server;

use super::generate::engine_options;
use super::model::{ChatTemplateArg, ModelArg};

#[derive(Args)]
pub struct ServeArgs {
    #[command(flatten)]
    model: ModelArg,
    #[command(flatten)]
    chat_template: ChatTemplateArg,
    /// The address to listen on.
    #[arg(long, default_value = "127.0.0.1", value_name = "HOST")]
    host: String,
    /// The port to listen on; 0 picks a free one (the address is printed on stderr).
    #[arg(long, default_value_t = 8080, value_name = "PORT")]
    port: u16,
    /// Another name to list the model under in /v1/models, for clients that ask for a fixed
    /// model (repeat it for more names). Requests naming any model, listed or not, are served by
    /// this one, and answers give the model's own name (the file name without .gguf).
    #[arg(long = "alias", value_name = "NAME")]
    aliases: Vec<String>,
    /// Request bodies larger than this are refused with 413.
    #[arg(long, default_value_t = 4 << 20, value_name = "BYTES")]
    max_body_bytes: usize,
}

pub fn serve(args: &ServeArgs, quiet: bool) -> anyhow::Result<()> {
    let path = args.model.path()?;
    // The model's name in `/v1/models` and in answers: the file name without `.gguf`.
    let model_id = path
        .file_name()
        .map(|name| name.to_string_lossy().trim_end_matches(".gguf").to_string())
        .unwrap_or_else(|| "model".into());
    let llm = args.model.load_llm(engine_options(), &args.chat_template, quiet)?;
    let server = Server::new(llm, model_id, args.aliases.clone(), args.max_body_bytes);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("flint-http")
        .build()
        .map_err(|e| anyhow::anyhow!("cannot start the server's runtime: {e}"))?;
    runtime.block_on(run(args, &server))?;
    server.llm().shutdown();
    Ok(())
}

async fn run(args: &ServeArgs, server: &std::sync::Arc<Server>) -> anyhow::Result<()> {
    let address = format!("{}:{}", args.host, args.port);
    let listener = tokio::net::TcpListener::bind(&address)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {address}: {e}"))?;
    let bound: SocketAddr = listener.local_addr()?;
    eprintln!("flint serve: model '{}' at http://{bound}/v1", server.model_id());
    axum::serve(listener, server.router()).with_graceful_shutdown(shutdown_signal()).await?;
    eprintln!("flint serve: stopped");
    Ok(())
}

/// Ctrl-C, or SIGTERM where there is one.
async fn shutdown_signal() {
    let interrupt = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = interrupt => {}
        () = terminate => {}
    }
}
