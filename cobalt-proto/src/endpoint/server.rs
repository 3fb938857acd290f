//! The server role: requests received, deduplicated, admitted, answered (piggybacked,
//! separate or NON), and notifications of observations.

use super::admission::Refusal;
use super::dedup::Finished;
use super::validation::{encoded_len, Parked, ParkedResponse};
use super::*;
use crate::observe::encoded::EncodedNotification;

impl Endpoint {
    pub(super) fn handle_request(
        &mut self,
        now: Instant,
        peer: SocketAddr,
        msg: Message,
        len: usize,
    ) {
        let key = (peer, msg.mid);
        let con = msg.mtype == MessageType::Confirmable;
        // One lookup finds what the endpoint knows of the peer: its requests being
        // handled, whether the dedup store holds any of its messages, and its count
        // against the admission bound; a new request is entered through the same
        // reference (only an Echo option, whose check needs the whole endpoint, costs
        // a second lookup).
        self.arm_housekeeping(now);
        let (mut slot, mut p) = peer_entry(&mut self.peers, &mut self.rng, now, peer);
        let in_progress = p.in_progress.exchange_of(msg.mid);
        let (in_progress, stored, of_peer) = (in_progress, p.stored, p.in_progress.len());
        let duplicate = match in_progress {
            Some(id) => Some(DedupEntry::InProgress(id)),
            None if stored => self.dedup.get(now, &key),
            None => None,
        };
        if let Some(entry) = duplicate {
            self.stats.duplicates += 1;
            let again = match entry {
                DedupEntry::Reply(bytes) => {
                    let fits = self
                        .allowance(now, peer, len, 0)
                        .is_none_or(|left| bytes.len() <= left);
                    fits.then(|| self.spare.copy(bytes))
                }
                DedupEntry::EmptyAck => Some(self.spare.encode(&Message::empty_ack(msg.mid))),
                DedupEntry::Reset => Some(self.spare.encode(&Message::reset(msg.mid))),
                DedupEntry::InProgress(id) => {
                    // The handler is still working: acknowledge (again) so the client
                    // stops retransmitting, and answer separately (§5.2.2). The copy
                    // counts towards what the peer sent.
                    let id = ExchangeId(id);
                    if let Some(ex) = self.server.get_mut(&id) {
                        ex.request_len += len;
                    }
                    if con {
                        self.ack_in_progress(id, true);
                    }
                    None
                }
                DedupEntry::Silent => None,
            };
            if let Some(bytes) = again {
                self.transmit(peer, bytes);
            }
            return;
        }
        if let Some(echo) = msg.options.get(opt::ECHO) {
            let echo = echo.to_vec();
            self.check_echo(now, peer, &echo);
            (slot, p) = peer_entry(&mut self.peers, &mut self.rng, now, peer);
        }
        if let Some(number) = msg
            .options
            .first_bad_critical_except(&self.config.handled_options)
        {
            self.stats.bad_options += 1;
            let mut resp = Message::new(MessageType::Acknowledgement, Code::BAD_OPTION, 0);
            resp.payload =
                format!("Unrecognized or malformed critical option {number}").into_bytes();
            self.answer_without_handler(now, peer, (&msg, len), resp, true);
            return;
        }
        if msg.token.len() > self.config.max_token_len {
            // RFC 8974 §2.2.2: extended tokens are supported, this length is not — a
            // client that can use a shorter one learns it from this answer.
            self.stats.long_tokens += 1;
            let mut resp = Message::new(MessageType::Acknowledgement, Code::BAD_REQUEST, 0);
            resp.payload = format!(
                "Token of {} bytes is longer than the {} this server accepts",
                msg.token.len(),
                self.config.max_token_len
            )
            .into_bytes();
            self.answer_without_handler(now, peer, (&msg, len), resp, false);
            return;
        }
        let server = &self.server;
        let in_progress = || server.values().map(|ex| ex.peer);
        if let Err(refusal) = self
            .admission
            .admit(&self.config, peer, of_peer, in_progress)
        {
            let code = match refusal {
                Refusal::PeerBusy => {
                    self.stats.busy_rejections += 1;
                    Code::TOO_MANY_REQUESTS
                }
                Refusal::Overloaded => {
                    self.stats.overload_rejections += 1;
                    Code::SERVICE_UNAVAILABLE
                }
            };
            let mut resp = Message::new(MessageType::Acknowledgement, code, 0);
            resp.options
                .set_uint(opt::MAX_AGE, self.config.overload_max_age);
            self.answer_without_handler(now, peer, (&msg, len), resp, false);
            return;
        }
        let id = ExchangeId(take_id(&mut self.next_id));
        p.in_progress.push(msg.mid, id.0);
        let safe = matches!(msg.code, Code::GET | Code::FETCH);
        self.server.insert(
            id,
            ServerExchange {
                peer,
                slot,
                mid: msg.mid,
                token: msg.token.clone(),
                con,
                acked: false,
                remember: !(safe && self.config.dedup_rerun_safe),
                safe,
                registration: safe && msg.options.observe() == Some(0),
                request_len: len,
                sent: 0,
                no_response: msg
                    .options
                    .get_uint(opt::NO_RESPONSE)
                    .map_or(0, |v| v as u8),
            },
        );
        if con {
            self.timers
                .arm_separate_ack(now + self.config.separate_ack_delay, id);
        }
        self.stats.requests += 1;
        self.events.push_back(Event::Request {
            id,
            peer,
            request: msg,
        });
    }

    /// Answers a request the application never sees (bad option, a bound reached);
    /// `remember` keeps the answer for duplicates (for methods whose answers are kept).
    pub(super) fn answer_without_handler(
        &mut self,
        now: Instant,
        peer: SocketAddr,
        (req, req_len): (&Message, usize),
        mut resp: Message,
        remember: bool,
    ) {
        resp.token = req.token.clone();
        let con = req.mtype == MessageType::Confirmable;
        if let Some(left) = self.allowance(now, peer, req_len, 0) {
            if encoded_len(&resp) > left {
                // A diagnostic payload is optional (§5.5.2); an unverified peer gets none.
                resp.payload.clear();
            }
            if encoded_len(&resp) > left {
                return;
            }
        }
        self.stats.count_response(resp.code);
        if con {
            resp.mtype = MessageType::Acknowledgement;
            resp.mid = req.mid;
        } else {
            resp.mtype = MessageType::NonConfirmable;
            resp.mid = self.alloc_mid(now, peer);
        }
        let bytes = self.encode(&resp);
        let safe = matches!(req.code, Code::GET | Code::FETCH);
        if remember && !(safe && self.config.dedup_rerun_safe) {
            let how = if con {
                Finished::Reply(&bytes)
            } else {
                Finished::Silent
            };
            self.finish_message(now, (peer, req.mid), how);
        }
        self.transmit(peer, bytes);
    }

    /// Answers every request surfaced by [`Event::Request`] and not answered yet with
    /// `response` (as [`Endpoint::respond`] would), e.g. 5.03 when the server shuts
    /// down before its handlers are done: no client is left waiting for a separate
    /// response that will never come. Returns how many were answered.
    pub fn respond_to_unanswered(&mut self, now: Instant, response: &Message) -> usize {
        let mut ids: Vec<ExchangeId> = self.server.keys().copied().collect();
        ids.sort_unstable();
        for id in &ids {
            let _ = self.respond(now, *id, response.clone());
        }
        ids.len()
    }

    /// Ends a request surfaced by [`Event::Request`] without answering it (a Q-Block1
    /// block that does not complete its set, RFC 9177 §4.4): a confirmable one gets
    /// its empty ACK if it has none yet, a duplicate is ignored as if answered.
    pub fn withhold(&mut self, now: Instant, id: ExchangeId) -> Result<(), UnknownExchange> {
        let ex = self.server.remove(&id).ok_or(UnknownExchange(id))?;
        self.admission.release(&self.config, ex.peer);
        if ex.con && !ex.acked {
            self.transmit_message(ex.peer, &Message::empty_ack(ex.mid));
        }
        self.finish_message_at(now, (ex.peer, ex.mid), ex.slot, ex.unless_piggybacked());
        Ok(())
    }

    /// Sends the response to a request surfaced by [`Event::Request`]. The endpoint sets
    /// type, MID and token: piggybacked on the ACK when possible, otherwise a separate
    /// CON response (retransmitted until acknowledged), or NON for a NON request.
    ///
    /// To a peer whose address is not verified (see [`EndpointConfig::amplification_factor`])
    /// a response larger than the request allows and an observe registration's answer
    /// wait for one verification round trip; a separate response is retransmitted only
    /// while the request's allowance lasts.
    pub fn respond(
        &mut self,
        now: Instant,
        id: ExchangeId,
        mut response: Message,
    ) -> Result<(), UnknownExchange> {
        let ex = self.server.remove(&id).ok_or(UnknownExchange(id))?;
        self.timers.disarm_separate_ack(id);
        self.admission.release(&self.config, ex.peer);
        response.token = ex.token.clone();
        let key = (ex.peer, ex.mid);
        if suppressed(ex.no_response, response.code) {
            // RFC 7967: the client asked not to hear about this class of response. A
            // CON request still gets its (empty) ACK, so it is not retransmitted.
            if ex.con && !ex.acked {
                self.transmit_message(ex.peer, &Message::empty_ack(ex.mid));
            }
            self.finish_message_at(now, key, ex.slot, ex.unless_piggybacked());
            return Ok(());
        }
        let allowance = self.allowance(now, ex.peer, ex.request_len, ex.sent);
        if let Some(left) = allowance {
            if !response.code.is_success() && encoded_len(&response) > left {
                // A diagnostic payload is optional (§5.5.2); an unverified peer gets none.
                response.payload.clear();
            }
            if ex.registration || encoded_len(&response) > left {
                // Not acknowledged yet: if the verification is quick, the answer still
                // goes out piggybacked (see the validation module).
                let parked = Parked::Response(ParkedResponse {
                    id,
                    token: ex.token.clone(),
                    mid: ex.mid,
                    con: ex.con,
                    acked: ex.acked,
                    safe: ex.safe,
                    remember: ex.remember,
                    registration: ex.registration,
                    message: response,
                    allowance: left,
                });
                if ex.acked {
                    // A retransmission gets the empty ACK again while the answer waits.
                    self.finish_message_at(now, key, ex.slot, Finished::EmptyAck);
                } else if !ex.con {
                    self.finish_message_at(now, key, ex.slot, ex.unless_piggybacked());
                }
                self.park(now, ex.peer, parked);
                return Ok(());
            }
        }
        self.stats.count_response(response.code);
        if ex.con && !ex.acked {
            response.mtype = MessageType::Acknowledgement;
            response.mid = ex.mid;
            let bytes = self.encode(&response);
            let how = if ex.remember {
                Finished::Reply(&bytes)
            } else {
                Finished::Forget
            };
            self.finish_message_at(now, key, ex.slot, how);
            self.transmit(ex.peer, bytes);
        } else if ex.con {
            self.finish_message_at(now, key, ex.slot, ex.unless_piggybacked());
            response.mtype = MessageType::Confirmable;
            response.mid = self.alloc_mid(now, ex.peer);
            let bytes = self.encode(&response);
            let len = bytes.len();
            self.send_confirmable(now, ex.peer, response.mid, bytes, Owner::Server(id));
            if let Some(left) = allowance {
                // Unverified: retransmit only while the request's allowance lasts.
                self.limit_retransmissions(ex.peer, response.mid, left - len);
            }
        } else {
            self.finish_message_at(now, key, ex.slot, ex.unless_piggybacked());
            response.mtype = MessageType::NonConfirmable;
            response.mid = self.alloc_mid(now, ex.peer);
            let bytes = self.encode(&response);
            self.transmit(ex.peer, bytes);
        }
        Ok(())
    }

    /// Sends one more block of a response already given (a Q-Block2 block after the
    /// first, RFC 9177 §4.4) outside any exchange: `message` with `token` to `peer`,
    /// confirmable (retransmitted until acknowledged; a failure comes as
    /// [`Event::ResponseFailed`]) or not. The blocks of a set go out together: the
    /// Q-Block2 sender paces its sets itself (MAX_PAYLOADS, NON_TIMEOUT), so NON blocks
    /// are not held by the NON pacing of notifications. To an address that is not
    /// verified nothing is sent (an unverified peer gets no more than its requests
    /// allow): false, and the caller tries again later or leaves the block to the
    /// client's request for it.
    pub fn send_block(
        &mut self,
        now: Instant,
        peer: SocketAddr,
        token: Token,
        mut message: Message,
        confirmable: bool,
    ) -> bool {
        if !self.is_verified(now, peer) {
            return false;
        }
        let id = ExchangeId(self.alloc_id());
        message.token = token;
        message.mid = self.alloc_mid(now, peer);
        self.stats.count_response(message.code);
        if confirmable {
            message.mtype = MessageType::Confirmable;
            let bytes = self.encode(&message);
            self.send_confirmable(now, peer, message.mid, bytes, Owner::Server(id));
        } else {
            message.mtype = MessageType::NonConfirmable;
            let bytes = self.encode(&message);
            self.transmit(peer, bytes);
        }
        true
    }

    /// Sends a notification of an observation (RFC 7641) outside any exchange: a
    /// response with `token` to `peer`, confirmable or not. Returns the id under which
    /// a failure ([`Event::ResponseFailed`], [`Event::Unverified`]) is reported, and the
    /// message ID used (an RST for a NON notification arrives as
    /// [`Event::UnmatchedReset`] with it). A confirmable notification that `replaces` a
    /// still unacknowledged one takes over its retransmission state (RFC 7641 §4.5.2),
    /// so retransmissions never restart. To a peer whose address is not verified the
    /// notification waits for one verification round trip (the latest one per token).
    /// NON notifications follow the peer's congestion control (CoCoA §5): some go as
    /// CON, and too frequent ones wait (a newer one for the same token replaces one
    /// waiting).
    pub fn notify(
        &mut self,
        now: Instant,
        peer: SocketAddr,
        token: Token,
        mut notification: Message,
        confirmable: bool,
        replaces: Option<(ExchangeId, u16)>,
    ) -> (ExchangeId, u16) {
        let id = ExchangeId(self.alloc_id());
        let mid = self.alloc_mid(now, peer);
        notification.token = token.clone();
        notification.mid = mid;
        if !self.is_verified(now, peer) {
            let parked = Parked::Notification {
                id,
                token,
                message: notification,
                confirmable,
                replaces,
            };
            self.park(now, peer, parked);
        } else {
            self.send_notification(now, peer, id, notification, confirmable, replaces);
        }
        (id, mid)
    }

    /// [`Endpoint::notify`] with a notification whose options and payload were
    /// encoded once for many observers: only its header and token are written here,
    /// so a change notified to many observers is not encoded for each. The datagram
    /// is byte for byte the one [`Endpoint::notify`] sends for
    /// `notification.message()`; so are the ids returned, the message ID rules, the
    /// congestion control and the retransmissions.
    pub fn notify_encoded(
        &mut self,
        now: Instant,
        peer: SocketAddr,
        token: Token,
        notification: &EncodedNotification,
        confirmable: bool,
        replaces: Option<(ExchangeId, u16)>,
    ) -> (ExchangeId, u16) {
        if !self.is_verified(now, peer) {
            // Parked as a message until the address is verified (rare: not worth a
            // second way to park).
            let message = notification.message().clone();
            return self.notify(now, peer, token, message, confirmable, replaces);
        }
        let id = ExchangeId(self.alloc_id());
        let mid = self.alloc_mid(now, peer);
        let mut bytes = self.spare.take();
        notification.write(MessageType::NonConfirmable, mid, &token, &mut bytes);
        let code = notification.code();
        self.send_encoded_notification(
            now,
            peer,
            id,
            (code, token, mid),
            bytes,
            confirmable,
            replaces,
        );
        (id, mid)
    }

    /// Sends a notification whose token and message ID are set.
    pub(super) fn send_notification(
        &mut self,
        now: Instant,
        peer: SocketAddr,
        id: ExchangeId,
        mut notification: Message,
        confirmable: bool,
        replaces: Option<(ExchangeId, u16)>,
    ) {
        notification.mtype = MessageType::NonConfirmable;
        let bytes = self.encode(&notification);
        let header = (
            notification.code,
            notification.token.clone(),
            notification.mid,
        );
        self.send_encoded_notification(now, peer, id, header, bytes, confirmable, replaces);
    }

    /// Sends a notification encoded as NON (`bytes`, with the code, token and message
    /// ID in `header`): confirmable if asked or if it replaces an unacknowledged one.
    #[allow(clippy::too_many_arguments)]
    fn send_encoded_notification(
        &mut self,
        now: Instant,
        peer: SocketAddr,
        id: ExchangeId,
        (code, token, mid): (Code, Token, u16),
        mut bytes: Vec<u8>,
        confirmable: bool,
        replaces: Option<(ExchangeId, u16)>,
    ) {
        self.stats.count_response(code);
        let previous = replaces.and_then(|(_, old_mid)| self.pending.remove(&(peer, old_mid)));
        if confirmable || previous.is_some() {
            // Type is bits 5–4 of the first byte; CON is 0.
            bytes[0] &= !0x30;
            let places = &mut self.peers.congestion_places();
            self.congestion.non_record(now, places, peer, true);
            match previous {
                Some(mut p) => {
                    p.bytes.clear();
                    p.bytes.extend_from_slice(&bytes);
                    p.owner = Owner::Server(id);
                    self.timers.arm(p.next_at, Timer::Retransmit(peer, mid));
                    self.pending.insert((peer, mid), p);
                    self.transmit(peer, bytes);
                }
                None => self.send_confirmable(now, peer, mid, bytes, Owner::Server(id)),
            }
        } else {
            self.send_non_notification(now, peer, token, id, mid, bytes);
        }
    }

    /// True while a confirmable message we sent with this ID to `peer` awaits its ACK.
    pub fn is_unacknowledged(&self, peer: SocketAddr, mid: u16) -> bool {
        self.pending.contains_key(&(peer, mid))
    }

    /// Acknowledges a confirmable request now, so that its response will be a separate
    /// one; for handlers that know they will be slow. No effect on NON requests.
    pub fn accept_separately(&mut self, id: ExchangeId) {
        self.ack_in_progress(id, false);
    }

    /// Sends an empty ACK for a confirmable request being handled: once, or `again`
    /// (for a retransmission of the request).
    pub(super) fn ack_in_progress(&mut self, id: ExchangeId, again: bool) {
        let Some(ex) = self.server.get_mut(&id) else {
            return;
        };
        if !ex.con || (ex.acked && !again) {
            return;
        }
        ex.acked = true;
        ex.sent += 4;
        let (peer, mid) = (ex.peer, ex.mid);
        self.transmit_message(peer, &Message::empty_ack(mid));
    }
}

impl ServerExchange {
    /// What a duplicate of the request gets once it is answered other than by a
    /// piggybacked response: an empty ACK again (CON), nothing (NON), or a new run of
    /// the handler (a safe request whose answer is not kept).
    fn unless_piggybacked(&self) -> Finished<'static> {
        match (self.remember, self.con) {
            (false, _) => Finished::Forget,
            (true, false) => Finished::Silent,
            (true, true) => Finished::EmptyAck,
        }
    }
}

/// RFC 7967 §2.1: bit 2 (value 2) suppresses 2.xx, 8 suppresses 4.xx, 16 suppresses 5.xx.
fn suppressed(no_response: u8, code: Code) -> bool {
    let bit = match code.class() {
        2 => 2,
        4 => 8,
        5 => 16,
        _ => 0,
    };
    no_response & bit != 0
}
