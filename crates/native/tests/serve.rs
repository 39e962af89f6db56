//! `flint serve` end to end: the built binary on SmolLM2, driven by the real OpenAI client
//! (the `openai` package from PyPI, in the virtual environment scripts/openai-client.sh makes)
//! through `openai_client.py`; then SIGTERM stops it cleanly.

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, ChildStderr, Command, Stdio};

use flint_e2e::SMOLLM2;

/// The server process; killed if the test fails before it stops it.
struct Server {
    child: Child,
    stderr: BufReader<ChildStderr>,
    base_url: String,
}

impl Server {
    fn start(model: &Path) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_flint"))
            .args(["serve", "--model", model.to_str().unwrap(), "--port", "0", "--max-body-bytes", "1048576"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stderr = BufReader::new(child.stderr.take().unwrap());
        let mut line = String::new();
        stderr.read_line(&mut line).unwrap();
        let base_url = line
            .trim_end()
            .split(" at ")
            .nth(1)
            .and_then(|url| url.strip_suffix("/v1"))
            .unwrap_or_else(|| panic!("no address in the server's first line: {line:?}"))
            .to_string();
        Server { child, stderr, base_url }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The interpreter of the virtual environment with the `openai` package.
fn openai_python() -> String {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/openai-client.sh");
    let output = Command::new("bash").arg(script).output().unwrap();
    assert!(
        output.status.success(),
        "scripts/openai-client.sh failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap().trim().to_string()
}

#[test]
fn the_openai_client_streams_generates_and_gets_errors_from_the_server() {
    let python = openai_python();
    let mut server = Server::start(&SMOLLM2.path());
    let client = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/openai_client.py");
    let output = Command::new(&python)
        .arg(client)
        .args([&server.base_url, "SmolLM2-135M-Instruct.Q4_1"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    print!("{stdout}");
    assert!(
        output.status.success(),
        "the OpenAI client failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.trim_end().ends_with("checks passed"), "{stdout}");

    // SIGTERM: the server stops cleanly, with status 0.
    let killed = Command::new("kill").args(["-TERM", &server.child.id().to_string()]).status().unwrap();
    assert!(killed.success());
    let status = server.child.wait().unwrap();
    let mut rest = String::new();
    server.stderr.read_to_string(&mut rest).unwrap();
    assert!(status.success(), "{status}: {rest}");
    assert!(rest.contains("flint serve: stopped"), "{rest}");
}
