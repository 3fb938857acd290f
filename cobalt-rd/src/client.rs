//! The endpoint's side of the directory: [`RdClient`] registers, renews before the
//! lifetime runs out, registers again when the directory lost the registration
//! (answers 4.04, e.g. after a restart without storage), and removes; [`lookup`]
//! queries a lookup interface.

use crate::registration::DEFAULT_LIFETIME;
use cobalt::{content_format, Client, Code};
use cobalt_proto::link_format::{self, Link};
use std::time::Duration;

/// What went wrong talking to a directory.
#[derive(Debug, thiserror::Error)]
pub enum RdClientError {
    /// The request did not get an answer (see the inner error for what to try).
    #[error(transparent)]
    Coap(#[from] cobalt::Error),
    /// The directory answered with an error code.
    #[error("the resource directory answered {code}: {message}")]
    Refused {
        /// The response code.
        code: Code,
        /// Its diagnostic payload.
        message: String,
    },
    /// The answer was not what RFC 9176 prescribes.
    #[error("the resource directory's answer is unusable: {0}")]
    Protocol(String),
    /// An update or removal before any registration.
    #[error("not registered: call register() first")]
    NotRegistered,
}

/// One endpoint's registration at one directory.
///
/// ```no_run
/// # async fn run() -> Result<(), cobalt_rd::RdClientError> {
/// let mut rd = cobalt_rd::RdClient::new(cobalt::Client::new(), "coap://rd.example/rd", "sensor-1")
///     .lifetime(300)
///     .links("</temp>;rt=\"temperature\";obs");
/// rd.register().await?;
/// rd.keep_registered().await // renews every 240 s, until an error
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct RdClient {
    client: Client,
    registration_uri: String,
    ep: String,
    sector: Option<String>,
    lifetime: u32,
    base: Option<String>,
    links: String,
    location: Option<String>,
}

impl RdClient {
    /// A client for endpoint `ep` registering at the registration interface
    /// `registration_uri` (such as `coap://rd.example/rd`; see [`RdClient::discover`]).
    pub fn new(client: Client, registration_uri: &str, ep: &str) -> RdClient {
        RdClient {
            client,
            registration_uri: registration_uri.to_string(),
            ep: ep.to_string(),
            sector: None,
            lifetime: DEFAULT_LIFETIME,
            base: None,
            links: String::new(),
            location: None,
        }
    }

    /// Registers in sector `d`.
    pub fn sector(mut self, d: &str) -> RdClient {
        self.sector = Some(d.to_string());
        self
    }

    /// Asks for lifetime `seconds` (default 90,000).
    pub fn lifetime(mut self, seconds: u32) -> RdClient {
        self.lifetime = seconds.max(1);
        self
    }

    /// Gives `base` explicitly (by default the directory uses the source address).
    pub fn base(mut self, base: &str) -> RdClient {
        self.base = Some(base.to_string());
        self
    }

    /// The link-format document to register.
    pub fn links(mut self, links: impl Into<String>) -> RdClient {
        self.links = links.into();
        self
    }

    /// The registration resource's URI, once registered.
    pub fn location(&self) -> Option<&str> {
        self.location.as_deref()
    }

    /// Continues a registration made earlier (e.g. by another process) at `location`.
    pub fn at_location(mut self, location: &str) -> RdClient {
        self.location = Some(location.to_string());
        self
    }

    /// The registration interface of the directory at `origin` (`coap://host:port`),
    /// found by RD discovery: `/.well-known/core?rt=core.rd*`.
    pub async fn discover(client: &Client, origin: &str) -> Result<String, RdClientError> {
        let origin = origin.trim_end_matches('/');
        let links = get_links(client, &format!("{origin}/.well-known/core?rt=core.rd*")).await?;
        let found = links
            .iter()
            .find(|l| l.resource_types().any(|rt| rt == "core.rd"))
            .ok_or_else(|| {
                RdClientError::Protocol(format!("{origin} lists no rt=core.rd resource"))
            })?;
        Ok(absolute(origin, &found.target))
    }

    /// Registers (or replaces the registration of the same ep and d); returns the
    /// registration resource's URI.
    pub async fn register(&mut self) -> Result<&str, RdClientError> {
        let mut query = vec![("ep", self.ep.clone()), ("lt", self.lifetime.to_string())];
        if let Some(d) = &self.sector {
            query.push(("d", d.clone()));
        }
        if let Some(base) = &self.base {
            query.push(("base", base.clone()));
        }
        let uri = with_query(&self.registration_uri, &query);
        let r = self
            .client
            .request(Code::POST, &uri)
            .content_format(content_format::LINK_FORMAT)
            .payload(self.links.clone())
            .send()
            .await?;
        if r.code != Code::CREATED {
            return Err(refused(r));
        }
        let path = r
            .options
            .location_path_string()
            .ok_or_else(|| RdClientError::Protocol("2.01 without a Location-Path".into()))?;
        Ok(self
            .location
            .insert(absolute(origin_of(&self.registration_uri), &path)))
    }

    /// Renews the registration (an empty update); registers again if the directory
    /// answers 4.04 (it lost or expired the registration).
    pub async fn update(&mut self) -> Result<(), RdClientError> {
        let location = self.location.clone().ok_or(RdClientError::NotRegistered)?;
        let r = self
            .client
            .request(
                Code::POST,
                &with_query(&location, &[("lt", self.lifetime.to_string())]),
            )
            .send()
            .await?;
        match r.code {
            Code::CHANGED => Ok(()),
            Code::NOT_FOUND => {
                tracing::info!("{location} is gone at the directory; registering again");
                self.register().await.map(|_| ())
            }
            _ => Err(refused(r)),
        }
    }

    /// Removes the registration.
    pub async fn remove(&mut self) -> Result<(), RdClientError> {
        let location = self.location.take().ok_or(RdClientError::NotRegistered)?;
        let r = self.client.delete(&location).await?;
        match r.code {
            Code::DELETED | Code::NOT_FOUND => Ok(()),
            _ => Err(refused(r)),
        }
    }

    /// How long after a registration or renewal the next renewal is due: a minute
    /// before the lifetime ends, or at three quarters of a lifetime of 4 minutes or less.
    pub fn renew_interval(&self) -> Duration {
        renewal_interval(self.lifetime)
    }

    /// Renews at every [`RdClient::renew_interval`] forever, registering first if not
    /// registered. A failed renewal is retried after a tenth of the interval (a
    /// directory that is down for a while keeps the registration until it expires);
    /// returns only the error of a directory that refuses the registration outright.
    pub async fn keep_registered(&mut self) -> Result<(), RdClientError> {
        if self.location.is_none() {
            self.register().await?;
        }
        let mut wait = self.renew_interval();
        loop {
            tokio::time::sleep(wait).await;
            wait = match self.update().await {
                Ok(()) => self.renew_interval(),
                Err(e @ RdClientError::Refused { .. }) => return Err(e),
                Err(e) => {
                    tracing::warn!("renewing the registration failed: {e}; retrying");
                    (self.renew_interval() / 10).max(Duration::from_secs(1))
                }
            };
        }
    }
}

/// How long after registering or renewing with lifetime `lt` seconds an endpoint
/// renews: a minute before the lifetime ends, or at three quarters of a lifetime of 4
/// minutes or less (what aiocoap's registerer does too).
pub fn renewal_interval(lt: u32) -> Duration {
    let lt = u64::from(lt);
    Duration::from_secs(if lt > 240 {
        lt - 60
    } else {
        (lt * 3 / 4).max(1)
    })
}

/// The URI of the directory interface with resource type `rt` (`core.rd`,
/// `core.rd-lookup-ep`, `core.rd-lookup-res`) at `origin` (`coap://host:port`), found
/// by RD discovery: `/.well-known/core?rt=core.rd*`.
pub async fn find_interface(
    client: &Client,
    origin: &str,
    rt: &str,
) -> Result<String, RdClientError> {
    let origin = origin.trim_end_matches('/');
    let links = get_links(client, &format!("{origin}/.well-known/core?rt=core.rd*")).await?;
    let found = links
        .iter()
        .find(|l| l.resource_types().any(|t| t == rt))
        .ok_or_else(|| RdClientError::Protocol(format!("{origin} lists no rt={rt} resource")))?;
    Ok(absolute(origin, &found.target))
}

/// Looks up at `lookup_uri` (an endpoint or resource lookup interface) with `filters`
/// (`name`, `value`; a value ending in `*` matches by prefix).
pub async fn lookup(
    client: &Client,
    lookup_uri: &str,
    filters: &[(&str, &str)],
) -> Result<Vec<Link>, RdClientError> {
    let query: Vec<(&str, String)> = filters.iter().map(|(n, v)| (*n, v.to_string())).collect();
    get_links(client, &with_query(lookup_uri, &query)).await
}

async fn get_links(client: &Client, uri: &str) -> Result<Vec<Link>, RdClientError> {
    let r = client.get(uri).await?;
    if r.code != Code::CONTENT {
        return Err(refused(r));
    }
    link_format::parse(&r.text_payload())
        .map_err(|e| RdClientError::Protocol(format!("{uri} answered malformed link-format: {e}")))
}

fn refused(r: cobalt::Response) -> RdClientError {
    RdClientError::Refused {
        code: r.code,
        message: r.text_payload(),
    }
}

/// `scheme://authority` of `uri`.
fn origin_of(uri: &str) -> &str {
    let after_scheme = uri.find("://").map_or(0, |i| i + 3);
    match uri[after_scheme..].find('/') {
        Some(i) => &uri[..after_scheme + i],
        None => uri,
    }
}

fn absolute(origin: &str, target: &str) -> String {
    if target.contains("://") {
        target.to_string()
    } else {
        format!("{}/{}", origin_of(origin), target.trim_start_matches('/'))
    }
}

/// `uri` with `?name=value&…` appended, values percent-encoded where needed.
fn with_query(uri: &str, query: &[(&str, String)]) -> String {
    let mut out = uri.to_string();
    for (i, (name, value)) in query.iter().enumerate() {
        out.push(if i == 0 && !uri.contains('?') {
            '?'
        } else {
            '&'
        });
        out.push_str(name);
        out.push('=');
        for b in value.bytes() {
            if b.is_ascii_alphanumeric() || b"-._~:/*[]@!$'()+,;".contains(&b) {
                out.push(b as char);
            } else {
                out.push_str(&format!("%{b:02X}"));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uris_are_built_from_the_registration_interface() {
        assert_eq!(origin_of("coap://[::1]:5683/rd"), "coap://[::1]:5683");
        assert_eq!(origin_of("coaps://h"), "coaps://h");
        assert_eq!(absolute("coap://h:1/rd", "/rd/4"), "coap://h:1/rd/4");
        assert_eq!(absolute("coap://h:1", "coap://x/y"), "coap://x/y");
        let q = with_query(
            "coap://h/rd",
            &[("ep", "a b&c".into()), ("lt", "60".into())],
        );
        assert_eq!(q, "coap://h/rd?ep=a%20b%26c&lt=60");
    }

    #[test]
    fn renewal_comes_before_the_lifetime_runs_out() {
        let c = |lt| {
            RdClient::new(Client::new(), "coap://h/rd", "e")
                .lifetime(lt)
                .renew_interval()
        };
        assert_eq!(c(90_000), Duration::from_secs(89_940));
        assert_eq!(c(120), Duration::from_secs(90));
        assert_eq!(c(1), Duration::from_secs(1));
    }
}
