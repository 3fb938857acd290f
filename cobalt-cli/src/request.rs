//! `cobalt get|post|put|delete|discover|observe`: the curl-like client.

use crate::dtls_args::DtlsArgs;
use crate::exit;
use clap::Args;
use cobalt::proto::link_format;
use cobalt::proto::message::{content_format, Code};
use cobalt::transport::dtls::DtlsClientAuth;
use cobalt::{Client, Error, Response};
use std::io::Write;
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
    /// Give up after this many seconds overall.
    #[arg(long, default_value_t = 30.0)]
    pub timeout: f64,
    /// Show the request and response messages on standard error.
    #[arg(short, long)]
    pub verbose: bool,
    /// Retransmission timeouts over coap:// and coaps://: default (RFC 7252), cocoa,
    /// cocoa-strong, fasor or karn (see `endpoint.congestion_control`).
    #[arg(long = "cc", value_name = "ALGORITHM", default_value = "default")]
    pub cc: cobalt::proto::congestion::Algorithm,
    /// DTLS credentials for coaps://.
    #[command(flatten)]
    pub dtls: DtlsArgs,
}

/// `cobalt observe` options.
#[derive(Debug, Args)]
pub struct ObserveArgs {
    #[command(flatten)]
    pub request: RequestArgs,
    /// Stop after this many notifications (default: until Ctrl-C).
    #[arg(short = 'n', long)]
    pub count: Option<usize>,
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
    let mut b = client
        .request(method, &args.uri)
        .timeout(Duration::from_secs_f64(args.timeout.max(0.001)));
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
    let config = cobalt::EndpointConfig {
        congestion_control: args.cc,
        ..cobalt::EndpointConfig::default()
    };
    if !args.verbose {
        return Client::with_config(config).unwrap_or_default();
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
    let client = Client::with_tracer(config, tracer).unwrap_or_default();
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
/// (or, with `one_per_line`, each observe notification) gets a final newline.
fn print_payload(r: &Response, one_per_line: bool) {
    use std::io::IsTerminal;
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(&r.payload);
    let newline = one_per_line || out.is_terminal();
    if newline && !r.payload.is_empty() && !r.payload.ends_with(b"\n") {
        let _ = out.write_all(b"\n");
    }
    let _ = out.flush();
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
    print_payload(&response, false);
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
                println!("{}\t{}", l.target, attrs.join(" "));
            }
            Ok(())
        }
        Err(e) => {
            println!("{text}");
            Err((
                exit::PROTOCOL,
                format!("the server's link-format does not parse: {e}"),
            ))
        }
    }
}

/// `cobalt observe`: print each notification until Ctrl-C or `--count`.
pub async fn observe(args: ObserveArgs) -> Result<(), (i32, String)> {
    let req = &args.request;
    let client = client_for(req);
    let mut obs = build(&client, Code::GET, req)?
        .observe()
        .await
        .map_err(|e| error_exit(&e))?;
    let mut seen = 0usize;
    loop {
        let next = tokio::select! {
            n = obs.next() => n,
            _ = tokio::signal::ctrl_c() => return Ok(()),
        };
        match next {
            Some(Ok(r)) => {
                print_payload(&r, true);
                response_status(&r)?;
                seen += 1;
                if args.count.is_some_and(|n| seen >= n) {
                    return Ok(());
                }
                if r.options.observe().is_none() {
                    return Err((exit::PROTOCOL, "the server does not support observing this resource (no Observe option in the response)".into()));
                }
            }
            Some(Err(e)) => return Err(error_exit(&e)),
            None => return Err((exit::NETWORK, "the observation ended".into())),
        }
    }
}
