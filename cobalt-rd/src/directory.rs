//! The directory's state and rules, without I/O: registrations by id, by (ep, d) and
//! by peer budget, and the register / update / remove / expire operations at an
//! explicit `now` (seconds since the Unix epoch). Operations that change something
//! return the new [`Registration`] without applying it, so that the service can store
//! it first and apply it ([`Directory::apply`]) only once it is durable.

use crate::error::RdError;
use crate::limits::RdLimits;
use crate::registration::{Owner, Registration, RegistrationParams, DEFAULT_LIFETIME};
use cobalt_proto::link_format::{self, Link};
use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;

/// The registrations, indexed for the registration interface and for lookups.
#[derive(Debug, Default)]
pub struct Directory {
    limits: RdLimits,
    by_id: BTreeMap<u64, Registration>,
    /// Each registration's links, parsed once when applied (lookups read these).
    links: HashMap<u64, Vec<Link>>,
    by_name: HashMap<(String, Option<String>), u64>,
    /// The ids registered under each endpoint name (any sector), ascending: a lookup
    /// by `ep` reads these instead of every registration.
    by_ep: HashMap<String, Vec<u64>>,
    /// Links that carry an attribute named `ep` themselves (a lookup filter on `ep`
    /// matches them too, so the `by_ep` shortcut holds only while there are none).
    links_with_ep: usize,
    per_peer: HashMap<IpAddr, usize>,
    next_id: u64,
}

/// What a registration request comes with besides its parameters.
#[derive(Debug, Clone)]
pub struct Registrant {
    /// Who registers.
    pub owner: Owner,
    /// The address budget of the source address.
    pub peer_key: IpAddr,
    /// `scheme://source-address:port`, the `base` when the request gives none.
    pub source_base: String,
}

impl Directory {
    /// An empty directory enforcing `limits`.
    pub fn new(limits: RdLimits) -> Directory {
        Directory {
            limits,
            ..Directory::default()
        }
    }

    /// The limits it enforces.
    pub fn limits(&self) -> &RdLimits {
        &self.limits
    }

    /// How many registrations it holds.
    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }

    /// The registration with `id`.
    pub fn get(&self, id: u64) -> Option<&Registration> {
        self.by_id.get(&id)
    }

    /// The registration of endpoint `ep` in sector `sector`.
    pub fn find(&self, ep: &str, sector: Option<&str>) -> Option<&Registration> {
        let key = (ep.to_string(), sector.map(str::to_string));
        self.by_name.get(&key).and_then(|id| self.by_id.get(id))
    }

    /// Every registration, by id.
    pub fn iter(&self) -> impl Iterator<Item = &Registration> {
        self.by_id.values()
    }

    /// The registrations that a lookup filter `ep=NAME` (an exact name) can match, in
    /// id order; `None` when some link has an `ep` attribute of its own, which such a
    /// filter matches as well (then every registration is a candidate).
    pub fn candidates_named(&self, name: &str) -> Option<impl Iterator<Item = &Registration>> {
        if self.links_with_ep > 0 {
            return None;
        }
        let ids = self.by_ep.get(name).map_or(&[][..], Vec::as_slice);
        Some(ids.iter().filter_map(|id| self.by_id.get(id)))
    }

    /// The parsed links of registration `id` (none for an unknown id).
    pub fn links(&self, id: u64) -> &[Link] {
        self.links.get(&id).map_or(&[], Vec::as_slice)
    }

    /// The registration a `POST /rd` asks for: a new one, or the one with the same
    /// (ep, d) replaced (keeping its id). Refused with 4.00 without `ep`, 4.03 when
    /// another owner holds that (ep, d), and 5.03 when the peer's or the directory's
    /// budget is spent.
    pub fn register(
        &self,
        params: RegistrationParams,
        links: String,
        who: &Registrant,
        now: u64,
    ) -> Result<Registration, RdError> {
        let ep = params.ep.ok_or_else(|| {
            RdError::bad_request("a registration needs the endpoint name: add `?ep=NAME`".into())
        })?;
        let key = (ep, params.sector);
        let replaced = self.by_name.get(&key).and_then(|id| self.by_id.get(id));
        let id = match replaced {
            Some(old) if old.owner != who.owner => {
                return Err(RdError::forbidden(format!(
                    "endpoint {:?} is registered by another client; only it may replace the registration",
                    key.0
                )))
            }
            Some(old) => old.id,
            None => {
                if self.by_id.len() >= self.limits.max_total {
                    return Err(self.full());
                }
                if self.per_peer.get(&who.peer_key).copied().unwrap_or(0) >= self.limits.max_per_peer {
                    return Err(self.peer_full(who.peer_key));
                }
                self.next_id
            }
        };
        let lifetime = params.lifetime.unwrap_or(DEFAULT_LIFETIME);
        Ok(Registration {
            id,
            ep: key.0,
            sector: key.1,
            base: params.base.unwrap_or_else(|| who.source_base.clone()),
            lifetime,
            expires_at: now.saturating_add(u64::from(lifetime)),
            attrs: params.attrs,
            links,
            owner: who.owner.clone(),
            peer_key: who.peer_key,
        })
    }

    /// The 5.03 for a directory that holds its most registrations.
    pub(crate) fn full(&self) -> RdError {
        RdError::unavailable(
            format!(
                "the directory is full ({} registrations); retry later",
                self.limits.max_total
            ),
            self.limits.retry_after_secs,
        )
    }

    /// The 5.03 for a peer address budget that holds its most registrations.
    pub(crate) fn peer_full(&self, peer_key: IpAddr) -> RdError {
        RdError::unavailable(
            format!(
                "{peer_key} holds {} registrations, the most one address may; remove one or retry later",
                self.limits.max_per_peer
            ),
            self.limits.retry_after_secs,
        )
    }

    /// The registration a `POST /rd/<id>` makes of registration `id`: the new
    /// lifetime (restarting at `now`), base and attributes, and the links when a body
    /// was given. 4.04 for an unknown id, 4.03 for another owner, 4.00 for `ep`/`d`
    /// (they cannot change).
    pub fn update(
        &self,
        id: u64,
        params: RegistrationParams,
        links: Option<String>,
        owner: &Owner,
        now: u64,
    ) -> Result<Registration, RdError> {
        let mut r = self.owned(id, owner)?.clone();
        if params.ep.is_some() || params.sector.is_some() {
            return Err(RdError::bad_request(
                "an update cannot change `ep` or `d`; register anew under the new name".into(),
            ));
        }
        if let Some(lt) = params.lifetime {
            r.lifetime = lt;
        }
        r.expires_at = now.saturating_add(u64::from(r.lifetime));
        if let Some(base) = params.base {
            r.base = base;
        }
        for (name, value) in params.attrs {
            let full = r.attrs.len() >= self.limits.max_endpoint_attrs;
            match r.attrs.iter_mut().find(|(n, _)| *n == name) {
                Some(slot) => slot.1 = value,
                None if !full => r.attrs.push((name, value)),
                None => {
                    return Err(RdError::bad_request(format!(
                        "more than {} endpoint attributes",
                        self.limits.max_endpoint_attrs
                    )))
                }
            }
        }
        if let Some(links) = links {
            r.links = links;
        }
        Ok(r)
    }

    /// Checks that `owner` may remove registration `id` (4.04, 4.03 otherwise).
    pub fn check_remove(&self, id: u64, owner: &Owner) -> Result<(), RdError> {
        self.owned(id, owner).map(|_| ())
    }

    fn owned(&self, id: u64, owner: &Owner) -> Result<&Registration, RdError> {
        let r = self.by_id.get(&id).ok_or_else(|| {
            RdError::not_found(format!(
                "no registration /rd/{id} (expired or removed): register again"
            ))
        })?;
        if r.owner != *owner {
            return Err(RdError::forbidden(format!(
                "/rd/{id} was registered by another client; only it may change or remove it"
            )));
        }
        Ok(r)
    }

    /// Puts `registration` in, replacing the one with its id (from [`register`],
    /// [`update`], or a store when loading).
    ///
    /// [`register`]: Directory::register
    /// [`update`]: Directory::update
    pub fn apply(&mut self, registration: Registration) {
        self.remove(registration.id);
        self.next_id = self.next_id.max(registration.id + 1);
        self.by_name.insert(
            (registration.ep.clone(), registration.sector.clone()),
            registration.id,
        );
        *self.per_peer.entry(registration.peer_key).or_default() += 1;
        // Stored text was checked when it was registered; a store that hands back
        // something unparsable loses those links, not the registration.
        let links = link_format::parse(&registration.links).unwrap_or_default();
        self.links_with_ep += links_with_ep(&links);
        let ids = self.by_ep.entry(registration.ep.clone()).or_default();
        if let Err(at) = ids.binary_search(&registration.id) {
            ids.insert(at, registration.id);
        }
        self.links.insert(registration.id, links);
        self.by_id.insert(registration.id, registration);
    }

    /// Holds exactly `registrations` from now on (what a shared store holds after
    /// changes were missed); ids keep counting from where they were.
    pub fn replace_all(&mut self, registrations: Vec<Registration>) {
        let next_id = self.next_id;
        *self = Directory::new(self.limits.clone());
        self.next_id = next_id;
        for r in registrations {
            self.apply(r);
        }
    }

    /// Takes registration `id` out; returns it if it was there.
    pub fn remove(&mut self, id: u64) -> Option<Registration> {
        let r = self.by_id.remove(&id)?;
        if let Some(links) = self.links.remove(&id) {
            self.links_with_ep -= links_with_ep(&links);
        }
        self.by_name.remove(&(r.ep.clone(), r.sector.clone()));
        if let Some(ids) = self.by_ep.get_mut(&r.ep) {
            ids.retain(|i| *i != id);
            if ids.is_empty() {
                self.by_ep.remove(&r.ep);
            }
        }
        if let Some(n) = self.per_peer.get_mut(&r.peer_key) {
            *n -= 1;
            if *n == 0 {
                self.per_peer.remove(&r.peer_key);
            }
        }
        Some(r)
    }

    /// The ids of the registrations whose lifetime has run out at `now`.
    pub fn expired(&self, now: u64) -> Vec<u64> {
        self.by_id
            .values()
            .filter(|r| r.expires_at <= now)
            .map(|r| r.id)
            .collect()
    }

    /// The earliest expiry time of any registration.
    pub fn next_expiry(&self) -> Option<u64> {
        self.by_id.values().map(|r| r.expires_at).min()
    }
}

/// How many of `links` carry an attribute named `ep`.
fn links_with_ep(links: &[Link]) -> usize {
    links
        .iter()
        .filter(|l| l.attrs.iter().any(|(n, _)| n == "ep"))
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;
    use cobalt::Code;
    use std::net::Ipv4Addr;

    pub(crate) fn registrant(last: u8) -> Registrant {
        let ip = IpAddr::V4(Ipv4Addr::new(192, 0, 2, last));
        Registrant {
            owner: Owner::Address(ip),
            peer_key: ip,
            source_base: format!("coap://{ip}:5683"),
        }
    }

    fn params(q: &[&str]) -> RegistrationParams {
        RegistrationParams::parse(q.iter().copied(), &RdLimits::default()).unwrap()
    }

    fn register(
        d: &mut Directory,
        q: &[&str],
        who: &Registrant,
        now: u64,
    ) -> Result<Registration, RdError> {
        let r = d.register(params(q), "</temp>".into(), who, now)?;
        d.apply(r.clone());
        Ok(r)
    }

    #[test]
    fn registration_defaults_lifetime_and_base_and_same_name_replaces() {
        let mut d = Directory::new(RdLimits::default());
        let a = registrant(1);
        let r = register(&mut d, &["ep=node1"], &a, 1000).unwrap();
        assert_eq!((r.id, r.lifetime, r.expires_at), (0, 90_000, 91_000));
        assert_eq!(r.base, "coap://192.0.2.1:5683");
        let again = register(&mut d, &["ep=node1", "lt=60"], &a, 2000).unwrap();
        assert_eq!((again.id, again.expires_at, d.len()), (0, 2060, 1));
        assert_eq!(d.find("node1", None).map(|r| r.lifetime), Some(60));
        assert!(d.find("node1", Some("x")).is_none());
        let other_sector = register(&mut d, &["ep=node1", "d=x"], &a, 2000).unwrap();
        assert_eq!((other_sector.id, d.len()), (1, 2));
        let e = d
            .register(params(&["d=x"]), String::new(), &a, 0)
            .unwrap_err();
        assert_eq!(e.code, Code::BAD_REQUEST);
    }

    #[test]
    fn only_the_owner_updates_removes_or_replaces() {
        let mut d = Directory::new(RdLimits::default());
        let (a, b) = (registrant(1), registrant(2));
        let r = register(&mut d, &["ep=node1"], &a, 0).unwrap();
        assert_eq!(
            d.update(r.id, params(&[]), None, &b.owner, 5)
                .unwrap_err()
                .code,
            Code::FORBIDDEN
        );
        assert_eq!(
            d.check_remove(r.id, &b.owner).unwrap_err().code,
            Code::FORBIDDEN
        );
        assert_eq!(
            register(&mut d, &["ep=node1"], &b, 0).unwrap_err().code,
            Code::FORBIDDEN
        );
        assert_eq!(
            d.update(99, params(&[]), None, &a.owner, 5)
                .unwrap_err()
                .code,
            Code::NOT_FOUND
        );
        let u = d
            .update(
                r.id,
                params(&["lt=10", "base=coap://h:1", "et=x"]),
                Some("</b>".into()),
                &a.owner,
                5,
            )
            .unwrap();
        assert_eq!(
            (u.expires_at, u.base.as_str(), u.links.as_str()),
            (15, "coap://h:1", "</b>")
        );
        assert_eq!(u.attr("et").as_deref(), Some("x"));
        assert!(d
            .update(r.id, params(&["ep=other"]), None, &a.owner, 5)
            .is_err());
        assert!(d.check_remove(r.id, &a.owner).is_ok());
    }

    #[test]
    fn peer_and_total_budgets_answer_503_with_max_age() {
        let limits = RdLimits {
            max_per_peer: 2,
            max_total: 3,
            ..RdLimits::default()
        };
        let mut d = Directory::new(limits);
        let a = registrant(1);
        register(&mut d, &["ep=a1"], &a, 0).unwrap();
        register(&mut d, &["ep=a2"], &a, 0).unwrap();
        let e = register(&mut d, &["ep=a3"], &a, 0).unwrap_err();
        assert_eq!((e.code, e.max_age), (Code::SERVICE_UNAVAILABLE, Some(60)));
        // Replacing one's own registration is within budget.
        register(&mut d, &["ep=a2", "lt=5"], &a, 0).unwrap();
        register(&mut d, &["ep=b1"], &registrant(2), 0).unwrap();
        let e = register(&mut d, &["ep=c1"], &registrant(3), 0).unwrap_err();
        assert!(e.message.contains("full"), "{}", e.message);
        d.remove(0);
        register(&mut d, &["ep=c1"], &registrant(3), 0).unwrap();
    }

    #[test]
    fn replacing_everything_rebuilds_the_indexes_and_keeps_counting_ids() {
        let mut d = Directory::new(RdLimits::default());
        let a = registrant(1);
        let kept = register(&mut d, &["ep=kept"], &a, 0).unwrap();
        register(&mut d, &["ep=gone"], &a, 0).unwrap();
        let mut elsewhere = kept.clone();
        elsewhere.id = 7;
        elsewhere.ep = "made-elsewhere".into();
        d.replace_all(vec![kept.clone(), elsewhere]);
        assert_eq!(d.len(), 2);
        assert!(d.iter().all(|r| r.ep != "gone"));
        // The name index follows: `gone` is free, `kept` is replaced in place.
        assert_eq!(register(&mut d, &["ep=kept"], &a, 5).unwrap().id, kept.id);
        assert_eq!(register(&mut d, &["ep=gone"], &a, 5).unwrap().id, 8);
        assert_eq!(d.per_peer.get(&a.peer_key), Some(&3));
    }

    #[test]
    fn expiry_takes_registrations_whose_lifetime_ran_out() {
        let mut d = Directory::new(RdLimits::default());
        let a = registrant(1);
        register(&mut d, &["ep=short", "lt=10"], &a, 100).unwrap();
        register(&mut d, &["ep=long", "lt=20"], &a, 100).unwrap();
        assert_eq!(d.next_expiry(), Some(110));
        assert!(d.expired(109).is_empty());
        assert_eq!(d.expired(110), vec![0]);
        d.remove(0);
        assert_eq!(d.next_expiry(), Some(120));
        assert_eq!(d.expired(1_000), vec![1]);
    }
}
