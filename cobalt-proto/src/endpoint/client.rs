//! The client role: requests sent under NSTART, matched by token, answered by
//! piggybacked, separate or NON responses, observations kept alive.

use super::*;

impl Endpoint {
    /// Starts a request to `peer`. The message's code must be a method; its type decides
    /// CON (default) or NON; MID and (if empty) token are assigned here. A request with
    /// Observe=0 stays registered after the first response and receives notifications
    /// until [`Endpoint::cancel`]; so does one with Q-Block2 answered with Q-Block2
    /// (RFC 9177: the other blocks of the body follow under its token). Requests beyond NSTART to one peer wait in a queue.
    pub fn request(
        &mut self,
        now: Instant,
        peer: SocketAddr,
        mut msg: Message,
    ) -> Result<RequestId, RequestError> {
        if !msg.is_request() {
            return Err(RequestError::NotARequest);
        }
        if self.clients.len() >= self.config.max_client_exchanges {
            return Err(RequestError::TooManyRequests);
        }
        if msg.token.len() > self.config.max_token_len {
            return Err(RequestError::TokenTooLong {
                len: msg.token.len(),
                max: self.config.max_token_len,
            });
        }
        if msg.mtype != MessageType::NonConfirmable {
            msg.mtype = MessageType::Confirmable;
        }
        if msg.token.is_empty() || self.tokens.contains(&self.clients, &peer, &msg.token) {
            msg.token = self.fresh_token(peer);
        }
        let id = RequestId(self.alloc_id());
        let token = msg.token.clone();
        let observe = msg.options.observe() == Some(0);
        let qblock2 = msg.options.contains(crate::blockwise::qblock::Q_BLOCK2);
        let qblock1_more = msg
            .options
            .get_uint(crate::blockwise::qblock::Q_BLOCK1)
            .and_then(crate::message::BlockValue::decode)
            .is_some_and(|b| b.more);
        self.clients.insert(
            id,
            ClientExchange {
                peer,
                token,
                mid: 0,
                state: ClientState::Queued,
                counted: false,
                observe,
                qblock2,
                qblock1_more,
            },
        );
        self.tokens.insert(&self.clients, id);
        let nstart = self.config.nstart;
        let p = self.touch_peer(now, peer);
        // Nothing waits before it: it goes now, and the queue (an allocation) is
        // never made for a peer that gets one request at a time, such as each of the
        // servers a client observes.
        let free = p.queue_is_empty() && (p.outstanding as usize) < nstart;
        if free && self.mid_blocked_until(now, peer).is_none() {
            self.start_request(now, peer, id, msg);
        } else {
            self.queued.insert(id, msg);
            if let Some(p) = self.peers.get_mut(&peer) {
                p.queue_mut().push_back(id);
            }
            self.pump_peer(now, peer);
        }
        Ok(id)
    }

    /// The token assigned to a request (to match it in logs or re-register later).
    pub fn request_token(&self, id: RequestId) -> Option<Token> {
        self.clients.get(&id).map(|c| c.token.clone())
    }

    /// The server of a request while it is queued, outstanding or observing.
    pub fn request_peer(&self, id: RequestId) -> Option<SocketAddr> {
        self.clients.get(&id).map(|c| c.peer)
    }

    /// True while a request is queued, outstanding or observing.
    pub fn is_request_active(&self, id: RequestId) -> bool {
        self.clients.contains_key(&id)
    }

    /// Forgets a request: no more retransmissions, responses or notifications for it.
    /// A later notification for its token is answered with RST (reactive cancel).
    pub fn cancel(&mut self, now: Instant, id: RequestId) {
        let Some(ex) = self.forget_request(id) else {
            return;
        };
        if ex.state == ClientState::AwaitingAck {
            self.finish_pending(now, ex.peer, ex.mid, false);
        }
        if let Some(p) = self.peers.get_mut(&ex.peer) {
            p.unqueue(id);
        }
        if ex.counted {
            self.release_outstanding(now, ex.peer);
        }
    }

    /// Removes request `id`'s record, with its index entry and its queued message.
    fn forget_request(&mut self, id: RequestId) -> Option<ClientExchange> {
        let ex = self.clients.remove(&id)?;
        self.tokens.remove(id, &ex.peer, &ex.token);
        if ex.state == ClientState::Queued {
            self.queued.remove(&id);
        }
        Some(ex)
    }

    pub(super) fn fresh_token(&mut self, peer: SocketAddr) -> Token {
        loop {
            let full = Token::random(&mut self.rng);
            let t = Token::new(&full.as_bytes()[..self.config.token_len]).unwrap_or(full);
            if !self.tokens.contains(&self.clients, &peer, &t) {
                return t;
            }
        }
    }

    pub(super) fn pump_peer(&mut self, now: Instant, peer: SocketAddr) {
        loop {
            let Some(p) = self.peers.get_mut(&peer) else {
                return;
            };
            if p.outstanding as usize >= self.config.nstart {
                return;
            }
            if p.queue_is_empty() {
                return;
            }
            if let Some(at) = self.mid_blocked_until(now, peer) {
                // More than 65,536 messages within EXCHANGE_LIFETIME: wait (§4.4).
                self.stats.mid_waits += 1;
                self.timers.arm(at, Timer::MidsFree(peer));
                return;
            }
            let Some(p) = self.peers.get_mut(&peer) else {
                return;
            };
            let Some(id) = p.dequeue() else {
                return;
            };
            if let Some(msg) = self.queued.remove(&id) {
                self.start_request(now, peer, id, msg);
            }
        }
    }

    /// Sends request `id` (`msg`, taken out of the queue if it waited there) to
    /// `peer`, which has room for it (NSTART) and a message ID free.
    fn start_request(&mut self, now: Instant, peer: SocketAddr, id: RequestId, mut msg: Message) {
        let Some(p) = self.peers.get_mut(&peer) else {
            return;
        };
        p.outstanding += 1;
        let mid = self.alloc_mid(now, peer);
        let non_deadline = now + self.response_timeout(self.config.non_lifetime());
        let Some(ex) = self.clients.get_mut(&id) else {
            return;
        };
        if ex.state != ClientState::Queued {
            return;
        }
        ex.state = ClientState::AwaitingAck;
        ex.counted = true;
        ex.mid = mid;
        msg.mid = mid;
        let bytes = self.spare.encode(&msg);
        if msg.mtype == MessageType::Confirmable {
            self.send_confirmable(now, peer, mid, bytes, Owner::Client(id));
        } else {
            ex.state = ClientState::AwaitingResponse;
            // A NON Q-Block1 block (RFC 9177 §7.2): MAX_PAYLOADS, not NSTART,
            // paces the blocks of a set, and the server answers only some of
            // them, so it does not hold the peer's place while it waits.
            let qblock1 = msg.options.contains(crate::blockwise::qblock::Q_BLOCK1);
            ex.counted = !qblock1;
            self.timers.arm(non_deadline, Timer::ClientDeadline(id));
            self.transmit(peer, bytes);
            if qblock1 {
                if let Some(p) = self.peers.get_mut(&peer) {
                    p.outstanding = p.outstanding.saturating_sub(1);
                }
            }
        }
    }

    pub(super) fn response_timeout(&self, default: Duration) -> Duration {
        self.config.response_timeout.unwrap_or(default)
    }

    pub(super) fn release_outstanding(&mut self, now: Instant, peer: SocketAddr) {
        let used = self.epoch_secs(now);
        if let Some(p) = self.peers.get_mut(&peer) {
            p.outstanding = p.outstanding.saturating_sub(1);
            p.last_used = used;
        }
        self.pump_peer(now, peer);
    }

    /// An ACK (empty or with a piggybacked response) for a CON we sent.
    pub(super) fn handle_ack(
        &mut self,
        now: Instant,
        peer: SocketAddr,
        mid: u16,
        resp: Option<Message>,
    ) {
        let Some(pending) = self.finish_pending(now, peer, mid, true) else {
            self.stats.unmatched += 1;
            return;
        };
        // The ACK proves that the peer receives at its address.
        self.verified(now, peer);
        let separate_deadline = now + self.response_timeout(self.config.exchange_lifetime());
        let Owner::Client(id) = pending.owner else {
            // A separate response of ours was acknowledged: that exchange is complete.
            return;
        };
        let Some(ex) = self.clients.get_mut(&id) else {
            return;
        };
        ex.counted = false;
        match resp {
            Some(resp) if resp.token == ex.token => {
                self.release_outstanding(now, peer);
                self.deliver_response(now, id, resp);
            }
            _ if ex.qblock1_more => {
                // A Q-Block1 block taken: the ACK is all it gets.
                self.release_outstanding(now, peer);
                self.deliver_response(now, id, Message::empty_ack(mid));
            }
            _ => {
                // Empty ACK: the response will come separately (§5.2.2).
                ex.state = ClientState::AwaitingResponse;
                self.timers
                    .arm(separate_deadline, Timer::ClientDeadline(id));
                self.release_outstanding(now, peer);
            }
        }
    }

    pub(super) fn handle_separate_response(
        &mut self,
        now: Instant,
        peer: SocketAddr,
        msg: Message,
    ) {
        let key = (peer, msg.mid);
        let con = msg.mtype == MessageType::Confirmable;
        if let Some(entry) = self.dedup.get(now, &key) {
            self.stats.duplicates += 1;
            match entry {
                DedupEntry::EmptyAck => self.transmit_message(peer, &Message::empty_ack(msg.mid)),
                DedupEntry::Reset => self.transmit_message(peer, &Message::reset(msg.mid)),
                _ => {}
            }
            return;
        }
        let Some(id) = self.tokens.get(&self.clients, &peer, &msg.token) else {
            // Nobody waits for this token: reject it, which also cancels an observation
            // we no longer want (RFC 7641 §3.6).
            self.stats.unmatched += 1;
            if con {
                self.finish_message(now, key, Finished::Reset);
                self.arm_housekeeping(now);
            }
            self.send_reset(peer, msg.mid);
            return;
        };
        // A notification of one of our observations is not remembered: a duplicate
        // is acknowledged again and handed over again, and the observation drops it
        // by its Observe number (RFC 7641 §3.4), so it is processed once all the same
        // (RFC 7252 §4.5 allows the relaxation for what is handled idempotently).
        // A client observing thousands of servers would otherwise remember their
        // last messages for EXCHANGE_LIFETIME, some 400 bytes per server.
        let notification =
            msg.options.observe().is_some() && self.clients.get(&id).is_some_and(|ex| ex.observe);
        let how = if notification {
            Finished::Forget
        } else if con {
            Finished::EmptyAck
        } else {
            Finished::Silent
        };
        self.finish_message(now, key, how);
        self.arm_housekeeping(now);
        if con {
            self.transmit_message(peer, &Message::empty_ack(msg.mid));
        }
        let Some(ex) = self.clients.get_mut(&id) else {
            return;
        };
        let (awaiting_ack, mid, counted) =
            (ex.state == ClientState::AwaitingAck, ex.mid, ex.counted);
        ex.counted = false;
        if awaiting_ack {
            // The response overtook (or replaced a lost) ACK: stop retransmitting.
            self.finish_pending(now, peer, mid, true);
        }
        if counted {
            self.release_outstanding(now, peer);
        }
        self.deliver_response(now, id, msg);
    }

    pub(super) fn deliver_response(&mut self, _now: Instant, id: RequestId, resp: Message) {
        let keep = match self.clients.get_mut(&id) {
            Some(ex)
                if ex.observe && resp.options.observe().is_some() && resp.code.is_success() =>
            {
                ex.state = ClientState::Observing;
                true
            }
            Some(ex)
                if ex.qblock2
                    && resp.options.contains(crate::blockwise::qblock::Q_BLOCK2)
                    && resp.code.is_success() =>
            {
                ex.state = ClientState::Observing;
                true
            }
            Some(_) => false,
            None => return,
        };
        if !keep {
            self.forget_request(id);
        }
        self.events
            .push_back(Event::Response { id, response: resp });
    }

    /// The response deadline of request `id` has come: it fails unless its response
    /// came first (a request waits for its response once at most, so this is the
    /// deadline of that wait).
    pub(super) fn on_client_deadline(&mut self, now: Instant, id: RequestId) {
        let Some(peer) = self
            .clients
            .get(&id)
            .filter(|ex| ex.state == ClientState::AwaitingResponse)
            .map(|ex| ex.peer)
        else {
            return;
        };
        self.fail_client(
            now,
            id,
            Event::Timeout {
                id,
                peer,
                retransmissions: 0,
            },
        );
    }

    pub(super) fn fail_client(&mut self, now: Instant, id: RequestId, event: Event) {
        if let Some(ex) = self.forget_request(id) {
            if ex.counted {
                self.release_outstanding(now, ex.peer);
            }
            if matches!(event, Event::Timeout { .. }) {
                self.stats.timeouts += 1;
            }
            self.events.push_back(event);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get(path: &str) -> Message {
        let mut m = Message::new(MessageType::Confirmable, Code::GET, 0);
        m.options.set_uri_path(path);
        m
    }

    /// What a client pays per request for as long as it observes: a client of
    /// thousands of servers holds one record per observation (plus its 8-byte key),
    /// so the record keeps only the step it is at, not what a step needs.
    #[test]
    fn a_request_record_stays_small() {
        let size = std::mem::size_of::<ClientExchange>();
        assert!(
            size <= 56,
            "the client's request record grew to {size} bytes"
        );
        assert_eq!(std::mem::size_of::<ClientState>(), 1);
    }

    /// A request beyond NSTART keeps its message aside until it goes out; one
    /// cancelled in the queue leaves nothing behind, and the one after it goes out
    /// with its own message once the first is answered.
    #[test]
    fn queued_messages_are_kept_aside_until_sent_or_cancelled() {
        let now = Instant::now();
        let mut client = Endpoint::with_seed(EndpointConfig::default(), now, 1);
        let server: SocketAddr = "10.0.0.2:5683".parse().unwrap();
        let first = client.request(now, server, get("/a")).unwrap();
        assert!(client.queued.is_empty(), "sent at once: never queued");
        let cancelled = client.request(now, server, get("/b")).unwrap();
        let last = client.request(now, server, get("/c")).unwrap();
        assert_eq!(client.queued.len(), 2, "NSTART = 1: two wait");
        client.cancel(now, cancelled);
        assert_eq!(client.queued.len(), 1);
        let sent: Vec<_> = std::iter::from_fn(|| client.poll_transmit()).collect();
        assert_eq!(sent.len(), 1);
        let request = codec::decode(&sent[0].bytes).unwrap();
        assert_eq!(request.options.uri_path_string(), "/a");
        let mut answer = Message::new(MessageType::Acknowledgement, Code::CONTENT, request.mid);
        answer.token = request.token;
        client.handle_datagram(now, server, &codec::encode(&answer));
        assert!(matches!(client.poll_event(), Some(Event::Response { id, .. }) if id == first));
        let sent: Vec<_> = std::iter::from_fn(|| client.poll_transmit()).collect();
        assert_eq!(sent.len(), 1, "the queued request goes out now");
        let request = codec::decode(&sent[0].bytes).unwrap();
        assert_eq!(request.options.uri_path_string(), "/c");
        assert_eq!(client.request_token(last), Some(request.token));
        assert!(client.queued.is_empty());
        assert_eq!(
            client.clients.get(&last).map(|ex| ex.state),
            Some(ClientState::AwaitingAck)
        );
        assert!(!client.is_request_active(cancelled));
    }
}
