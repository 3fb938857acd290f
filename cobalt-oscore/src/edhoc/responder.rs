//! A server's side of EDHOC: message_1 answered with message_2, message_3 (alone or in
//! a combined request) verified against the credentials of the clients it knows, and
//! the OSCORE contexts that result kept for the OSCORE layer to find by kid.
//!
//! Everything a client sends is hostile until message_3 verifies: message_1 costs an
//! ECDH and a pending session, so pending sessions are bounded per client address and
//! in total (and forgotten after [`EdhocLimits::pending_for`]), checked before any
//! crypto is done; message_2 is never more than three times the size of the request
//! that asked for it (a credential sent by value falls back to its key ID); the
//! contexts made are bounded, the least recently used going first.

use super::credential::{Ccs, CredentialStyle, EdhocIdentity};
use super::{crypto, encode_connection_id, error_message, guarded, is_compact_id, oscore_material};
use super::{split_connection_id, split_message, Crypto, EDHOC_CBOR_SEQ, WELL_KNOWN_EDHOC};
use crate::security::SecurityContext;
use cobalt::proto::message::{codec, Code};
use cobalt::server::{Request, Response};
use lakers::{EDHOCMethod, EdhocMessageBuffer, EdhocResponder as Lakers, EdhocResponderWaitM3};
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Bounds on what clients can make a responder hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EdhocLimits {
    /// Sessions waiting for message_3 from one client address (4).
    pub pending_per_address: usize,
    /// Sessions waiting for message_3 in all (64).
    pub pending: usize,
    /// How long a session waits for message_3 (60 s).
    pub pending_for: Duration,
    /// OSCORE contexts made by EDHOC kept at once (256); the least recently used is
    /// dropped for a new one.
    pub established: usize,
}

impl Default for EdhocLimits {
    fn default() -> EdhocLimits {
        EdhocLimits {
            pending_per_address: 4,
            pending: 64,
            pending_for: Duration::from_secs(60),
            established: 256,
        }
    }
}

/// How much larger than the request an answer may be (RFC 9528 §9.7 and RFC 9175
/// leave the factor to the server; QUIC's 3 is the usual one).
const AMPLIFICATION: usize = 3;

/// The longest EDHOC message lakers takes.
const MAX_MESSAGE: usize = lakers::MAX_MESSAGE_SIZE_LEN;

/// What a refused EDHOC request is answered with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// 4.00 for a message that does not verify or parse, 5.03 when the server is full.
    pub code: Code,
    /// Why, in words (for the log; an EDHOC error message carries it to the client).
    pub why: String,
}

impl Refusal {
    fn bad(why: impl Into<String>) -> Refusal {
        Refusal {
            code: Code::BAD_REQUEST,
            why: why.into(),
        }
    }

    fn full(why: impl Into<String>) -> Refusal {
        Refusal {
            code: Code::SERVICE_UNAVAILABLE,
            why: why.into(),
        }
    }

    /// This refusal with its text cut so that the answer stays within the
    /// amplification bound of a request of `request_len` bytes (a header, a token
    /// and an option or two beside the text).
    pub fn within(mut self, request_len: usize) -> Refusal {
        let room = (AMPLIFICATION * request_len).saturating_sub(4 + 8 + 6 + 3);
        if self.why.len() > room {
            let mut end = room;
            while !self.why.is_char_boundary(end) {
                end -= 1;
            }
            self.why.truncate(end);
        }
        self
    }

    /// The CoAP answer: an EDHOC error message (RFC 9528 Appendix A.2.3), or for 5.03 a
    /// text with Max-Age, so the client waits before it tries again.
    pub fn into_response(self) -> Response {
        if self.code == Code::SERVICE_UNAVAILABLE {
            return Response::new(self.code)
                .with_max_age(5)
                .with_payload(self.why);
        }
        Response::new(self.code)
            .with_content_format(EDHOC_CBOR_SEQ)
            .with_payload(error_message(&self.why))
    }
}

/// A session between message_2 and message_3.
struct Pending {
    address: IpAddr,
    since: Instant,
    /// The client's connection identifier (its OSCORE Recipient ID).
    c_i: Vec<u8>,
    state: EdhocResponderWaitM3<Crypto>,
}

/// An OSCORE context EDHOC made, with when it was last used.
struct Established {
    context: Arc<SecurityContext>,
    last_use: u64,
}

#[derive(Default)]
struct Sessions {
    /// By the connection identifier this side chose (C_R).
    pending: HashMap<Vec<u8>, Pending>,
    /// By C_R, which is the context's Recipient ID (the kid of requests).
    established: HashMap<Vec<u8>, Established>,
    /// Counts uses, for least-recently-used eviction.
    uses: u64,
}

impl Sessions {
    fn forget_expired(&mut self, now: Instant, limit: Duration) {
        self.pending
            .retain(|_, p| now.saturating_duration_since(p.since) < limit);
    }

    fn in_use(&self, id: &[u8]) -> bool {
        self.pending.contains_key(id) || self.established.contains_key(id)
    }
}

/// A server's EDHOC: its identity, the clients it knows (a label and the credential
/// each authenticates with), and the sessions in progress and done.
pub struct EdhocResponder {
    identity: EdhocIdentity,
    clients: Vec<(String, Ccs)>,
    limits: EdhocLimits,
    sessions: Mutex<Sessions>,
}

impl std::fmt::Debug for EdhocResponder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let sessions = self.lock();
        f.debug_struct("EdhocResponder")
            .field("identity", &self.identity)
            .field("clients", &self.clients.len())
            .field("pending", &sessions.pending.len())
            .field("established", &sessions.established.len())
            .finish()
    }
}

impl EdhocResponder {
    /// A responder that authenticates as `identity` and knows no client yet.
    pub fn new(identity: EdhocIdentity) -> EdhocResponder {
        EdhocResponder {
            identity,
            clients: Vec::new(),
            limits: EdhocLimits::default(),
            sessions: Mutex::default(),
        }
    }

    /// Accepts clients that authenticate with `credential`; their OSCORE contexts are
    /// named `label` (for [`RequireOscore::contexts`](crate::RequireOscore::contexts)).
    pub fn client(mut self, label: impl Into<String>, credential: Ccs) -> EdhocResponder {
        self.clients.push((label.into(), credential));
        self
    }

    /// Other bounds than [`EdhocLimits::default`].
    pub fn limits(mut self, limits: EdhocLimits) -> EdhocResponder {
        self.limits = limits;
        self
    }

    /// This server's identity.
    pub fn identity(&self) -> &EdhocIdentity {
        &self.identity
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Sessions> {
        self.sessions.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The identifiers of the sessions that wait for message_3 from `from`.
    #[cfg(test)]
    pub(super) fn pending_from(&self, from: IpAddr) -> Vec<Vec<u8>> {
        let sessions = self.lock();
        sessions
            .pending
            .iter()
            .filter(|(_, p)| p.address == from)
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// Sessions waiting for message_3, and contexts made.
    pub fn counts(&self) -> (usize, usize) {
        let sessions = self.lock();
        (sessions.pending.len(), sessions.established.len())
    }

    /// The context EDHOC made whose Recipient ID is `kid`, if it is still kept.
    pub fn context(&self, kid: &[u8]) -> Option<Arc<SecurityContext>> {
        let mut sessions = self.lock();
        sessions.uses += 1;
        let uses = sessions.uses;
        let entry = sessions.established.get_mut(kid)?;
        entry.last_use = uses;
        Some(entry.context.clone())
    }

    /// Whether `request` is for `/.well-known/edhoc`.
    pub fn is_for_edhoc(request: &Request) -> bool {
        request.options().uri_path().eq(WELL_KNOWN_EDHOC)
    }

    /// Answers a request to `/.well-known/edhoc` (RFC 9528 Appendix A.2): a POST of
    /// `true` and message_1 gets message_2, a POST of C_R and message_3 gets message_4,
    /// each in a 2.04; anything else an error. `taken` as for
    /// [`message_1`](Self::message_1).
    pub fn answer(&self, request: &Request, taken: impl Fn(&[u8]) -> bool) -> Response {
        if request.method() != Code::POST {
            return Response::new(Code::METHOD_NOT_ALLOWED)
                .with_payload("EDHOC messages are POSTed to /.well-known/edhoc");
        }
        let from = request.peer().ip();
        let now = Instant::now();
        let payload = request.payload();
        let request_len = codec::encode(request.message()).len();
        let answered = match payload.split_first() {
            Some((0xf5, message_1)) => self.message_1(from, request_len, message_1, taken, now),
            Some(_) => match split_connection_id(payload) {
                Some((c_r, message_3)) => self
                    .message_3(from, &c_r, message_3, now)
                    .map(|(_, message_4)| message_4),
                None => Err(Refusal::bad(
                    "the payload is neither true and message_1 nor C_R and message_3",
                )),
            },
            None => Err(Refusal::bad("the request has no EDHOC message")),
        };
        match answered {
            Ok(message) => Response::new(Code::CHANGED)
                .with_content_format(EDHOC_CBOR_SEQ)
                .with_payload(message),
            Err(refusal) => {
                tracing::debug!(peer = %request.peer(), why = %refusal.why, "EDHOC request refused");
                refusal.within(request_len).into_response()
            }
        }
    }

    /// Takes the message_3 at the start of a combined request's `payload` (RFC 9668
    /// §3.3.1) for the session `c_r` (the request's kid): the context it completes,
    /// and the OSCORE ciphertext after the message.
    pub fn combined<'a>(
        &self,
        from: IpAddr,
        c_r: &[u8],
        payload: &'a [u8],
        now: Instant,
    ) -> Result<(Arc<SecurityContext>, &'a [u8]), Refusal> {
        let Some((message_3, ciphertext)) = split_message(payload) else {
            return Err(Refusal::bad(
                "a combined request must start with EDHOC message_3 (a CBOR byte string)",
            ));
        };
        let (context, _message_4) = self.message_3(from, c_r, message_3, now)?;
        Ok((context, ciphertext))
    }

    /// Answers message_1 (the payload after its `true`) from `from`, which came in a
    /// request of `request_len` bytes: message_2. `taken` says which Recipient IDs other
    /// contexts use already (C_R must differ from all of them).
    pub fn message_1(
        &self,
        from: IpAddr,
        request_len: usize,
        message_1: &[u8],
        taken: impl Fn(&[u8]) -> bool,
        now: Instant,
    ) -> Result<Vec<u8>, Refusal> {
        if message_1.len() > MAX_MESSAGE {
            return Err(Refusal::bad("message_1 is too long"));
        }
        // The bounds first: nothing costly is done for a client that may not have more.
        {
            let mut sessions = self.lock();
            sessions.forget_expired(now, self.limits.pending_for);
            let from_here = sessions
                .pending
                .values()
                .filter(|p| p.address == from)
                .count();
            if from_here >= self.limits.pending_per_address {
                return Err(Refusal::full(
                    "too many EDHOC sessions from this address wait for message_3; finish one or wait",
                ));
            }
            if sessions.pending.len() >= self.limits.pending {
                return Err(Refusal::full(
                    "too many EDHOC sessions are in progress; try again later",
                ));
            }
        }
        let buffer = EdhocMessageBuffer::new_from_slice(message_1)
            .map_err(|_| Refusal::bad("message_1 is too long"))?;
        let responder = Lakers::new(
            crypto(),
            EDHOCMethod::StatStat,
            self.identity.private_key(),
            self.identity.credential().lakers(),
        );
        let (processed, c_i, ead_1) = guarded(|| responder.process_message_1(&buffer))
            .map_err(|e| Refusal::bad(format!("message_1 is not acceptable: {e:?}")))?;
        if ead_1.is_some_and(|ead| ead.is_critical) {
            return Err(Refusal::bad(
                "message_1 carries a critical EAD item this server does not know",
            ));
        }
        let c_i = c_i.as_slice().to_vec();
        let c_r = {
            let sessions = self.lock();
            pick_connection_id(|id| id == c_i || sessions.in_use(id) || taken(id))
        };
        let Some(c_r) = c_r else {
            return Err(Refusal::full("no connection identifier is free"));
        };
        let style = self.style_within(request_len, &c_r);
        let conn_id = lakers::ConnId::from_slice(&c_r).expect("picked identifiers fit");
        let (state, message_2) = processed
            .prepare_message_2(style.lakers(), Some(conn_id), &None)
            .map_err(|e| Refusal::bad(format!("cannot answer message_1: {e:?}")))?;
        let mut sessions = self.lock();
        // Another request may have taken the identifier or the last place meanwhile.
        if sessions.in_use(&c_r) || sessions.pending.len() >= self.limits.pending {
            return Err(Refusal::full(
                "too many EDHOC sessions are in progress; try again later",
            ));
        }
        sessions.pending.insert(
            c_r,
            Pending {
                address: from,
                since: now,
                c_i,
                state,
            },
        );
        Ok(message_2.as_slice().to_vec())
    }

    /// How this server names its credential in a message_2 answering a request of
    /// `request_len` bytes: by value only if that stays within the amplification bound.
    fn style_within(&self, request_len: usize, c_r: &[u8]) -> CredentialStyle {
        let ccs = self.identity.credential();
        if self.identity.style() == CredentialStyle::ByKeyId || ccs.kid().is_none() {
            return self.identity.style();
        }
        // bstr(G_Y | CIPHERTEXT_2), CIPHERTEXT_2 = C_R, {14: CCS}, MAC_2 (bstr of 8),
        // in a response with at most the request's header, token and one option more.
        let id_cred = 2 + ccs.bytes().len();
        let message_2 = 3 + 32 + encode_connection_id(c_r).len() + id_cred + 9;
        let response = message_2 + 4 + 8 + 3;
        if response <= AMPLIFICATION * request_len {
            CredentialStyle::ByValue
        } else {
            CredentialStyle::ByKeyId
        }
    }

    /// Takes message_3 for the session `c_r` from `from`: the OSCORE context it
    /// completes and message_4.
    pub fn message_3(
        &self,
        from: IpAddr,
        c_r: &[u8],
        message_3: &[u8],
        now: Instant,
    ) -> Result<(Arc<SecurityContext>, Vec<u8>), Refusal> {
        let pending = {
            let mut sessions = self.lock();
            sessions.forget_expired(now, self.limits.pending_for);
            match sessions.pending.get(c_r) {
                Some(p) if p.address == from => {}
                Some(_) | None => {
                    return Err(Refusal::bad(
                        "no EDHOC session with this C_R waits for message_3 from this address",
                    ))
                }
            }
            // One try per session: a wrong message_3 ends it.
            sessions.pending.remove(c_r).expect("looked up above")
        };
        let buffer = EdhocMessageBuffer::new_from_slice(message_3)
            .map_err(|_| Refusal::bad("message_3 is too long"))?;
        let state = pending.state;
        let (processing, id_cred_i, ead_3) = guarded(|| state.parse_message_3(&buffer))
            .map_err(|e| Refusal::bad(format!("message_3 does not decrypt: {e:?}")))?;
        if ead_3.is_some_and(|ead| ead.is_critical) {
            return Err(Refusal::bad(
                "message_3 carries a critical EAD item this server does not know",
            ));
        }
        let Some((label, credential)) =
            self.clients.iter().find(|(_, c)| c.is_named_by(&id_cred_i))
        else {
            return Err(Refusal::bad(
                "the client's credential is not one this server knows",
            ));
        };
        let (processed, _prk_out) = processing
            .verify_message_3(credential.lakers())
            .map_err(|e| Refusal::bad(format!("message_3 does not verify: {e:?}")))?;
        let (mut done, message_4) = processed
            .prepare_message_4(&None)
            .map_err(|e| Refusal::bad(format!("cannot make message_4: {e:?}")))?;
        let material = oscore_material(&mut done, c_r, &pending.c_i);
        let context = SecurityContext::new(material)
            .map_err(|e| Refusal::bad(format!("the derived context is not usable: {e}")))?
            .named(label.clone());
        let context = Arc::new(context);
        let mut sessions = self.lock();
        if sessions.established.len() >= self.limits.established {
            let oldest = sessions
                .established
                .iter()
                .min_by_key(|(_, e)| e.last_use)
                .map(|(id, _)| id.clone());
            if let Some(oldest) = oldest {
                sessions.established.remove(&oldest);
            }
        }
        sessions.uses += 1;
        let last_use = sessions.uses;
        sessions.established.insert(
            c_r.to_vec(),
            Established {
                context: context.clone(),
                last_use,
            },
        );
        Ok((context, message_4.as_slice().to_vec()))
    }
}

/// A free connection identifier: one of the 48 that encode in one byte when one is
/// free (a few random tries), else two random bytes.
fn pick_connection_id(in_use: impl Fn(&[u8]) -> bool) -> Option<Vec<u8>> {
    for _ in 0..16 {
        let byte: u8 = rand::random::<u8>() % 48;
        let id = [if byte < 24 { byte } else { 0x20 + byte - 24 }];
        debug_assert!(is_compact_id(id[0]));
        if !in_use(&id) {
            return Some(id.to_vec());
        }
    }
    (0..16)
        .map(|_| rand::random::<[u8; 2]>().to_vec())
        .find(|id| !in_use(id))
}
