//! `flint serve` end to end: the built binary on SmolLM2, under an alias too, driven by the
//! real OpenAI client (the `openai` package from PyPI, in the virtual environment
//! scripts/openai-client.sh makes) through `openai_client.py`; then SIGTERM stops it cleanly.
//!
//! Tool calls, with the Python and the Node OpenAI clients, and embeddings, on a tiny model.
//!
//! And under load: 32 clients on loopback for a bounded time, over raw HTTP/1.1, with streamed
//! and whole answers, streams dropped mid-way, connections cut before the body, and bad
//! requests (invalid UTF-8, out-of-range parameters). Afterwards every KV block is free, the
//! server's memory has not grown past a bound, it is healthy and still answers, and every
//! answer that finished was complete and well-formed.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, ChildStderr, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use flint_e2e::SMOLLM2;
use serde_json::Value;

/// Clients at once.
const CLIENTS: usize = 32;
/// How long the clients keep starting requests.
const SOAK: Duration = Duration::from_secs(60);
/// How much the server's resident memory may grow from the end of the warm-up to the end.
const RSS_GROWTH_BOUND_BYTES: u64 = 64 << 20;

/// The server process; killed if the test fails before it stops it.
struct Server {
    child: Child,
    stderr: BufReader<ChildStderr>,
    base_url: String,
}

impl Server {
    /// `flint serve` on `model`, with `more` arguments.
    fn start(model: &Path, more: &[&str]) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_flint"))
            .args(["serve", "--model", model.to_str().unwrap(), "--port", "0", "--max-body-bytes", "1048576"])
            .args(more)
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

    /// The server's resident memory, from /proc.
    fn rss_bytes(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        let kib = status
            .lines()
            .find_map(|line| line.strip_prefix("VmRSS:"))
            .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .unwrap_or_else(|| panic!("no VmRSS in {status}"));
        kib * 1024
    }

    /// `host:port`, for raw HTTP.
    fn address(&self) -> &str {
        self.base_url.trim_start_matches("http://")
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
    let mut server = Server::start(&SMOLLM2.path(), &["--alias", "gpt-4o-mini"]);
    let client = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/openai_client.py");
    let output = Command::new(&python)
        .arg(client)
        .args([&server.base_url, "SmolLM2-135M-Instruct.Q4_1", "gpt-4o-mini"])
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

/// A response: status and body (chunked transfer decoded).
struct Response {
    status: u16,
    body: Vec<u8>,
}

impl Response {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", String::from_utf8_lossy(&self.body)))
    }
}

fn connect(address: &str) -> TcpStream {
    let stream = TcpStream::connect(address).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(600))).unwrap();
    stream
}

fn send(stream: &mut TcpStream, method: &str, path: &str, body: &[u8]) {
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: soak\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).unwrap();
    stream.write_all(body).unwrap();
}

/// Sends a request and reads the whole response.
fn request(address: &str, method: &str, path: &str, body: &[u8]) -> Response {
    let mut stream = connect(address);
    send(&mut stream, method, path, body);
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).unwrap();
    parse_response(&raw)
}

fn parse_response(raw: &[u8]) -> Response {
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").expect("a complete response head");
    let head = String::from_utf8_lossy(&raw[..split]).to_ascii_lowercase();
    let status = head.split(' ').nth(1).and_then(|s| s.parse().ok()).expect("a status line");
    let mut body = raw[split + 4..].to_vec();
    if head.contains("transfer-encoding: chunked") {
        body = dechunk(&body);
    }
    Response { status, body }
}

fn dechunk(mut chunked: &[u8]) -> Vec<u8> {
    let mut body = Vec::new();
    loop {
        let line_end = chunked.windows(2).position(|w| w == b"\r\n").expect("a chunk size line");
        let size_text = std::str::from_utf8(&chunked[..line_end]).unwrap();
        let size = usize::from_str_radix(size_text.split(';').next().unwrap().trim(), 16).unwrap();
        if size == 0 {
            return body;
        }
        let data = &chunked[line_end + 2..];
        body.extend_from_slice(&data[..size]);
        chunked = &data[size + 2..];
    }
}

/// The Prometheus samples of /metrics.
fn metrics(address: &str) -> Vec<(String, f64)> {
    let response = request(address, "GET", "/metrics", b"");
    assert_eq!(response.status, 200);
    String::from_utf8(response.body)
        .unwrap()
        .lines()
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .map(|line| {
            let (name, value) = line.rsplit_once(' ').unwrap();
            (name.to_string(), value.parse().unwrap())
        })
        .collect()
}

fn sample(samples: &[(String, f64)], name: &str) -> f64 {
    samples.iter().find(|(n, _)| n == name).map(|(_, v)| *v).unwrap_or_else(|| panic!("no {name}"))
}

fn wait_idle(address: &str) -> Vec<(String, f64)> {
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let samples = metrics(address);
        if sample(&samples, "flint_running_sequences") == 0.0
            && sample(&samples, "flint_waiting_sequences") == 0.0
        {
            return samples;
        }
        assert!(Instant::now() < deadline, "the server did not go idle: {samples:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// xorshift64*: each client's own reproducible choices, without a dependency.
struct Choices(u64);

impl Choices {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    }
}

const QUESTIONS: [&str; 4] =
    ["What is the capital of France?", "Name a primary color.", "Say hi.", "What is 2 + 2?"];

/// What the clients did.
#[derive(Default)]
struct Tally {
    whole: AtomicUsize,
    streamed: AtomicUsize,
    aborted: AtomicUsize,
    cut: AtomicUsize,
    refused: AtomicUsize,
}

/// A whole chat answer: 200, one choice with text, a finish reason, consistent usage.
fn whole_chat(address: &str, choices: &mut Choices) {
    let max_tokens = 1 + choices.below(8);
    let question = QUESTIONS[choices.below(4) as usize];
    let body = format!(
        r#"{{"messages": [{{"role": "user", "content": "{question}"}}], "max_tokens": {max_tokens}, "temperature": 0.8}}"#
    );
    let response = request(address, "POST", "/v1/chat/completions", body.as_bytes());
    assert_eq!(response.status, 200, "{}", String::from_utf8_lossy(&response.body));
    let json = response.json();
    let choice = &json["choices"][0];
    assert!(choice["message"]["content"].is_string(), "{json}");
    assert!(matches!(choice["finish_reason"].as_str(), Some("stop" | "length")), "{json}");
    let completion = json["usage"]["completion_tokens"].as_u64().unwrap();
    assert!((1..=max_tokens).contains(&completion), "{json}");
}

/// A streamed completion read to its end: every event is JSON, the last choice chunk has a
/// finish reason, then `[DONE]`.
fn streamed_completion(address: &str, choices: &mut Choices) {
    let max_tokens = 1 + choices.below(8);
    let body = format!(r#"{{"prompt": "Once upon a time", "max_tokens": {max_tokens}, "stream": true}}"#);
    let response = request(address, "POST", "/v1/completions", body.as_bytes());
    assert_eq!(response.status, 200, "{}", String::from_utf8_lossy(&response.body));
    let text = String::from_utf8(response.body).unwrap();
    let events: Vec<&str> = text.lines().filter_map(|line| line.strip_prefix("data: ")).collect();
    assert_eq!(events.last(), Some(&"[DONE]"), "{text}");
    let chunks: Vec<Value> =
        events[..events.len() - 1].iter().map(|e| serde_json::from_str(e).unwrap()).collect();
    let finish: Vec<&Value> = chunks.iter().map(|c| &c["choices"][0]["finish_reason"]).collect();
    assert!(finish.last().is_some_and(|f| f.is_string()), "{text}");
    assert!(finish[..finish.len() - 1].iter().all(|f| f.is_null()), "{text}");
}

/// A stream dropped after its first event: the server must abort it.
fn aborted_stream(address: &str) {
    let body =
        br#"{"prompt": "The history of the world", "max_tokens": 200, "stream": true, "ignore_eos": true}"#;
    let mut stream = connect(address);
    send(&mut stream, "POST", "/v1/completions", body);
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    while reader.read_line(&mut line).unwrap() > 0 && !line.starts_with("data: ") {
        line.clear();
    }
}

/// A connection cut in the middle of its request body.
fn cut_request(address: &str) {
    let mut stream = connect(address);
    let head = "POST /v1/completions HTTP/1.1\r\nHost: soak\r\nContent-Type: application/json\r\n\
                Content-Length: 1000\r\n\r\n{\"prompt\": \"unfinis";
    stream.write_all(head.as_bytes()).unwrap();
}

/// Bad requests: 400 with an OpenAI error object.
fn refused(address: &str, choices: &mut Choices) {
    let bodies: [&[u8]; 4] = [
        b"{\"prompt\": \"ok \xff\xfe\", \"max_tokens\": 2}",
        br#"{"prompt": "x", "temperature": -1}"#,
        br#"{"prompt": "x", "max_tokens": 18446744073709551615}"#,
        br#"{"prompt": ["a", "b"], "n": 18446744073709551615}"#,
    ];
    let body = bodies[choices.below(bodies.len() as u64) as usize];
    let response = request(address, "POST", "/v1/completions", body);
    assert_eq!(response.status, 400, "{}", String::from_utf8_lossy(&response.body));
    let json = response.json();
    assert_eq!(json["error"]["type"], "invalid_request_error", "{json}");
}

/// Tool calls (and, from Python, embeddings) through the real OpenAI clients for Python
/// (`openai_tools.py`) and Node
/// (`crates/web/tests/openai-node.mjs`, the `openai` npm package that scripts/setup-web.sh
/// installs): `tiny-qwen2-tools.gguf`, a tiny random-weight Qwen2 whose ChatML template renders
/// tools as Qwen2.5 does (scripts/fixtures/make_tiny_models.sh makes it). Its words are noise,
/// so the clients check what flint guarantees whatever the model: valid calls when a call is
/// required, streamed deltas that rebuild them, a two-turn exchange, no call with `none`, 400s
/// naming the field.
#[test]
fn the_openai_clients_call_tools_and_embed() {
    let python = openai_python();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let model = flint_e2e::model_dir().join("tiny").join("tiny-qwen2-tools.gguf");
    assert!(model.is_file(), "{} is missing: run scripts/fixtures/make_tiny_models.sh", model.display());
    let server = Server::start(&model, &[]);
    let clients = [
        (python.as_str(), repo.join("crates/native/tests/openai_tools.py")),
        ("node", repo.join("crates/web/tests/openai-node.mjs")),
    ];
    for (program, script) in clients {
        let output =
            Command::new(program).arg(&script).args([&server.base_url, "tiny-qwen2-tools"]).output().unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        print!("{stdout}");
        assert!(
            output.status.success(),
            "{} failed:\n{stdout}\n{}",
            script.display(),
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(stdout.trim_end().ends_with("checks passed"), "{stdout}");
    }
}

#[test]
fn thirty_two_clients_with_aborts_leave_no_blocks_and_no_growth() {
    let server = Server::start(&SMOLLM2.path(), &[]);
    let address = server.address().to_string();
    // Warm-up: every client once, so buffers and pipelines that are made once exist.
    std::thread::scope(|scope| {
        for client in 0..CLIENTS {
            let address = &address;
            scope.spawn(move || whole_chat(address, &mut Choices(client as u64 + 1)));
        }
    });
    wait_idle(&address);
    let rss_warm = server.rss_bytes();

    let tally = Tally::default();
    let started = Instant::now();
    std::thread::scope(|scope| {
        for client in 0..CLIENTS {
            let (address, tally) = (&address, &tally);
            scope.spawn(move || {
                let mut choices = Choices(0x9e37_79b9_7f4a_7c15 ^ client as u64);
                while started.elapsed() < SOAK {
                    let counter = match choices.below(10) {
                        0..=3 => {
                            whole_chat(address, &mut choices);
                            &tally.whole
                        }
                        4..=6 => {
                            streamed_completion(address, &mut choices);
                            &tally.streamed
                        }
                        7 => {
                            aborted_stream(address);
                            &tally.aborted
                        }
                        8 => {
                            cut_request(address);
                            &tally.cut
                        }
                        _ => {
                            refused(address, &mut choices);
                            &tally.refused
                        }
                    };
                    counter.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
    });
    let counts = [&tally.whole, &tally.streamed, &tally.aborted, &tally.cut, &tally.refused]
        .map(|count| count.load(Ordering::Relaxed));
    println!("whole, streamed, aborted, cut, refused: {counts:?}");
    assert!(counts[..3].iter().all(|&count| count > 0), "every kind of request ran: {counts:?}");

    let samples = wait_idle(&address);
    assert_eq!(sample(&samples, "flint_kv_blocks{state=\"used\"}"), 0.0, "{samples:?}");
    assert_eq!(sample(&samples, "flint_healthy"), 1.0, "{samples:?}");
    let rss_end = server.rss_bytes();
    println!("server RSS: {} MiB after warm-up, {} MiB after the soak", rss_warm >> 20, rss_end >> 20);
    assert!(
        rss_end < rss_warm + RSS_GROWTH_BOUND_BYTES,
        "the server's memory grew from {rss_warm} to {rss_end} bytes"
    );
    let health = request(&address, "GET", "/health", b"");
    assert_eq!((health.status, health.json()["status"].as_str()), (200, Some("ok")));
    whole_chat(&address, &mut Choices(7));
}
