//! One device's registration at a directory, sans-IO: the requests go out through the
//! device's own [`Endpoint`] (so the directory sees the address the device serves on,
//! which is what RFC 9176 takes as `base` and where an LwM2M server sends its
//! requests), and the answers come back as events.
//!
//! - **RFC 9176**: when the directory's URI has no path, the registration interface is
//!   found first by discovery (`GET /.well-known/core?rt=core.rd`); then `POST
//!   <interface>?ep=..&lt=..` with the links (2.01 and Location-Path), renewals `POST
//!   <location>?lt=..` (2.04) a minute before the lifetime ends
//!   ([`cobalt_rd::renewal_interval`]), and `DELETE <location>` at shutdown.
//! - **LwM2M 1.1** (§6.2.1, §6.2.2, §6.2.3): `POST /rd?ep=..&lt=..&lwm2m=1.1&b=U` with
//!   the object instances, Update `POST <location>` (empty), De-register `DELETE
//!   <location>`.
//!
//! A renewal answered 4.04 (the directory lost the registration, e.g. a restart
//! without storage) registers again. A failure (an error code, a timeout) is retried
//! with back-off from 5 s to 5 min, or after the Max-Age of a 5.03.

use crate::content::{format, Profile};
use cobalt_proto::endpoint::{Endpoint, RequestId};
use cobalt_proto::link_format;
use cobalt_proto::message::{opt, Code, Message, MessageType};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// Where devices register.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirectoryTarget {
    /// An RFC 9176 resource directory or an LwM2M server.
    pub profile: Profile,
    /// Its address.
    pub server: SocketAddr,
    /// The registration interface's path segments; empty: found by discovery (RFC
    /// 9176) or `/rd` (LwM2M).
    pub path: Vec<String>,
}

/// What a step of the registration came to, for the fleet's counters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Registered (2.01).
    Registered,
    /// Renewed (2.04).
    Renewed,
    /// The directory had lost the registration; registering again.
    Reregistering,
    /// Removed (2.02, or 4.04: already gone).
    Removed,
    /// An exchange failed: a response code (`4.03`) or `timeout`, `reset`,
    /// `unusable answer`.
    Failed(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    /// Register (or discover first) at this time.
    Due(Instant),
    Discovering(RequestId),
    Registering(RequestId),
    Registered {
        location: Vec<String>,
        renew_at: Instant,
    },
    Renewing {
        location: Vec<String>,
        id: RequestId,
    },
    Removing(RequestId),
    /// Removed, or never registered and told to stop.
    Done,
}

/// The registration of one device (see the [module docs](self)).
#[derive(Debug)]
pub struct Registrar {
    target: DirectoryTarget,
    interface: Option<Vec<String>>,
    lifetime: u32,
    state: State,
    failures: u32,
}

const MIN_RETRY: Duration = Duration::from_secs(5);
const MAX_RETRY: Duration = Duration::from_secs(300);

impl Registrar {
    /// A registration with lifetime `lifetime` seconds that starts at `start`.
    pub fn new(target: DirectoryTarget, lifetime: u32, start: Instant) -> Registrar {
        let interface = match (target.profile, target.path.is_empty()) {
            (_, false) => Some(target.path.clone()),
            (Profile::Lwm2m, true) => Some(vec!["rd".to_string()]),
            (Profile::Rd, true) => None,
        };
        Registrar {
            target,
            interface,
            lifetime: lifetime.max(1),
            state: State::Due(start),
            failures: 0,
        }
    }

    /// The registration resource's path, while registered.
    pub fn location(&self) -> Option<String> {
        match &self.state {
            State::Registered { location, .. } | State::Renewing { location, .. } => {
                Some(format!("/{}", location.join("/")))
            }
            _ => None,
        }
    }

    /// Whether it is finished (removed, or stopped before registering).
    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// When [`Registrar::poll`] has something to do next.
    pub fn next_timer(&self) -> Option<Instant> {
        match self.state {
            State::Due(at) => Some(at),
            State::Registered { renew_at, .. } => Some(renew_at),
            _ => None,
        }
    }

    /// Starts what is due at `now`: discovery, registration or renewal. A request the
    /// endpoint cannot take is a failure, retried later.
    pub fn poll(&mut self, now: Instant, ep: &str, endpoint: &mut Endpoint) -> Option<Outcome> {
        match &self.state {
            State::Due(at) if *at <= now => {
                let (request, discovering) = match &self.interface {
                    Some(path) => (self.registration(ep, path), false),
                    None => (discovery(), true),
                };
                match endpoint.request(now, self.target.server, request) {
                    Ok(id) if discovering => self.state = State::Discovering(id),
                    Ok(id) => self.state = State::Registering(id),
                    Err(_) => return Some(self.retry_later(now, None, "send failed")),
                }
            }
            State::Registered { location, renew_at } if *renew_at <= now => {
                let location = location.clone();
                let mut update = request(Code::POST, &location);
                update
                    .options
                    .push(opt::URI_QUERY, format!("lt={}", self.lifetime));
                match endpoint.request(now, self.target.server, update) {
                    Ok(id) => self.state = State::Renewing { location, id },
                    Err(_) => return Some(self.retry_later(now, None, "send failed")),
                }
            }
            _ => {}
        }
        None
    }

    /// Removes the registration (at shutdown): DELETE when registered; otherwise stops.
    pub fn remove(&mut self, now: Instant, endpoint: &mut Endpoint) {
        let location = match &self.state {
            State::Registered { location, .. } | State::Renewing { location, .. } => {
                location.clone()
            }
            State::Removing(_) => return,
            _ => {
                self.cancel_pending(now, endpoint);
                self.state = State::Done;
                return;
            }
        };
        self.cancel_pending(now, endpoint);
        self.state =
            match endpoint.request(now, self.target.server, request(Code::DELETE, &location)) {
                Ok(id) => State::Removing(id),
                Err(_) => State::Done,
            };
    }

    fn cancel_pending(&self, now: Instant, endpoint: &mut Endpoint) {
        if let Some(id) = self.pending() {
            endpoint.cancel(now, id);
        }
    }

    fn pending(&self) -> Option<RequestId> {
        match &self.state {
            State::Discovering(id) | State::Registering(id) | State::Removing(id) => Some(*id),
            State::Renewing { id, .. } => Some(*id),
            _ => None,
        }
    }

    /// The answer to request `id`; `None` when it is not one of the registration's.
    pub fn on_response(
        &mut self,
        now: Instant,
        id: RequestId,
        response: &Message,
    ) -> Option<Outcome> {
        if self.pending() != Some(id) {
            return None;
        }
        let code = response.code;
        let outcome = match std::mem::replace(&mut self.state, State::Done) {
            State::Discovering(_) if code == Code::CONTENT => {
                match registration_interface(&String::from_utf8_lossy(&response.payload)) {
                    Some(path) => {
                        self.interface = Some(path);
                        self.state = State::Due(now);
                        return None;
                    }
                    None => self.retry_later(now, None, "unusable answer"),
                }
            }
            State::Registering(_) if code == Code::CREATED => {
                let location: Vec<String> = response
                    .options
                    .get_all(opt::LOCATION_PATH)
                    .map(|s| String::from_utf8_lossy(s).into_owned())
                    .collect();
                if location.is_empty() {
                    self.retry_later(now, None, "unusable answer")
                } else {
                    self.registered(now, location);
                    Outcome::Registered
                }
            }
            State::Renewing { location, .. } if code == Code::CHANGED => {
                self.registered(now, location);
                Outcome::Renewed
            }
            State::Renewing { .. } if code == Code::NOT_FOUND => {
                self.state = State::Due(now);
                Outcome::Reregistering
            }
            State::Renewing { location, .. } => {
                let outcome = self.retry_later(now, Some(response), &code_number(code));
                self.state = State::Registered {
                    location,
                    renew_at: self.next_timer().unwrap_or(now),
                };
                outcome
            }
            State::Removing(_) if code == Code::DELETED || code == Code::NOT_FOUND => {
                Outcome::Removed
            }
            State::Removing(_) => Outcome::Failed(code_number(code)),
            _ => self.retry_later(now, Some(response), &code_number(code)),
        };
        Some(outcome)
    }

    /// Request `id` got no answer (`what`: `timeout`, `reset`); `None` when it is not
    /// one of the registration's.
    pub fn on_failure(&mut self, now: Instant, id: RequestId, what: &str) -> Option<Outcome> {
        if self.pending() != Some(id) {
            return None;
        }
        Some(match std::mem::replace(&mut self.state, State::Done) {
            State::Removing(_) => Outcome::Failed(what.to_string()),
            State::Renewing { location, .. } => {
                let outcome = self.retry_later(now, None, what);
                self.state = State::Registered {
                    location,
                    renew_at: self.next_timer().unwrap_or(now),
                };
                outcome
            }
            _ => self.retry_later(now, None, what),
        })
    }

    fn registered(&mut self, now: Instant, location: Vec<String>) {
        self.failures = 0;
        self.state = State::Registered {
            location,
            renew_at: now + cobalt_rd::renewal_interval(self.lifetime),
        };
    }

    /// Schedules the next attempt: after the Max-Age of a 5.03, else with back-off.
    fn retry_later(&mut self, now: Instant, response: Option<&Message>, what: &str) -> Outcome {
        self.failures = self.failures.saturating_add(1);
        let backoff = MIN_RETRY
            .saturating_mul(1 << self.failures.min(7).saturating_sub(1))
            .min(MAX_RETRY);
        let wait = match response {
            Some(r) if r.code == Code::SERVICE_UNAVAILABLE => {
                Duration::from_secs(u64::from(r.options.max_age()))
            }
            _ => backoff,
        };
        self.state = State::Due(now + wait);
        Outcome::Failed(what.to_string())
    }

    fn registration(&self, ep: &str, path: &[String]) -> Message {
        let mut m = request(Code::POST, path);
        m.options.push(opt::URI_QUERY, format!("ep={ep}"));
        m.options
            .push(opt::URI_QUERY, format!("lt={}", self.lifetime));
        if self.target.profile == Profile::Lwm2m {
            m.options.push(opt::URI_QUERY, "lwm2m=1.1");
            m.options.push(opt::URI_QUERY, "b=U");
        }
        m.options
            .set_uint(opt::CONTENT_FORMAT, u32::from(format::LINK_FORMAT));
        m.payload = link_format::encode(&self.target.profile.links()).into_bytes();
        m
    }
}

/// `4.03`: a response code as counted in the summary.
fn code_number(code: Code) -> String {
    format!("{}.{:02}", code.class(), code.detail())
}

fn request(method: Code, path: &[String]) -> Message {
    let mut m = Message::new(MessageType::Confirmable, method, 0);
    for segment in path {
        m.options.push(opt::URI_PATH, segment.as_bytes());
    }
    m
}

fn discovery() -> Message {
    let mut m = request(Code::GET, &[".well-known".into(), "core".into()]);
    m.options.push(opt::URI_QUERY, "rt=core.rd");
    m
}

/// The path of the `rt=core.rd` link in a discovery answer.
fn registration_interface(links: &str) -> Option<Vec<String>> {
    let links = link_format::parse(links).ok()?;
    let target = &links
        .iter()
        .find(|l| l.resource_types().any(|rt| rt == "core.rd"))?
        .target;
    let path = match target.find("://") {
        Some(i) => target[i + 3..]
            .find('/')
            .map_or("", |j| &target[i + 3 + j..]),
        None => target.as_str(),
    };
    // RFC 7252 §6.4: every segment is a Uri-Path option, a trailing empty one too
    // (aiocoap-rd's interface is `/resourcedirectory/`), except for the path `/`.
    let path = path.strip_prefix('/').unwrap_or(path);
    if path.is_empty() {
        return Some(Vec::new());
    }
    Some(path.split('/').map(str::to_string).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use cobalt_proto::endpoint::{EndpointConfig, Event};

    const RD: &str = "127.0.0.1:5683";

    /// A device endpoint and the directory's side of it, in virtual time.
    struct Pair {
        device: Endpoint,
        rd: Endpoint,
        now: Instant,
    }

    impl Pair {
        fn new() -> Pair {
            let now = Instant::now();
            Pair {
                device: Endpoint::with_seed(EndpointConfig::default(), now, 1),
                rd: Endpoint::with_seed(EndpointConfig::default(), now, 2),
                now,
            }
        }

        /// The request the device sent, as the directory sees it.
        fn request_at_rd(&mut self) -> (cobalt_proto::endpoint::ExchangeId, Message) {
            let tx = self
                .device
                .poll_transmit()
                .expect("the device sent a request");
            self.rd
                .handle_datagram(self.now, "127.0.0.1:40000".parse().unwrap(), &tx.bytes);
            match self.rd.poll_event() {
                Some(Event::Request { id, request, .. }) => (id, request),
                other => panic!("{other:?}"),
            }
        }

        /// The directory answers; returns what the registrar makes of it.
        fn answer(
            &mut self,
            reg: &mut Registrar,
            id: cobalt_proto::endpoint::ExchangeId,
            answer: Message,
        ) -> Option<Outcome> {
            self.rd.respond(self.now, id, answer).unwrap();
            let tx = self.rd.poll_transmit().unwrap();
            self.device
                .handle_datagram(self.now, RD.parse().unwrap(), &tx.bytes);
            match self.device.poll_event() {
                Some(Event::Response { id, response }) => reg.on_response(self.now, id, &response),
                other => panic!("{other:?}"),
            }
        }
    }

    fn target(profile: Profile, path: &[&str]) -> DirectoryTarget {
        DirectoryTarget {
            profile,
            server: RD.parse().unwrap(),
            path: path.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn created(location: &str) -> Message {
        let mut m = Message::new(MessageType::Acknowledgement, Code::CREATED, 0);
        for s in location.split('/').filter(|s| !s.is_empty()) {
            m.options.push(opt::LOCATION_PATH, s);
        }
        m
    }

    fn answer(code: Code) -> Message {
        Message::new(MessageType::Acknowledgement, code, 0)
    }

    #[test]
    fn discovers_registers_renews_and_removes() {
        let mut p = Pair::new();
        let mut reg = Registrar::new(target(Profile::Rd, &[]), 300, p.now);
        assert_eq!(reg.poll(p.now, "dev-1", &mut p.device), None);
        let (id, req) = p.request_at_rd();
        assert_eq!(req.options.uri_path_string(), "/.well-known/core");
        let mut links = answer(Code::CONTENT);
        links.payload =
            b"</resourcedirectory/>;rt=\"core.rd\",</lookup>;rt=\"core.rd-lookup-ep\"".to_vec();
        assert_eq!(p.answer(&mut reg, id, links), None);

        reg.poll(p.now, "dev-1", &mut p.device);
        let (id, req) = p.request_at_rd();
        assert_eq!(req.code, Code::POST);
        let path: Vec<&str> = req.options.uri_path().collect();
        assert_eq!(
            path,
            ["resourcedirectory", ""],
            "the trailing slash is kept"
        );
        let query: Vec<&str> = req.options.uri_query().collect();
        assert_eq!(query, ["ep=dev-1", "lt=300"]);
        assert_eq!(req.options.content_format(), Some(format::LINK_FORMAT));
        assert!(String::from_utf8_lossy(&req.payload).contains("rt=\"temperature\""));
        assert_eq!(
            p.answer(&mut reg, id, created("/reg/7")),
            Some(Outcome::Registered)
        );
        assert_eq!(reg.location().as_deref(), Some("/reg/7"));

        // Nothing until a minute before the lifetime ends.
        let renew_at = reg.next_timer().unwrap();
        assert_eq!(renew_at, p.now + Duration::from_secs(240));
        p.now = renew_at - Duration::from_millis(1);
        reg.poll(p.now, "dev-1", &mut p.device);
        assert!(p.device.poll_transmit().is_none());
        p.now = renew_at;
        reg.poll(p.now, "dev-1", &mut p.device);
        let (id, req) = p.request_at_rd();
        assert_eq!(
            (req.code, req.options.uri_path_string()),
            (Code::POST, "/reg/7".into())
        );
        assert!(req.payload.is_empty());
        assert_eq!(
            p.answer(&mut reg, id, answer(Code::CHANGED)),
            Some(Outcome::Renewed)
        );

        // The directory forgot it: register again at once.
        p.now = reg.next_timer().unwrap();
        reg.poll(p.now, "dev-1", &mut p.device);
        let (id, _) = p.request_at_rd();
        assert_eq!(
            p.answer(&mut reg, id, answer(Code::NOT_FOUND)),
            Some(Outcome::Reregistering)
        );
        assert_eq!(reg.next_timer(), Some(p.now));
        reg.poll(p.now, "dev-1", &mut p.device);
        let (id, req) = p.request_at_rd();
        assert_eq!(req.options.uri_path_string(), "/resourcedirectory/");
        assert_eq!(
            p.answer(&mut reg, id, created("/reg/8")),
            Some(Outcome::Registered)
        );

        reg.remove(p.now, &mut p.device);
        let (id, req) = p.request_at_rd();
        assert_eq!(
            (req.code, req.options.uri_path_string()),
            (Code::DELETE, "/reg/8".into())
        );
        assert_eq!(
            p.answer(&mut reg, id, answer(Code::DELETED)),
            Some(Outcome::Removed)
        );
        assert!(reg.is_done());
    }

    #[test]
    fn lwm2m_registration_carries_the_binding_and_objects() {
        let mut p = Pair::new();
        let mut reg = Registrar::new(target(Profile::Lwm2m, &[]), 60, p.now);
        reg.poll(p.now, "node-3", &mut p.device);
        let (id, req) = p.request_at_rd();
        assert_eq!(req.options.uri_path_string(), "/rd");
        let query: Vec<&str> = req.options.uri_query().collect();
        assert_eq!(query, ["ep=node-3", "lt=60", "lwm2m=1.1", "b=U"]);
        assert_eq!(
            String::from_utf8_lossy(&req.payload),
            "</1/0>,</3/0>,</3303/0>"
        );
        assert_eq!(
            p.answer(&mut reg, id, created("/rd/abc")),
            Some(Outcome::Registered)
        );
        assert_eq!(
            reg.next_timer(),
            Some(p.now + Duration::from_secs(45)),
            "¾ of a short lifetime"
        );
    }

    #[test]
    fn refusals_and_timeouts_back_off() {
        let mut p = Pair::new();
        let mut reg = Registrar::new(target(Profile::Rd, &["rd"]), 300, p.now);
        reg.poll(p.now, "d", &mut p.device);
        let (id, _) = p.request_at_rd();
        let mut busy = answer(Code::SERVICE_UNAVAILABLE);
        busy.options.set_uint(opt::MAX_AGE, 60);
        assert_eq!(
            p.answer(&mut reg, id, busy),
            Some(Outcome::Failed("5.03".into()))
        );
        assert_eq!(
            reg.next_timer(),
            Some(p.now + Duration::from_secs(60)),
            "Max-Age"
        );

        p.now += Duration::from_secs(60);
        reg.poll(p.now, "d", &mut p.device);
        let (id, _) = p.request_at_rd();
        assert_eq!(
            p.answer(&mut reg, id, answer(Code::FORBIDDEN)),
            Some(Outcome::Failed("4.03".into()))
        );
        assert_eq!(
            reg.next_timer(),
            Some(p.now + Duration::from_secs(10)),
            "second failure: 10 s"
        );

        p.now += Duration::from_secs(10);
        reg.poll(p.now, "d", &mut p.device);
        let pending = reg.pending().unwrap();
        assert_eq!(
            reg.on_failure(p.now, pending, "timeout"),
            Some(Outcome::Failed("timeout".into()))
        );
        assert_eq!(reg.next_timer(), Some(p.now + Duration::from_secs(20)));
        assert!(reg.location().is_none());
        // Not the registration's request: not its business.
        reg.poll(p.now + Duration::from_secs(20), "d", &mut p.device);
        let other = RequestId(u64::MAX);
        assert_eq!(reg.on_failure(p.now, other, "timeout"), None);
    }

    #[test]
    fn discovery_answers_name_the_interface() {
        assert_eq!(
            registration_interface("</rd>;rt=\"core.rd\""),
            Some(vec!["rd".to_string()])
        );
        assert_eq!(
            registration_interface("<coap://h:1/a/b>;rt=\"core.rd\""),
            Some(vec!["a".to_string(), "b".to_string()])
        );
        assert_eq!(
            registration_interface("</x>;rt=\"core.rd-lookup-ep\""),
            None
        );
        assert_eq!(
            registration_interface("</resourcedirectory/>;rt=\"core.rd\""),
            Some(vec!["resourcedirectory".to_string(), String::new()]),
            "a trailing slash is an empty segment"
        );
        assert_eq!(
            registration_interface("</>;rt=\"core.rd\""),
            Some(Vec::new())
        );
        assert_eq!(registration_interface("<<garbage"), None);
    }
}
