//! The device side of `cobalt rd`: register, update, remove and look up, over
//! [`cobalt_rd::RdClient`].

use crate::dtls_args::DtlsArgs;
use crate::exit;
use clap::{Args, ValueEnum};
use cobalt::transport::credentials::ClientCredentials;
use cobalt::Client;
use cobalt_rd::{RdClient, RdClientError};
use std::io::Read;
use std::path::PathBuf;

/// `cobalt rd register`.
#[derive(Debug, Args)]
pub struct RegisterArgs {
    /// The directory: its registration interface (`coap://host/rd`) or just
    /// `coap://host[:port]`, found then by discovery (`rt=core.rd`).
    rd: String,
    /// Endpoint name.
    #[arg(long)]
    ep: String,
    /// Sector.
    #[arg(long)]
    d: Option<String>,
    /// Lifetime in seconds (default 90000).
    #[arg(long)]
    lt: Option<u32>,
    /// Base URI of the links (default: the address the request comes from).
    #[arg(long)]
    base: Option<String>,
    /// The links to register, link-format, from FILE or `-` (stdin); none by default.
    #[arg(long, value_name = "FILE|-")]
    links: Option<PathBuf>,
    /// Stay and renew before the lifetime runs out (registering again after an RD
    /// restart that lost it), until interrupted; then remove the registration.
    #[arg(long)]
    keep: bool,
    #[command(flatten)]
    dtls: DtlsArgs,
}

/// `cobalt rd update`.
#[derive(Debug, Args)]
pub struct UpdateArgs {
    /// The registration's URI, as `register` printed it.
    location: String,
    /// New lifetime in seconds.
    #[arg(long)]
    lt: Option<u32>,
    /// New base URI.
    #[arg(long)]
    base: Option<String>,
    /// New links, link-format, from FILE or `-` (stdin).
    #[arg(long, value_name = "FILE|-")]
    links: Option<PathBuf>,
    #[command(flatten)]
    dtls: DtlsArgs,
}

/// `cobalt rd remove`.
#[derive(Debug, Args)]
pub struct RemoveArgs {
    /// The registration's URI, as `register` printed it.
    location: String,
    #[command(flatten)]
    dtls: DtlsArgs,
}

/// Which lookup.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum LookupWhat {
    /// Endpoints (`/rd-lookup/ep`).
    Ep,
    /// Resources (`/rd-lookup/res`).
    Res,
}

/// `cobalt rd lookup`.
#[derive(Debug, Args)]
pub struct LookupArgs {
    /// Endpoints or resources.
    #[arg(value_enum)]
    what: LookupWhat,
    /// The directory: `coap://host[:port]` (its lookup interfaces are found by
    /// discovery) or a lookup interface's URI.
    rd: String,
    /// Filters `name=value` (a value ending in `*` matches by prefix), and `page=N`,
    /// `count=N`.
    filters: Vec<String>,
    #[command(flatten)]
    dtls: DtlsArgs,
}

fn client(dtls: &DtlsArgs) -> Result<Client, (i32, String)> {
    let client = Client::new();
    Ok(match dtls.client_auth().map_err(|e| (exit::USAGE, e))? {
        Some(ClientCredentials::Psk(p)) => client.with_psk(p.identity, p.key),
        Some(ClientCredentials::X509(x)) => client.with_x509(x),
        None => client,
    })
}

fn read_links(from: &Option<PathBuf>) -> Result<Option<String>, (i32, String)> {
    let Some(path) = from else { return Ok(None) };
    let mut text = String::new();
    let read = if path.as_os_str() == "-" {
        std::io::stdin().read_to_string(&mut text).map(|_| ())
    } else {
        std::fs::read_to_string(path).map(|t| text = t)
    };
    read.map_err(|e| {
        (
            exit::USAGE,
            format!("cannot read the links from {}: {e}", path.display()),
        )
    })?;
    cobalt::proto::link_format::parse(text.trim()).map_err(|e| {
        (
            exit::USAGE,
            format!("{} is not link-format: {e}", path.display()),
        )
    })?;
    Ok(Some(text.trim().to_string()))
}

fn failed(e: RdClientError) -> (i32, String) {
    let code = match &e {
        RdClientError::Coap(e) => return crate::request::error_exit(e),
        RdClientError::Refused { code, .. } if code.class() == 4 => exit::CLIENT_ERROR,
        RdClientError::Refused { .. } => exit::SERVER_ERROR,
        RdClientError::Protocol(_) => exit::PROTOCOL,
        RdClientError::NotRegistered => exit::USAGE,
    };
    (code, e.to_string())
}

/// The registration interface named by `rd`: as given when it has a path, else found
/// by discovery.
async fn registration_interface(client: &Client, rd: &str) -> Result<String, (i32, String)> {
    let has_path = rd
        .split_once("://")
        .is_some_and(|(_, rest)| rest.trim_end_matches('/').contains('/'));
    if has_path {
        Ok(rd.to_string())
    } else {
        RdClient::discover(client, rd).await.map_err(failed)
    }
}

pub async fn register(args: RegisterArgs) -> Result<(), (i32, String)> {
    let client = client(&args.dtls)?;
    let uri = registration_interface(&client, &args.rd).await?;
    let mut rd = RdClient::new(client, &uri, &args.ep);
    if let Some(d) = &args.d {
        rd = rd.sector(d);
    }
    if let Some(lt) = args.lt {
        rd = rd.lifetime(lt);
    }
    if let Some(base) = &args.base {
        rd = rd.base(base);
    }
    if let Some(links) = read_links(&args.links)? {
        rd = rd.links(links);
    }
    let location = rd.register().await.map_err(failed)?.to_string();
    println!("{location}");
    if !args.keep {
        return Ok(());
    }
    eprintln!(
        "cobalt: renewing every {} s; Ctrl-C removes the registration",
        rd.renew_interval().as_secs()
    );
    tokio::select! {
        r = rd.keep_registered() => r.map_err(failed),
        _ = crate::serve::wait_for_signal() => rd.remove().await.map_err(failed),
    }
}

pub async fn update(args: UpdateArgs) -> Result<(), (i32, String)> {
    let client = client(&args.dtls)?;
    let mut uri = args.location.clone();
    let mut query = Vec::new();
    if let Some(lt) = args.lt {
        query.push(format!("lt={lt}"));
    }
    if let Some(base) = &args.base {
        query.push(format!("base={base}"));
    }
    if !query.is_empty() {
        uri = format!("{uri}?{}", query.join("&"));
    }
    let mut request = client.request(cobalt::Code::POST, &uri);
    if let Some(links) = read_links(&args.links)? {
        request = request
            .content_format(cobalt::content_format::LINK_FORMAT)
            .payload(links);
    }
    let r = request
        .send()
        .await
        .map_err(|e| crate::request::error_exit(&e))?;
    match r.code {
        cobalt::Code::CHANGED => Ok(()),
        code => Err(failed(RdClientError::Refused {
            code,
            message: r.text_payload(),
        })),
    }
}

pub async fn remove(args: RemoveArgs) -> Result<(), (i32, String)> {
    let client = client(&args.dtls)?;
    RdClient::new(client, &args.location, "")
        .at_location(&args.location)
        .remove()
        .await
        .map_err(failed)
}

pub async fn lookup(args: LookupArgs) -> Result<(), (i32, String)> {
    let client = client(&args.dtls)?;
    let rt = match args.what {
        LookupWhat::Ep => "core.rd-lookup-ep",
        LookupWhat::Res => "core.rd-lookup-res",
    };
    let has_path = args
        .rd
        .split_once("://")
        .is_some_and(|(_, rest)| rest.trim_end_matches('/').contains('/'));
    let uri = if has_path {
        args.rd.clone()
    } else {
        cobalt_rd::find_interface(&client, &args.rd, rt)
            .await
            .map_err(failed)?
    };
    let mut filters = Vec::new();
    for f in &args.filters {
        let (name, value) = f
            .split_once('=')
            .ok_or_else(|| (exit::USAGE, format!("filter `{f}` is not name=value")))?;
        filters.push((name, value));
    }
    let links = cobalt_rd::lookup_at(&client, &uri, &filters)
        .await
        .map_err(failed)?;
    for link in &links {
        println!(
            "{}",
            cobalt::proto::link_format::encode(std::slice::from_ref(link))
        );
    }
    Ok(())
}
