//! `cobalt get|post|put|delete|fetch|patch|ipatch|discover|observe`: the curl-like
//! client.

use crate::dtls_args::DtlsArgs;
use crate::flags::{Hex, RawOption};
use crate::sink::Output;
use crate::{exit, render, sink};
use clap::Args;
use cobalt::proto::link_format;
use cobalt::proto::message::{content_format, opt, Code, Token, DEFAULT_MAX_TOKEN_LEN};
use cobalt::proto::tcp_connection::TcpConfig;
use cobalt::transport::credentials::ClientCredentials;
use cobalt::{Client, Error, Observation, Response};
use std::path::PathBuf;
use std::time::Duration;

/// Options shared by every request command.
#[derive(Debug, Args)]
pub struct RequestArgs {
    /// Target, e.g. coap://127.0.0.1/hello or coap://[::1]:5683/path?query
    // The text is also the `--help` line, where brackets must stay unescaped.
    #[allow(rustdoc::broken_intra_doc_links)]
    pub uri: String,
    /// Request payload; `@FILE` reads it from a file, `@-` from standard input.
    #[arg(short, long)]
    pub payload: Option<String>,
    /// Content-Format of the payload: a number (0 to 65535) or a media type from the
    /// IANA registry (text/plain, json, cbor, senml+json, senml+cbor, link-format, ...).
    #[arg(short = 't', long, value_parser = crate::flags::content_format)]
    pub content_format: Option<u16>,
    /// Accept: the Content-Format wanted in the response (as for -t).
    #[arg(short = 'A', long, value_parser = crate::flags::content_format)]
    pub accept: Option<u16>,
    /// Add an option (repeatable), like libcoap's -O: NUM,VALUE or NAME,VALUE, e.g.
    /// `-O 2049,text`, `-O Max-Age,60`. VALUE `0x` and hex digits is bytes, a number is
    /// encoded as one for uint options, else text; `-O NUM` sends it empty.
    #[arg(short = 'O', long = "option", value_name = "NUM,VALUE", value_parser = crate::flags::coap_option)]
    pub options: Vec<RawOption>,
    /// ETag (hex, e.g. 0x1f2e; repeatable): asks whether a stored representation is
    /// still valid (answered 2.03 Valid).
    #[arg(long, value_name = "HEX", value_parser = crate::flags::hex)]
    pub etag: Vec<Hex>,
    /// If-Match (hex; repeatable): act only if the resource's ETag is one of these;
    /// `--if-match ''` for "if it exists".
    #[arg(long, value_name = "HEX", value_parser = crate::flags::hex)]
    pub if_match: Vec<Hex>,
    /// If-None-Match: act only if the resource does not exist yet.
    #[arg(long)]
    pub if_none_match: bool,
    /// Show the response code and options before the payload (like curl -i).
    #[arg(short, long)]
    pub include: bool,
    /// Write the answer to FILE instead of standard output; `-o -` prints it on
    /// standard output even when it is binary and that is a terminal.
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Pretty-print JSON and CBOR payloads (CBOR in diagnostic notation), by their
    /// Content-Format.
    #[arg(long)]
    pub pretty: bool,
    /// Send a non-confirmable request.
    #[arg(long)]
    pub non: bool,
    /// For a group URI (a multicast address such as coap://224.0.1.187/ or
    /// coap://[ff02::fd%eth0]/, with --non): print every answer that arrives within
    /// this many seconds (`3` or `3s`), each after a line naming its responder and
    /// the answer's code. Servers answer after a random Leisure (1 s for Cobalt, 5 s
    /// by RFC 7252's default) and send no errors, so wait longer than that.
    #[arg(long, value_name = "SECONDS", value_parser = crate::flags::wait)]
    pub wait: Option<Duration>,
    /// The request's token in hex (e.g. 0x1f2e) instead of a random one: up to 8 bytes
    /// for any server, longer (RFC 8974 extended tokens, up to 65804 bytes) for servers
    /// that accept them; a server that does not support extended tokens answers RST
    /// (a timeout here), one that does not accept the length 4.00 Bad Request.
    #[arg(long, value_name = "HEX", value_parser = crate::flags::token)]
    pub token: Option<Token>,
    /// Block size for block-wise transfer: 16, 32, 64, 128, 256, 512 or 1024 bytes
    /// (uploads use it; downloads ask the server for it). Default: 1024 for uploads
    /// over UDP; over coap+tcp and coap+ws a body goes whole when it fits the server's
    /// Max-Message-Size, else in the largest blocks that fit (BERT when both ends
    /// support it); the server's choice for downloads.
    #[arg(short = 'b', long)]
    pub block_size: Option<usize>,
    /// Q-Block (RFC 9177) over coap:// and coaps://: download the answer with
    /// Q-Block2 (the server sends the blocks in sets without a request per block, lost
    /// ones are asked for again, several per request), and upload a payload larger
    /// than one block with Q-Block1 (in sets of 10 blocks; the blocks the server lists
    /// as missing go again). A server without Q-Block is served as usual.
    #[arg(long)]
    pub q_block: bool,
    /// Give up after this many seconds overall (for `observe`: waiting for the first
    /// answer). 0: no overall limit, only the protocol's own (about 93 s of
    /// retransmissions for a confirmable request over UDP, 60 s over TCP). At most 1e6.
    #[arg(long, default_value_t = 30.0, value_parser = crate::flags::timeout)]
    pub timeout: f64,
    /// Show the request and response messages on standard error.
    #[arg(short, long)]
    pub verbose: bool,
    /// Retransmission timeouts over coap:// and coaps://: default (RFC 7252), cocoa,
    /// cocoa-strong, fasor (draft-ietf-core-fasor-02; the endpoint's default), fasor-k
    /// (FASOR keeping the backed-off timer) or karn (see `endpoint.congestion_control`).
    #[arg(long = "cc", value_name = "ALGORITHM", default_value_t = cobalt::EndpointConfig::default().congestion_control)]
    pub cc: cobalt::proto::congestion::Algorithm,
    /// DTLS credentials for coaps://.
    #[command(flatten)]
    pub dtls: DtlsArgs,
    /// coaps:// over Mbed TLS (a PSK, or --cert/--key with --ca), asking the server
    /// for a DTLS Connection ID (RFC 9146), so that the session survives a change of
    /// this client's address.
    #[arg(long)]
    pub cid: bool,
    /// Credentials file (aiocoap's JSON format): OSCORE contexts for the URIs it
    /// names (`{"coap://host/*": {"oscore": {"basedir": "dir/"}}}`), EDHOC run first
    /// to make one (`"edhoc-oscore"`: own_cred, private_key_file, peer_cred), DTLS PSKs
    /// (`"dtls"`) and CA certificates (`"tlscert"`) where no credential flag is given.
    #[arg(long, value_name = "FILE")]
    pub credentials: Option<PathBuf>,
    /// What the credentials file gives for the URI's transport (filled in when the
    /// client is made).
    #[arg(skip)]
    pub file_transport: Option<ClientCredentials>,
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

/// `cobalt discover` options.
#[derive(Debug, Args)]
pub struct DiscoverArgs {
    #[command(flatten)]
    pub request: RequestArgs,
    /// Print the link-format document as the server sent it, instead of one link per
    /// line.
    #[arg(long)]
    pub raw: bool,
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
    if let Some(cf) = args.content_format {
        b = b.content_format(cf);
    }
    if let Some(a) = args.accept {
        b = b.accept(a);
    }
    for Hex(tag) in &args.etag {
        b = b.option(opt::ETAG, tag.clone());
    }
    for Hex(tag) in &args.if_match {
        b = b.option(opt::IF_MATCH, tag.clone());
    }
    if args.if_none_match {
        b = b.option(opt::IF_NONE_MATCH, Vec::new());
    }
    for o in &args.options {
        b = b.option(o.number, o.value.clone());
    }
    if args.non {
        b = b.non_confirmable();
    }
    if let Some(token) = &args.token {
        b = b.token(token.clone());
    }
    let flags = args.dtls.client_auth().map_err(|e| (exit::USAGE, e))?;
    match flags.or_else(|| args.file_transport.clone()) {
        Some(ClientCredentials::Psk(p)) => b = b.psk(p.identity, p.key),
        Some(ClientCredentials::X509(x)) => b = b.x509(x),
        None if args.uri.trim().to_ascii_lowercase().starts_with("coaps://") => {
            return Err((
                exit::USAGE,
                "coaps:// needs credentials: --psk-identity ID --psk-key KEY, or --ca FILE \
                 (with --cert FILE --key FILE when the server wants a client certificate)"
                    .into(),
            ))
        }
        None => {}
    }
    if let Some(size) = args.block_size {
        b = b
            .block_size(size)
            .map_err(|e| (exit::USAGE, e.to_string()))?;
    }
    if args.q_block {
        b = b.q_block();
    }
    Ok(b)
}

/// The client of a request command: with `--credentials`, its OSCORE layer (after
/// EDHOC with the server when an `edhoc-oscore` entry matches the URI) and the file's
/// DTLS/TLS credentials for the URI noted in `args`.
async fn client_for(args: &mut RequestArgs) -> Result<Client, (i32, String)> {
    let mut client = tracing_client(args);
    if args.cid {
        client = client
            .with_dtls_cid()
            .map_err(|e| (exit::USAGE, format!("--cid: {e}")))?;
    }
    let Some(file) = &args.credentials else {
        return Ok(client);
    };
    let credentials =
        cobalt_oscore::Credentials::load(file).map_err(|e| (exit::USAGE, e.to_string()))?;
    let layer = match cobalt::proto::uri::CoapUri::parse(&args.uri) {
        Ok(uri) => {
            args.file_transport = credentials.client_transport_for(&uri).cloned();
            credentials
                .client_oscore(&client, &uri)
                .await
                .map_err(|e| edhoc_exit(&e))?
        }
        Err(_) => credentials.oscore(),
    };
    Ok(match layer {
        Some(oscore) => client.layer(oscore),
        None => client,
    })
}

/// The exit status and message for EDHOC that did not give a context.
fn edhoc_exit(e: &cobalt_oscore::edhoc::EdhocError) -> (i32, String) {
    use cobalt_oscore::edhoc::EdhocError;
    let code = match e {
        EdhocError::Request { source, .. } => return error_exit(source),
        EdhocError::Refused { code, .. } if code.class() == 5 => exit::SERVER_ERROR,
        EdhocError::Refused { .. } => exit::CLIENT_ERROR,
        EdhocError::Invalid { .. } | EdhocError::UnexpectedCredential => exit::PROTOCOL,
    };
    (code, format!("EDHOC: {e}"))
}

/// A client that prints every datagram with `-v`, and sends a `--token` of any length.
fn tracing_client(args: &RequestArgs) -> Client {
    // A token given with --token is sent whatever its length.
    let max_token_len = args.token.as_ref().map_or(DEFAULT_MAX_TOKEN_LEN, |t| {
        t.len().max(DEFAULT_MAX_TOKEN_LEN)
    });
    let config = cobalt::EndpointConfig {
        congestion_control: args.cc,
        max_token_len,
        ..cobalt::EndpointConfig::default()
    };
    let client = if args.verbose {
        traced_client(config)
    } else {
        Client::with_config(config).unwrap_or_default()
    };
    if max_token_len > DEFAULT_MAX_TOKEN_LEN {
        client.set_tcp_config(TcpConfig {
            max_token_len,
            ..TcpConfig::default()
        });
    }
    client
}

/// A client that prints every message it sends and receives on standard error.
fn traced_client(config: cobalt::EndpointConfig) -> Client {
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

/// Writes a response to `out`: with `-i` its code and options first, with `--pretty`
/// JSON and CBOR pretty-printed. Like curl, the payload goes out byte-exact; only a
/// terminal, a pretty-printed payload or (`one_per_line`) an observe notification gets
/// a final newline, and binary data is not written to a terminal (exit code 1 with a
/// hint). Returns false when the reader has gone away (see [`sink::write_stdout`]).
fn print_response(
    out: &mut Output,
    r: &Response,
    args: &RequestArgs,
    one_per_line: bool,
) -> Result<bool, (i32, String)> {
    let mut bytes = Vec::new();
    if args.include {
        bytes.extend_from_slice(render::head(r.code, &r.options).as_bytes());
    }
    let cf = r
        .options
        .get_uint(opt::CONTENT_FORMAT)
        .and_then(|v| u16::try_from(v).ok());
    let pretty = args
        .pretty
        .then(|| render::pretty(cf, &r.payload))
        .flatten();
    let body = match &pretty {
        Some(text) => text.as_bytes(),
        None if out.is_terminal() && render::is_binary(&r.payload) => {
            let what = match cf.map(|n| (n, content_format::name(n))) {
                Some((n, Some(name))) => format!(" ({name}, Content-Format {n})"),
                Some((n, None)) => format!(" (Content-Format {n})"),
                None => String::new(),
            };
            return Err((
                exit::FAILURE,
                format!(
                    "the answer is {} bytes of binary data{what}, not shown on the terminal: \
                     save it with -o FILE, or print it anyway with -o -{}",
                    r.payload.len(),
                    if cf.is_some_and(content_format::is_cbor) {
                        ", or read it with --pretty"
                    } else {
                        ""
                    }
                ),
            ));
        }
        None => &r.payload[..],
    };
    bytes.extend_from_slice(body);
    let newline = one_per_line || pretty.is_some() || out.is_terminal();
    if newline && !body.is_empty() && !body.ends_with(b"\n") {
        bytes.push(b'\n');
    }
    out.write(&bytes)
}

fn response_status(r: &Response) -> Result<(), (i32, String)> {
    match r.code.class() {
        2 => Ok(()),
        4 => Err((exit::CLIENT_ERROR, format!("server answered {}", r.code))),
        _ => Err((exit::SERVER_ERROR, format!("server answered {}", r.code))),
    }
}

/// How long a command waits on its way out for the client to end its DTLS sessions
/// and connections (a server that does not answer must not hold the exit up).
const CLOSE_WAIT: Duration = Duration::from_secs(2);

/// Ends what `client` opened before the process exits, which would otherwise cut it
/// off unannounced: DTLS sessions end with close_notify (the server would keep them
/// until its idle timeout), connections are released and closed.
async fn close(client: &Client) {
    let _ = tokio::time::timeout(CLOSE_WAIT, client.close()).await;
}

/// Runs one request command.
pub async fn run(method: Code, mut args: RequestArgs) -> Result<(), (i32, String)> {
    let client = client_for(&mut args).await?;
    let result = request_and_print(&client, method, &args).await;
    close(&client).await;
    result
}

/// Sends the request of a request command and prints the response.
async fn request_and_print(
    client: &Client,
    method: Code,
    args: &RequestArgs,
) -> Result<(), (i32, String)> {
    let request = build(client, method, args)?;
    let mut out = Output::open(args.output.as_deref())?;
    if let Some(wait) = group_wait(args)? {
        return ask_group_and_print(&mut out, request, args, wait).await;
    }
    let response = request.send().await.map_err(|e| error_exit(&e))?;
    print_response(&mut out, &response, args, false)?;
    response_status(&response)
}

/// How long to collect a group request's answers: `--wait` for a multicast URI
/// (`None` for any other), or why the flags do not fit a group request.
fn group_wait(args: &RequestArgs) -> Result<Option<Duration>, (i32, String)> {
    // A URI that does not parse is reported by the request as before.
    let Ok(uri) = cobalt::proto::uri::CoapUri::parse(&args.uri) else {
        return Ok(None);
    };
    let group = uri.ip().is_some_and(|ip| ip.is_multicast());
    match (group, args.wait, args.non) {
        (false, None, _) => Ok(None),
        (false, Some(_), _) => Err((
            exit::USAGE,
            format!(
                "--wait is for group requests, and {} is not a multicast address",
                uri.host
            ),
        )),
        (true, _, false) => Err((
            exit::USAGE,
            "a request to a multicast group must be non-confirmable (RFC 7252 §8.1): add --non"
                .into(),
        )),
        (true, None, true) => Err((
            exit::USAGE,
            "a group request needs --wait SECONDS: how long to collect the answers".into(),
        )),
        (true, Some(wait), true) => Ok(Some(wait)),
    }
}

/// Sends a group request and prints each answer after a line with its responder
/// and code; fails (exit 3) when none came within `wait`.
async fn ask_group_and_print(
    out: &mut Output,
    request: cobalt::RequestBuilder,
    args: &RequestArgs,
    wait: Duration,
) -> Result<(), (i32, String)> {
    let answers = request.multicast(wait).await.map_err(|e| error_exit(&e))?;
    for (from, response) in &answers {
        out.write(format!("== {from} {}\n", response.code).as_bytes())?;
        print_response(out, response, args, true)?;
    }
    if answers.is_empty() {
        return Err((
            exit::NETWORK,
            format!("no answer from the group within {wait:?}"),
        ));
    }
    Ok(())
}

/// `cobalt discover`: GET /.well-known/core and list the links, one per line, with
/// their attributes as the server wrote them (quoted values stay quoted), or the
/// document itself with `--raw`.
pub async fn discover(args: DiscoverArgs) -> Result<(), (i32, String)> {
    let DiscoverArgs {
        request: mut args,
        raw,
    } = args;
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
    let client = client_for(&mut args).await?;
    let result = list_links(&client, &args, raw).await;
    close(&client).await;
    result
}

/// GETs the link-format document of `discover` and lists its links (or prints it
/// whole with `raw`).
async fn list_links(client: &Client, args: &RequestArgs, raw: bool) -> Result<(), (i32, String)> {
    let request = build(client, Code::GET, args)?;
    let mut out = Output::open(args.output.as_deref())?;
    let response = request.send().await.map_err(|e| error_exit(&e))?;
    if raw || response.code.class() != 2 {
        print_response(&mut out, &response, args, false)?;
        return response_status(&response);
    }
    let text = response.text_payload();
    let mut listing = if args.include {
        render::head(response.code, &response.options)
    } else {
        String::new()
    };
    let result = match link_format::parse(&text) {
        Ok(links) => {
            for l in links {
                listing.push_str(&l.target);
                listing.push('\t');
                listing.push_str(&attributes(&l.attrs));
                listing.push('\n');
            }
            Ok(())
        }
        Err(e) => {
            listing.push_str(&text);
            listing.push('\n');
            Err((
                exit::PROTOCOL,
                format!("the server's link-format does not parse: {e}"),
            ))
        }
    };
    // A reader that goes away early ends it quietly.
    out.write(listing.as_bytes())?;
    result
}

/// A link's attributes as link-format writes them: `key=value`, the value quoted
/// unless it is a plain token (RFC 6690 §2: ptoken characters only).
fn attributes(attrs: &[(String, Option<String>)]) -> String {
    let ptoken = |v: &str| {
        !v.is_empty()
            && v.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'()*+-./:<=>?@[]^_`{|}~".contains(&b))
    };
    attrs
        .iter()
        .map(|(k, v)| match v {
            Some(v) if ptoken(v) => format!("{k}={v}"),
            Some(v) => format!("{k}=\"{}\"", v.replace('\\', "\\\\").replace('"', "\\\"")),
            None => k.clone(),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// How long `observe` waits, on its way out, for the server to answer the GET with
/// Observe=1 that ends the relation.
const CANCEL_WAIT: Duration = Duration::from_secs(5);

/// `cobalt observe`: prints each notification until `--count`, Ctrl-C, SIGTERM or a
/// closed standard output, then ends the relation with the server (GET with
/// Observe=1, RFC 7641 §3.6) instead of leaving it to time out.
pub async fn observe(mut args: ObserveArgs) -> Result<(), (i32, String)> {
    let client = client_for(&mut args.request).await?;
    let result = observe_and_print(&client, &args).await;
    close(&client).await;
    result
}

/// Registers, prints the notifications and deregisters for `cobalt observe`.
async fn observe_and_print(client: &Client, args: &ObserveArgs) -> Result<(), (i32, String)> {
    let req = &args.request;
    let obs = build(client, Code::GET, req)?
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
    let mut out = Output::open(req.output.as_deref())?;
    let (obs, result) = print_notifications(obs, &mut out, args, first_wait).await;
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
    out: &mut Output,
    args: &ObserveArgs,
    first_wait: Option<Duration>,
) -> (Option<Observation>, Result<(), (i32, String)>) {
    let count = args.count;
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
        match print_response(out, &r, &args.request, true) {
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
