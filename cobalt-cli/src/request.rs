//! `cobalt get|post|put|delete|discover|observe`: the curl-like client.

use crate::dtls_args::DtlsArgs;
use crate::{exit, sink};
use clap::Args;
use cobalt::proto::link_format;
use cobalt::proto::message::{content_format, Code};
use cobalt::transport::dtls::DtlsClientAuth;
use cobalt::{Client, Error, Observation, Response};
use std::time::Duration;

/// Options shared by every request command.
#[derive(Debug, Args)]
pub struct RequestArgs {
    /// Target, e.g. coap://127.0.0.1/hello or coap://[::1]:5683/path?query
    pub uri: String,
    /// Request payload; `@FILE` reads it from a file, `@-` from standard input.
    #[arg(short, long)]
    pub payload: Option<String>,
    /// Content-Format of the payload: a number or a name (text/plain, json, cbor, ...).
    #[arg(short = 't', long)]
    pub content_format: Option<String>,
    /// Accept: the Content-Format wanted in the response.
    #[arg(short = 'A', long)]
    pub accept: Option<String>,
    /// Send a non-confirmable request.
    #[arg(long)]
    pub non: bool,
    /// Block size for block-wise transfer: 16, 32, 64, 128, 256, 512 or 1024 bytes
    /// (uploads use it; downloads ask the server for it). Default: 1024 for uploads
    /// over UDP; over coap+tcp and coap+ws a body goes whole when it fits the server's
    /// Max-Message-Size, else in the largest blocks that fit (BERT when both ends
    /// support it); the server's choice for downloads.
    #[arg(short = 'b', long)]
    pub block_size: Option<usize>,
    /// Give up after this many seconds overall (for `observe`: waiting for the first
    /// answer). 0: no overall limit, only the protocol's own (about 93 s of
    /// retransmissions for a confirmable request over UDP, 60 s over TCP). At most 1e6.
    #[arg(long, default_value_t = 30.0, value_parser = crate::flags::timeout)]
    pub timeout: f64,
    /// Show the request and response messages on standard error.
    #[arg(short, long)]
    pub verbose: bool,
    /// DTLS credentials for coaps://.
    #[command(flatten)]
    pub dtls: DtlsArgs,
}

/// `cobalt observe` options.
#[derive(Debug, Args)]
pub struct ObserveArgs {
    #[command(flatten)]
    pub request: RequestArgs,
    /// Stop after this many notifications, at least 1 (default: until Ctrl-C); the
    /// registration's answer counts as the first.
    #[arg(short = 'n', long, value_parser = clap::value_parser!(u64).range(1..))]
    pub count: Option<u64>,
}

fn parse_cf(what: &str, v: &str) -> Result<u16, (i32, String)> {
    content_format::parse(v).ok_or_else(|| {
        (
            exit::USAGE,
            format!("unknown {what} '{v}': use a number or text/plain, link-format, xml, octet-stream, json, cbor"),
        )
    })
}

fn read_payload(p: &str) -> Result<Vec<u8>, (i32, String)> {
    match p.strip_prefix('@') {
        Some("-") => {
            let mut buf = Vec::new();
            std::io::Read::read_to_end(&mut std::io::stdin(), &mut buf)
                .map_err(|e| (exit::USAGE, format!("cannot read payload from stdin: {e}")))?;
            Ok(buf)
        }
        Some(path) => std::fs::read(path).map_err(|e| {
            (
                exit::USAGE,
                format!("cannot read payload file '{path}': {e}"),
            )
        }),
        None => Ok(p.as_bytes().to_vec()),
    }
}

fn build(
    client: &Client,
    method: Code,
    args: &RequestArgs,
) -> Result<cobalt::RequestBuilder, (i32, String)> {
    let mut b = client.request(method, &args.uri);
    if args.timeout > 0.0 {
        // In range: checked by `flags::timeout` when parsing.
        b = b.timeout(Duration::from_secs_f64(args.timeout));
    }
    if let Some(p) = &args.payload {
        b = b.payload(read_payload(p)?);
    }
    if let Some(cf) = &args.content_format {
        b = b.content_format(parse_cf("content format", cf)?);
    }
    if let Some(a) = &args.accept {
        b = b.accept(parse_cf("accept format", a)?);
    }
    if args.non {
        b = b.non_confirmable();
    }
    match args.dtls.client_auth().map_err(|e| (exit::USAGE, e))? {
        Some(DtlsClientAuth::Psk(p)) => b = b.psk(p.identity, p.key),
        Some(DtlsClientAuth::X509(x)) => b = b.x509(x),
        None => {}
    }
    if let Some(size) = args.block_size {
        b = b
            .block_size(size)
            .map_err(|e| (exit::USAGE, e.to_string()))?;
    }
    Ok(b)
}

/// A client that prints every datagram with `-v`.
fn client_for(args: &RequestArgs) -> Client {
    if !args.verbose {
        return Client::new();
    }
    let tracer: cobalt::runtime::Tracer = std::sync::Arc::new(|sent, peer, bytes| {
        let (arrow, dir) = if sent { ('>', "to") } else { ('<', "from") };
        match cobalt::proto::message::decode(bytes) {
            Ok(m) => eprintln!(
                "{arrow} {dir} {peer}: {}",
                m.to_string().replace('\n', &format!("\n{arrow} "))
            ),
            Err(e) => eprintln!(
                "{arrow} {dir} {peer}: undecodable datagram of {} bytes ({e})",
                bytes.len()
            ),
        }
    });
    let client = Client::with_tracer(cobalt::EndpointConfig::default(), tracer).unwrap_or_default();
    client.set_stream_tracer(std::sync::Arc::new(|sent, peer, message| {
        let (arrow, dir) = if sent { ('>', "to") } else { ('<', "from") };
        eprintln!(
            "{arrow} {dir} {peer}: {}",
            message.to_string().replace('\n', &format!("\n{arrow} "))
        );
    }));
    client
}

pub(crate) fn error_exit(e: &Error) -> (i32, String) {
    let code = match e {
        Error::BadUri(_) | Error::Unsupported(_) | Error::Config(_) => exit::USAGE,
        _ => exit::NETWORK,
    };
    (code, e.to_string())
}

/// Writes a payload to stdout. Like curl, it goes out byte-exact; only a terminal
/// (or, with `one_per_line`, each observe notification) gets a final newline. Returns
/// false when the reader has gone away (see [`sink::write_stdout`]).
fn print_payload(r: &Response, one_per_line: bool) -> Result<bool, (i32, String)> {
    use std::io::IsTerminal;
    let newline = one_per_line || std::io::stdout().is_terminal();
    let mut bytes = r.payload.clone();
    if newline && !bytes.is_empty() && !bytes.ends_with(b"\n") {
        bytes.push(b'\n');
    }
    sink::write_stdout(&bytes)
}

fn response_status(r: &Response) -> Result<(), (i32, String)> {
    match r.code.class() {
        2 => Ok(()),
        4 => Err((exit::CLIENT_ERROR, format!("server answered {}", r.code))),
        _ => Err((exit::SERVER_ERROR, format!("server answered {}", r.code))),
    }
}

/// Runs one request command.
pub async fn run(method: Code, args: RequestArgs) -> Result<(), (i32, String)> {
    let client = client_for(&args);
    let response = build(&client, method, &args)?
        .send()
        .await
        .map_err(|e| error_exit(&e))?;
    print_payload(&response, false)?;
    response_status(&response)
}

/// `cobalt discover`: GET /.well-known/core and list the links, one per line.
pub async fn discover(mut args: RequestArgs) -> Result<(), (i32, String)> {
    let uri =
        cobalt::proto::uri::CoapUri::parse(&args.uri).map_err(|e| (exit::USAGE, e.to_string()))?;
    if uri.path.is_empty() {
        let base = args
            .uri
            .split('?')
            .next()
            .unwrap_or(&args.uri)
            .trim_end_matches('/');
        let query = args
            .uri
            .split_once('?')
            .map(|(_, q)| format!("?{q}"))
            .unwrap_or_default();
        args.uri = format!("{base}/.well-known/core{query}");
    }
    let client = client_for(&args);
    let response = build(&client, Code::GET, &args)?
        .send()
        .await
        .map_err(|e| error_exit(&e))?;
    response_status(&response)?;
    let text = response.text_payload();
    match link_format::parse(&text) {
        Ok(links) => {
            for l in links {
                let attrs: Vec<String> = l
                    .attrs
                    .iter()
                    .map(|(k, v)| match v {
                        Some(v) => format!("{k}={v}"),
                        None => k.clone(),
                    })
                    .collect();
                let line = format!("{}\t{}\n", l.target, attrs.join(" "));
                if !sink::write_stdout(line.as_bytes())? {
                    break; // the reader has gone away: end quietly
                }
            }
            Ok(())
        }
        Err(e) => {
            sink::write_stdout(format!("{text}\n").as_bytes())?;
            Err((
                exit::PROTOCOL,
                format!("the server's link-format does not parse: {e}"),
            ))
        }
    }
}

/// How long `observe` waits, on its way out, for the server to answer the GET with
/// Observe=1 that ends the relation.
const CANCEL_WAIT: Duration = Duration::from_secs(5);

/// `cobalt observe`: prints each notification until `--count`, Ctrl-C, SIGTERM or a
/// closed standard output, then ends the relation with the server (GET with
/// Observe=1, RFC 7641 §3.6) instead of leaving it to time out.
pub async fn observe(args: ObserveArgs) -> Result<(), (i32, String)> {
    let req = &args.request;
    let client = client_for(req);
    let obs = build(&client, Code::GET, req)?
        .observe()
        .await
        .map_err(|e| error_exit(&e))?
        .on_reregister(|r| {
            eprintln!(
                "cobalt: {}; registering again (attempt {} of {})",
                r.reason, r.attempt, r.max
            )
        });
    let first_wait = (req.timeout > 0.0).then(|| Duration::from_secs_f64(req.timeout));
    let (obs, result) = print_notifications(obs, args.count, first_wait).await;
    if let Some(obs) = obs {
        deregister(obs).await;
    }
    result
}

/// Prints notifications until `count`, a stop signal or the end of the relation.
/// Returns the observation while its relation is still up (to be cancelled), and the
/// command's result.
async fn print_notifications(
    mut obs: Observation,
    count: Option<u64>,
    first_wait: Option<Duration>,
) -> (Option<Observation>, Result<(), (i32, String)>) {
    let stop = stop_requested();
    tokio::pin!(stop);
    let mut seen = 0u64;
    loop {
        let next = async {
            match first_wait.filter(|_| seen == 0) {
                Some(t) => tokio::time::timeout(t, obs.next())
                    .await
                    .unwrap_or(Some(Err(Error::Deadline(t)))),
                None => obs.next().await,
            }
        };
        let next = tokio::select! {
            n = next => n,
            () = &mut stop => return (Some(obs), Ok(())),
        };
        let r = match next {
            Some(Ok(r)) => r,
            Some(Err(e)) => return (None, Err(error_exit(&e))),
            None => return (None, Err((exit::NETWORK, "the observation ended".into()))),
        };
        // A response without Observe ends the relation (an error, or no observe support).
        let observing = r.options.observe().is_some();
        let live = |obs| observing.then_some(obs);
        match print_payload(&r, true) {
            Ok(true) => {}
            Ok(false) => return (live(obs), Ok(())), // the reader has gone away
            Err(e) => return (live(obs), Err(e)),
        }
        if let Err(e) = response_status(&r) {
            return (live(obs), Err(e));
        }
        seen += 1;
        if count.is_some_and(|n| seen >= n) {
            return (live(obs), Ok(()));
        }
        if !observing {
            return (None, Err((exit::PROTOCOL, "the server does not support observing this resource (no Observe option in the response)".into())));
        }
    }
}

/// Resolves on Ctrl-C, SIGTERM or a closed standard output.
async fn stop_requested() {
    let terminate = async {
        #[cfg(unix)]
        if let Ok(mut term) =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        {
            term.recv().await;
            return;
        }
        std::future::pending::<()>().await
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = terminate => {}
        () = sink::stdout_closed() => {}
    }
}

/// Ends the relation proactively, waiting at most [`CANCEL_WAIT`] (or until another
/// Ctrl-C) for the server's answer; a failure is only noted on stderr.
async fn deregister(obs: Observation) {
    let note = tokio::select! {
        r = tokio::time::timeout(CANCEL_WAIT, obs.cancel()) => match r {
            Ok(Ok(_)) => None,
            Ok(Err(e)) => Some(format!("could not end the observation: {e}")),
            Err(_) => Some(format!(
                "the server did not answer the request ending the observation within {}s",
                CANCEL_WAIT.as_secs()
            )),
        },
        _ = tokio::signal::ctrl_c() => None,
    };
    if let Some(note) = note {
        eprintln!("cobalt: note: {note}");
    }
}
