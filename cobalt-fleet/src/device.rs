//! One simulated device, sans-IO: a CoAP [`Endpoint`] in both roles (serving its
//! resources and observers, registering at a directory), its sensors, and the
//! observers of its resources, driven with an explicit `now` like the endpoint itself.
//! [`crate::fleet`] runs many of them on sockets.
//!
//! Observers are kept in the protocol crate's relation table with its confirmable
//! policy (every 20th notification, or one a day, is confirmable); at most
//! [`DeviceSettings::max_observers`] per device, beyond which a registration is
//! answered without Observe (RFC 7641 §4.1: the resource is served, not observed).
//! A relation ends on RST, on a confirmable notification that is not acknowledged, on
//! GET with Observe=1, and when the observer's address is never verified.

use crate::content::{format, Profile, View};
use crate::registration::{DirectoryTarget, Outcome, Registrar};
use crate::sensor::{Quantity, Sensor};
use crate::stats::FleetStats;
use cobalt_proto::endpoint::{Endpoint, EndpointConfig, Event, ExchangeId, Transmit};
use cobalt_proto::message::{opt, Code, Message, MessageType};
use cobalt_proto::observe::relations::{ConPolicy, Relation, Relations};
use cobalt_proto::observe::SEQ_MASK;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What every device of a fleet shares.
#[derive(Debug, Clone)]
pub struct DeviceSettings {
    /// Which resources the devices serve and how they register.
    pub profile: Profile,
    /// Where they register, if anywhere.
    pub directory: Option<DirectoryTarget>,
    /// Registration lifetime in seconds.
    pub lifetime: u32,
    /// Time between two changes of a sensor; `None`: the values never change.
    pub change_every: Option<Duration>,
    /// Most observe relations per device.
    pub max_observers: usize,
    /// When notifications are confirmable.
    pub con_policy: ConPolicy,
    /// The protocol parameters of each device's endpoint.
    pub endpoint: EndpointConfig,
}

impl DeviceSettings {
    /// Devices of `profile` that register nowhere, change once a second, and take 8
    /// observers each.
    pub fn new(profile: Profile) -> DeviceSettings {
        DeviceSettings {
            profile,
            directory: None,
            lifetime: 300,
            change_every: Some(Duration::from_secs(1)),
            max_observers: 8,
            con_policy: ConPolicy::default(),
            endpoint: EndpointConfig::default(),
        }
    }
}

/// One simulated device (see the [module docs](self)).
#[derive(Debug)]
pub struct Device {
    ep: String,
    settings: Arc<DeviceSettings>,
    stats: Arc<FleetStats>,
    endpoint: Endpoint,
    sensors: [Sensor; 2],
    relations: Relations<ExchangeId>,
    registrar: Option<Registrar>,
    next_change: Option<Instant>,
    stopping: bool,
}

impl Device {
    /// Device number `index`, named `ep`, started at `now`; its first change comes
    /// after `first_change` (spread changes of many devices over the interval), its
    /// registration starts at `register_at`.
    pub fn new(
        index: u32,
        ep: String,
        settings: Arc<DeviceSettings>,
        stats: Arc<FleetStats>,
        now: Instant,
        first_change: Duration,
        register_at: Instant,
    ) -> Device {
        let registrar = settings
            .directory
            .clone()
            .map(|target| Registrar::new(target, settings.lifetime, register_at));
        Device {
            ep,
            endpoint: Endpoint::new(settings.endpoint.clone(), now),
            sensors: Quantity::ALL.map(|q| Sensor::new(q, index)),
            relations: Relations::default(),
            registrar,
            next_change: settings.change_every.map(|_| now + first_change),
            stopping: false,
            settings,
            stats,
        }
    }

    /// The endpoint name.
    pub fn ep(&self) -> &str {
        &self.ep
    }

    /// The registration resource's path, while registered.
    pub fn location(&self) -> Option<String> {
        self.registrar.as_ref()?.location()
    }

    /// Observe relations held now.
    pub fn observers(&self) -> usize {
        self.relations.len()
    }

    /// The sensor of `quantity`.
    pub fn sensor(&self, quantity: Quantity) -> &Sensor {
        &self.sensors[quantity.index()]
    }

    /// A datagram from `peer`.
    pub fn handle_datagram(&mut self, now: Instant, peer: SocketAddr, bytes: &[u8]) {
        self.endpoint.handle_datagram(now, peer, bytes);
        self.process(now);
    }

    /// Runs what is due at `now`: retransmissions, sensor changes (notifying
    /// observers), registration steps.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.endpoint.handle_timeout(now);
        if let (Some(at), Some(every)) = (self.next_change, self.settings.change_every) {
            if at <= now && !self.stopping {
                self.change(now);
                // One change per interval; a device that fell behind skips, not bursts.
                let next = at + every;
                self.next_change = Some(if next <= now { now + every } else { next });
            }
        }
        self.process(now);
    }

    /// The next datagram to send.
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.endpoint.poll_transmit()
    }

    /// Gives a sent datagram's buffer back for later ones.
    pub fn recycle(&mut self, bytes: Vec<u8>) {
        self.endpoint.recycle(bytes);
    }

    /// When [`Device::handle_timeout`] must run next.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let change = self.next_change.filter(|_| !self.stopping);
        let registration = self.registrar.as_ref().and_then(Registrar::next_timer);
        [self.endpoint.poll_timeout(), change, registration]
            .into_iter()
            .flatten()
            .min()
    }

    /// Stops changing and removes the registration (DELETE) if there is one.
    pub fn stop(&mut self, now: Instant) {
        self.stopping = true;
        if let Some(r) = self.registrar.as_mut() {
            r.remove(now, &mut self.endpoint);
        }
        self.process(now);
    }

    /// Stops waiting for the removal's answer: counted as the error `removal
    /// unanswered` if one was under way.
    pub fn give_up(&self) {
        if self.registrar.as_ref().is_some_and(|r| !r.is_done()) {
            self.stats.error("removal unanswered");
        }
    }

    /// After [`Device::stop`]: nothing left to wait for (the registration is removed,
    /// or there was none).
    pub fn is_stopped(&self) -> bool {
        self.stopping && self.registrar.as_ref().is_none_or(Registrar::is_done)
    }

    /// The DTLS handshake with the directory failed (counted; the registration's
    /// retransmissions start another).
    pub fn dtls_failed(&self) {
        self.stats.error("dtls handshake");
    }

    /// The sensors move one step and their observers are notified.
    fn change(&mut self, now: Instant) {
        for q in Quantity::ALL {
            self.sensors[q.index()].advance();
            self.notify(now, q);
        }
    }

    fn notify(&mut self, now: Instant, q: Quantity) {
        let version = u64::from(self.sensors[q.index()].changes());
        for key in self.relations.keys_of(q.index() as u64, |_| true) {
            let Some((_, rel)) = self.relations.get(&key) else {
                continue;
            };
            let con = rel.next_is_confirmable(&self.settings.con_policy, now, false, true);
            let replaces = rel
                .last
                .filter(|(_, mid)| self.endpoint.is_unacknowledged(key.0, *mid));
            let notification = match self.answer(&rel.request) {
                Ok(m) => m,
                Err(_) => continue,
            };
            let last = self
                .endpoint
                .notify(now, key.0, key.1.clone(), notification, con, replaces);
            if let Some((_, rel)) = self.relations.get_mut(&key) {
                rel.sent(now, con, version);
            }
            self.relations.set_last(&key, last);
            self.stats.notified();
        }
    }

    /// The answer to GET `request` (without type, MID and token): 2.05 with the
    /// representation and, for an observable resource, its sequence number.
    fn answer(&self, request: &Message) -> Result<Message, Code> {
        let path: Vec<&str> = request.options.uri_path().collect();
        let view = View {
            ep: &self.ep,
            lifetime: self.settings.lifetime,
            sensors: &self.sensors,
        };
        let profile = self.settings.profile;
        let mut m = Message::new(MessageType::Acknowledgement, Code::CONTENT, 0);
        if path == [".well-known", "core"] {
            m.options
                .set_uint(opt::CONTENT_FORMAT, u32::from(format::LINK_FORMAT));
            m.payload = profile
                .well_known_core(request.options.uri_query())
                .into_bytes();
            return Ok(m);
        }
        let rep = profile.read(&view, &path, request.options.accept())?;
        if let Some(q) = profile.observable(&path) {
            m.options
                .set_uint(opt::OBSERVE, self.sensors[q.index()].changes() & SEQ_MASK);
        }
        m.options
            .set_uint(opt::CONTENT_FORMAT, u32::from(rep.format));
        m.payload = rep.body;
        Ok(m)
    }

    fn process(&mut self, now: Instant) {
        while let Some(event) = self.endpoint.poll_event() {
            match event {
                Event::Request { id, peer, request } => self.serve(now, id, peer, request),
                Event::Response { id, response } => {
                    if let Some(r) = self.registrar.as_mut() {
                        if let Some(o) = r.on_response(now, id, &response) {
                            self.count(o);
                        }
                    }
                }
                Event::Timeout { id, .. } => self.registration_failed(now, id, "timeout"),
                Event::Reset { id, .. } => self.registration_failed(now, id, "reset"),
                Event::UnmatchedReset { peer, mid } => {
                    if let Some(key) = self.relations.by_peer_mid(peer, mid) {
                        self.relations.remove(&key);
                    }
                }
                Event::ResponseFailed { id, .. } => {
                    if let Some(key) = self.relations.by_exchange(id) {
                        self.relations.remove(&key);
                    }
                }
                Event::Unverified { peer, token, .. } => {
                    self.relations.remove(&(peer, token));
                }
                Event::Verified { .. } => {}
            }
        }
        if let Some(r) = self.registrar.as_mut() {
            if !self.stopping {
                if let Some(o) = r.poll(now, &self.ep, &mut self.endpoint) {
                    self.count(o);
                }
            }
        }
    }

    fn registration_failed(
        &mut self,
        now: Instant,
        id: cobalt_proto::endpoint::RequestId,
        what: &str,
    ) {
        if let Some(r) = self.registrar.as_mut() {
            if let Some(o) = r.on_failure(now, id, what) {
                self.count(o);
            }
        }
    }

    fn count(&self, outcome: Outcome) {
        match outcome {
            Outcome::Registered => self.stats.registered(),
            Outcome::Renewed => self.stats.renewed(),
            Outcome::Reregistering => {
                self.stats.reregistering();
                self.stats.unregistered();
            }
            Outcome::Removed => {
                self.stats.deregistered();
                self.stats.unregistered();
            }
            Outcome::Failed(what) => self.stats.error(&what),
        }
    }

    fn serve(&mut self, now: Instant, id: ExchangeId, peer: SocketAddr, request: Message) {
        self.stats.answered();
        let response = match request.code {
            Code::GET => self.get(now, peer, request),
            Code::POST => {
                let path: Vec<&str> = request.options.uri_path().collect();
                let view = View {
                    ep: &self.ep,
                    lifetime: self.settings.lifetime,
                    sensors: &self.sensors,
                };
                Message::new(
                    MessageType::Acknowledgement,
                    self.settings.profile.execute(&view, &path),
                    0,
                )
            }
            _ => Message::new(MessageType::Acknowledgement, Code::METHOD_NOT_ALLOWED, 0),
        };
        let _ = self.endpoint.respond(now, id, response);
    }

    /// GET: the representation; with Observe=0 on an observable resource also a
    /// relation (while there is room), with Observe=1 the end of one.
    fn get(&mut self, now: Instant, peer: SocketAddr, request: Message) -> Message {
        let key = (peer, request.token.clone());
        let mut answer = match self.answer(&request) {
            Ok(m) => m,
            Err(code) => {
                self.relations.remove(&key);
                return Message::new(MessageType::Acknowledgement, code, 0);
            }
        };
        let path: Vec<&str> = request.options.uri_path().collect();
        let observable = self.settings.profile.observable(&path);
        match (request.options.observe(), observable) {
            (Some(0), Some(q)) => {
                let room = self.relations.contains(&key)
                    || self.relations.len() < self.settings.max_observers;
                if room {
                    let version = u64::from(self.sensors[q.index()].changes());
                    self.relations.insert(
                        q.index() as u64,
                        key,
                        Relation::new(request, now, version),
                    );
                } else {
                    answer.options.remove(opt::OBSERVE);
                }
            }
            (Some(1), _) => {
                self.relations.remove(&key);
                answer.options.remove(opt::OBSERVE);
            }
            _ => answer.options.remove(opt::OBSERVE),
        }
        answer
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cobalt_proto::message::codec;
    use cobalt_proto::message::Token;

    const OBSERVER: &str = "127.0.0.1:40000";

    fn device(profile: Profile, max_observers: usize) -> (Device, Instant) {
        let now = Instant::now();
        let mut settings = DeviceSettings::new(profile);
        settings.max_observers = max_observers;
        // Observers on loopback answer pings at once; no need to verify them here.
        settings.endpoint.amplification_factor = 0;
        let d = Device::new(
            3,
            "dev-3".into(),
            Arc::new(settings),
            Arc::new(FleetStats::default()),
            now,
            Duration::from_secs(1),
            now,
        );
        (d, now)
    }

    fn get(path: &str, observe: Option<u32>, token: u8, mid: u16) -> Vec<u8> {
        let mut m = Message::new(MessageType::Confirmable, Code::GET, mid);
        m.token = Token::new(&[token]).unwrap();
        if let Some(o) = observe {
            m.options.set_uint(opt::OBSERVE, o);
        }
        m.options.set_uri_path(path);
        codec::encode(&m)
    }

    fn sent(d: &mut Device) -> Vec<Message> {
        std::iter::from_fn(|| d.poll_transmit())
            .map(|t| codec::decode(&t.bytes).unwrap())
            .collect()
    }

    #[test]
    fn observers_get_each_change_until_they_reset() {
        let (mut d, mut now) = device(Profile::Rd, 8);
        let peer = OBSERVER.parse().unwrap();
        d.handle_datagram(now, peer, &get("/sensors/temp", Some(0), 1, 10));
        let first = sent(&mut d);
        assert_eq!(first.len(), 1);
        assert_eq!(first[0].code, Code::CONTENT);
        assert_eq!(first[0].options.observe(), Some(0));
        assert_eq!(d.observers(), 1);

        now += Duration::from_secs(1);
        assert_eq!(d.poll_timeout(), Some(now));
        d.handle_timeout(now);
        let notes = sent(&mut d);
        assert_eq!(notes.len(), 1, "only the temperature is observed");
        // (The first notifications to a new peer are confirmable: congestion control.)
        assert_eq!(notes[0].options.observe(), Some(1));
        let shown: f32 = String::from_utf8_lossy(&notes[0].payload).parse().unwrap();
        assert_eq!(shown, d.sensor(Quantity::Temperature).value());
        assert_eq!(d.stats.summary().notifications, 1);

        // The observer went away: RST (to a CON or a NON notification) ends the relation.
        d.handle_datagram(now, peer, &codec::encode(&Message::reset(notes[0].mid)));
        assert_eq!(d.observers(), 0);
        now += Duration::from_secs(1);
        d.handle_timeout(now);
        assert!(sent(&mut d).is_empty());
    }

    #[test]
    fn observers_beyond_the_bound_are_served_without_a_relation() {
        let (mut d, now) = device(Profile::Lwm2m, 2);
        let peer = OBSERVER.parse().unwrap();
        for token in 1..=3u8 {
            d.handle_datagram(
                now,
                peer,
                &get("/3303/0/5700", Some(0), token, u16::from(token)),
            );
        }
        let answers = sent(&mut d);
        assert_eq!(answers.len(), 3);
        assert!(answers.iter().all(|a| a.code == Code::CONTENT));
        assert_eq!(
            answers
                .iter()
                .filter(|a| a.options.observe().is_some())
                .count(),
            2
        );
        assert_eq!(d.observers(), 2);
        // Observe=1 ends one.
        d.handle_datagram(now, peer, &get("/3303/0/5700", Some(1), 1, 9));
        assert_eq!(sent(&mut d)[0].options.observe(), None);
        assert_eq!(d.observers(), 1);
    }

    #[test]
    fn lwm2m_device_answers_reads_and_refuses_writes() {
        let (mut d, now) = device(Profile::Lwm2m, 2);
        let peer = OBSERVER.parse().unwrap();
        d.handle_datagram(now, peer, &get("/3/0/0", None, 1, 1));
        let a = sent(&mut d).remove(0);
        assert_eq!(
            (a.code, a.payload.as_slice()),
            (Code::CONTENT, b"Cobalt".as_slice())
        );
        let mut put = Message::new(MessageType::Confirmable, Code::PUT, 2);
        put.options.set_uri_path("/3/0/0");
        d.handle_datagram(now, peer, &codec::encode(&put));
        assert_eq!(sent(&mut d)[0].code, Code::METHOD_NOT_ALLOWED);
        d.handle_datagram(now, peer, &get("/.well-known/core", None, 3, 3));
        let core = sent(&mut d).remove(0);
        assert_eq!(
            String::from_utf8_lossy(&core.payload),
            "</1/0>,</3/0>,</3303/0>"
        );
    }

    #[test]
    fn a_removal_given_up_on_is_counted() {
        let now = Instant::now();
        let mut settings = DeviceSettings::new(Profile::Rd);
        let rd: SocketAddr = "127.0.0.1:5683".parse().unwrap();
        settings.directory = Some(DirectoryTarget {
            profile: Profile::Rd,
            server: rd,
            path: vec!["rd".into()],
        });
        let stats = Arc::new(FleetStats::default());
        let mut d = Device::new(
            0,
            "d".into(),
            Arc::new(settings),
            stats.clone(),
            now,
            Duration::ZERO,
            now,
        );
        d.handle_timeout(now);
        let post = sent(&mut d).remove(0);
        assert_eq!(post.code, Code::POST);
        let mut created = Message::new(MessageType::Acknowledgement, Code::CREATED, post.mid);
        created.token = post.token;
        created.options.push(opt::LOCATION_PATH, "rd");
        created.options.push(opt::LOCATION_PATH, "4");
        d.handle_datagram(now, rd, &codec::encode(&created));
        assert_eq!(d.location().as_deref(), Some("/rd/4"));
        d.stop(now);
        assert!(sent(&mut d).iter().any(|m| m.code == Code::DELETE));
        assert!(!d.is_stopped(), "waiting for the removal's answer");
        d.give_up();
        let summary = stats.summary();
        assert_eq!(summary.registrations, 1);
        assert_eq!(summary.errors.get("removal unanswered"), Some(&1));
    }

    #[test]
    fn stopping_without_a_directory_ends_at_once() {
        let (mut d, now) = device(Profile::Rd, 1);
        assert!(!d.is_stopped());
        d.stop(now);
        assert!(d.is_stopped());
        assert!(d.poll_timeout().is_none(), "no more changes");
    }
}
