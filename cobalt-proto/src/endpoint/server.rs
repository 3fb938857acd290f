//! The server role: requests received, deduplicated, answered (piggybacked, separate
//! or NON), and notifications of observations.

use super::*;

impl Endpoint {
    pub(super) fn handle_request(&mut self, now: Instant, peer: SocketAddr, msg: Message) {
        let key = (peer, msg.mid);
        let con = msg.mtype == MessageType::Confirmable;
        if let Some(entry) = self.dedup.get(&key) {
            self.stats.duplicates += 1;
            match entry {
                DedupEntry::Reply(bytes) => {
                    let bytes = bytes.to_vec();
                    self.transmit(peer, bytes);
                }
                DedupEntry::InProgress(id) => {
                    // The handler is still working: acknowledge now so the client stops
                    // retransmitting, and answer separately (§5.2.2).
                    let id = ExchangeId(id);
                    if con {
                        self.send_empty_ack_for(id);
                    }
                }
                DedupEntry::Silent => {}
            }
            return;
        }
        self.touch_peer(now, peer);
        if let Some(number) = msg.options.first_bad_critical() {
            self.stats.bad_options += 1;
            let mut resp = Message::new(MessageType::Acknowledgement, Code::BAD_OPTION, 0);
            resp.payload =
                format!("Unrecognized or malformed critical option {number}").into_bytes();
            self.answer_without_handler(now, peer, &msg, resp, true);
            return;
        }
        if self.server.len() >= self.config.max_server_exchanges || self.dedup.is_full() {
            self.stats.overload_rejections += 1;
            let mut resp = Message::new(MessageType::Acknowledgement, Code::SERVICE_UNAVAILABLE, 0);
            resp.options
                .set_uint(opt::MAX_AGE, self.config.overload_max_age);
            self.answer_without_handler(now, peer, &msg, resp, false);
            return;
        }
        let id = ExchangeId(self.alloc_id());
        let deduplicated = !(self.config.dedup_skip_idempotent && msg.code == Code::GET);
        if deduplicated {
            self.dedup.insert(key, DedupEntry::InProgress(id.0));
            self.arm_housekeeping(now);
        }
        self.server.insert(
            id,
            ServerExchange {
                peer,
                mid: msg.mid,
                token: msg.token,
                con,
                acked: false,
                deduplicated,
                no_response: msg
                    .options
                    .get_uint(opt::NO_RESPONSE)
                    .map_or(0, |v| v as u8),
            },
        );
        if con {
            self.timers
                .arm_in_order(now + self.config.separate_ack_delay, Timer::SeparateAck(id));
        }
        self.stats.requests += 1;
        self.events.push_back(Event::Request {
            id,
            peer,
            request: msg,
        });
    }

    /// Answers a request the application never sees (bad option, overload).
    pub(super) fn answer_without_handler(
        &mut self,
        now: Instant,
        peer: SocketAddr,
        req: &Message,
        mut resp: Message,
        remember: bool,
    ) {
        self.stats.count_response(resp.code);
        resp.token = req.token;
        if req.mtype == MessageType::Confirmable {
            resp.mtype = MessageType::Acknowledgement;
            resp.mid = req.mid;
        } else {
            resp.mtype = MessageType::NonConfirmable;
            resp.mid = self.alloc_mid(now, peer);
        }
        let bytes = codec::encode(&resp);
        if remember && !self.dedup.is_full() {
            let entry = if req.mtype == MessageType::Confirmable {
                DedupEntry::Reply(&bytes)
            } else {
                DedupEntry::Silent
            };
            self.dedup.insert((peer, req.mid), entry);
            self.arm_housekeeping(now);
        }
        self.transmit(peer, bytes);
    }

    /// Sends the response to a request surfaced by [`Event::Request`]. The endpoint sets
    /// type, MID and token: piggybacked on the ACK when possible, otherwise a separate
    /// CON response (retransmitted until acknowledged), or NON for a NON request.
    pub fn respond(
        &mut self,
        now: Instant,
        id: ExchangeId,
        mut response: Message,
    ) -> Result<(), UnknownExchange> {
        let ex = self.server.remove(&id).ok_or(UnknownExchange(id))?;
        response.token = ex.token;
        let key = (ex.peer, ex.mid);
        if suppressed(ex.no_response, response.code) {
            // RFC 7967: the client asked not to hear about this class of response. A
            // CON request still gets its (empty) ACK, so it is not retransmitted.
            let ack = codec::encode(&Message::empty_ack(ex.mid));
            if ex.con && !ex.acked {
                if ex.deduplicated {
                    self.dedup.update(&key, DedupEntry::Reply(&ack));
                }
                self.transmit(ex.peer, ack);
            } else if ex.deduplicated && !ex.con {
                self.dedup.update(&key, DedupEntry::Silent);
            }
            return Ok(());
        }
        self.stats.count_response(response.code);
        if ex.con && !ex.acked {
            response.mtype = MessageType::Acknowledgement;
            response.mid = ex.mid;
            let bytes = codec::encode(&response);
            if ex.deduplicated {
                self.dedup.update(&key, DedupEntry::Reply(&bytes));
            }
            self.transmit(ex.peer, bytes);
        } else if ex.con {
            response.mtype = MessageType::Confirmable;
            response.mid = self.alloc_mid(now, ex.peer);
            let bytes = codec::encode(&response);
            self.send_confirmable(now, ex.peer, response.mid, bytes, Owner::Server(id));
        } else {
            response.mtype = MessageType::NonConfirmable;
            response.mid = self.alloc_mid(now, ex.peer);
            if ex.deduplicated {
                self.dedup.update(&key, DedupEntry::Silent);
            }
            let bytes = codec::encode(&response);
            self.transmit(ex.peer, bytes);
        }
        Ok(())
    }

    /// Sends a notification of an observation (RFC 7641) outside any exchange: a
    /// response with `token` to `peer`, confirmable or not. Returns the id under which
    /// a failure ([`Event::ResponseFailed`]) is reported, and the message ID used (an
    /// RST for a NON notification arrives as [`Event::UnmatchedReset`] with it).
    /// A confirmable notification that `replaces` a still unacknowledged one takes over
    /// its retransmission state (RFC 7641 §4.5.2), so retransmissions never restart.
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
        self.stats.count_response(notification.code);
        let id = ExchangeId(self.alloc_id());
        let mid = self.alloc_mid(now, peer);
        notification.token = token;
        notification.mid = mid;
        let bytes;
        let previous = replaces.and_then(|(_, old_mid)| self.pending.remove(&(peer, old_mid)));
        if confirmable || previous.is_some() {
            notification.mtype = MessageType::Confirmable;
            bytes = codec::encode(&notification);
            self.congestion.non_record(now, peer, true);
            match previous {
                Some(mut p) => {
                    p.bytes = bytes.clone();
                    p.owner = Owner::Server(id);
                    self.timers.arm(p.next_at, Timer::Retransmit(peer, mid));
                    self.pending.insert((peer, mid), p);
                    self.transmit(peer, bytes);
                }
                None => self.send_confirmable(now, peer, mid, bytes, Owner::Server(id)),
            }
        } else {
            notification.mtype = MessageType::NonConfirmable;
            bytes = codec::encode(&notification);
            self.send_non_notification(now, peer, token, id, mid, bytes);
        }
        (id, mid)
    }

    /// True while a confirmable message we sent with this ID to `peer` awaits its ACK.
    pub fn is_unacknowledged(&self, peer: SocketAddr, mid: u16) -> bool {
        self.pending.contains_key(&(peer, mid))
    }

    /// Acknowledges a confirmable request now, so that its response will be a separate
    /// one; for handlers that know they will be slow. No effect on NON requests.
    pub fn accept_separately(&mut self, id: ExchangeId) {
        self.send_empty_ack_for(id);
    }

    pub(super) fn send_empty_ack_for(&mut self, id: ExchangeId) {
        let Some(ex) = self.server.get_mut(&id) else {
            return;
        };
        if !ex.con || ex.acked {
            return;
        }
        ex.acked = true;
        let (peer, mid, dedup) = (ex.peer, ex.mid, ex.deduplicated);
        let bytes = codec::encode(&Message::empty_ack(mid));
        if dedup {
            self.dedup.update(&(peer, mid), DedupEntry::Reply(&bytes));
        }
        self.transmit(peer, bytes);
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
