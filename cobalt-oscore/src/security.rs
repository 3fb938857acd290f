//! A security context in use (RFC 8613 §3): the derived keys with the mutable state
//! beside them (sender sequence, replay window), and the protection of CoAP messages
//! with it (§8): requests and responses turned into OSCORE messages and back.

use crate::classes;
use crate::context::{
    aad, hex, partial_iv, sequence_number, DecryptError, Keys, Material, MaterialError,
};
use crate::option::{OptionError, OscoreOption, OSCORE};
use crate::replay::{ReplayError, ReplayWindow};
use crate::sequence::{SenderSequence, SequenceError};
use cobalt_proto::message::codec::{decode_options_and_payload, encode_options_and_payload};
use cobalt_proto::message::{opt, Code, Message, Options};
use std::sync::{Mutex, MutexGuard};

/// Length of the Echo value a server sends to recover its replay window.
const ECHO_LEN: usize = 8;

/// One OSCORE security context with its peer: keys, the sender sequence and the
/// replay window. Shared by every request that uses it (the state sits behind locks
/// held for a few instructions).
#[derive(Debug)]
pub struct SecurityContext {
    name: String,
    material: Material,
    keys: Keys,
    sequence: Mutex<SenderSequence>,
    window: Mutex<ReplayWindow>,
    /// The Echo value that proves a request fresh after a restart (Appendix B.1.2).
    echo: [u8; ECHO_LEN],
    /// The lock on the directory the context was read from, held while it is used.
    _lock: Option<std::fs::File>,
}

/// What a response is bound to: the request's kid (the client's Sender ID) and
/// Partial IV (RFC 8613 §5.4), and whether the request's nonce may be reused for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestBinding {
    /// The kid of the request.
    pub kid: Vec<u8>,
    /// The Partial IV of the request.
    pub partial_iv: Vec<u8>,
}

/// Why a protected request is not served, and how the server answers (RFC 8613 §8.2).
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    /// The OSCORE option is malformed or lacks the Partial IV or kid: 4.02.
    #[error("{0}")]
    BadOption(#[from] OptionError),
    /// The option lacks a Partial IV or a kid, which every request carries: 4.02.
    #[error("the OSCORE option of a request must carry a Partial IV and a kid")]
    Incomplete,
    /// No context has the kid (and kid context): 4.01.
    #[error("Security context not found")]
    NoContext,
    /// Replayed: 4.01.
    #[error("Replay detected")]
    Replay,
    /// The ciphertext does not verify: 4.00.
    #[error("Decryption failed")]
    Decrypt,
    /// The decrypted plaintext is not a CoAP code, options and payload: 4.00.
    #[error("the decrypted request is not a well-formed CoAP message")]
    Plaintext,
    /// The replay window is unknown (after a restart) and the request carried no
    /// matching Echo: answered with a protected 4.01 and an Echo (Appendix B.1.2),
    /// which this response is.
    #[error("freshness unknown after a restart: answered with an Echo")]
    EchoNeeded(Box<Message>),
    /// The answer could not be protected.
    #[error("{0}")]
    Sequence(#[from] SequenceError),
}

impl RequestError {
    /// The response the server sends: unprotected errors with Max-Age 0 and the
    /// diagnostic payload RFC 8613 §8.2 suggests, or the protected Echo challenge.
    pub fn into_response(self) -> Message {
        let code = match self {
            RequestError::EchoNeeded(answer) => return *answer,
            RequestError::BadOption(_) | RequestError::Incomplete => Code::BAD_OPTION,
            RequestError::NoContext | RequestError::Replay => Code::UNAUTHORIZED,
            RequestError::Decrypt | RequestError::Plaintext => Code::BAD_REQUEST,
            RequestError::Sequence(_) => Code::INTERNAL_SERVER_ERROR,
        };
        let mut answer = Message::new(cobalt_proto::message::MessageType::Acknowledgement, code, 0);
        answer.options.set_uint(opt::MAX_AGE, 0);
        answer.payload = self.to_string().into_bytes();
        answer
    }
}

/// Why a protected response is not accepted (RFC 8613 §8.4).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResponseError {
    /// The OSCORE option is malformed.
    #[error("{0}")]
    BadOption(#[from] OptionError),
    /// The ciphertext does not verify.
    #[error("the response does not decrypt with this context (wrong key, or altered on the way)")]
    Decrypt,
    /// The decrypted plaintext is not a CoAP code, options and payload.
    #[error("the decrypted response is not a well-formed CoAP message")]
    Plaintext,
}

impl From<DecryptError> for ResponseError {
    fn from(_: DecryptError) -> ResponseError {
        ResponseError::Decrypt
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl SecurityContext {
    /// A context from `material` with an in-memory sequence starting at 0 and a
    /// fresh replay window: for material that is never used again after the process
    /// ends (tests, keys made for one run). Persisted contexts come from
    /// [`SecurityContext::with_sequence`].
    pub fn new(material: Material) -> Result<SecurityContext, MaterialError> {
        SecurityContext::with_sequence(material, SenderSequence::in_memory(0), false)
    }

    /// A context from `material` using `sequence`; `restarted` says that the peer's
    /// sequence numbers seen before are unknown (the process restarted), so the first
    /// request must prove its freshness with an Echo.
    pub fn with_sequence(
        material: Material,
        sequence: SenderSequence,
        restarted: bool,
    ) -> Result<SecurityContext, MaterialError> {
        let keys = material.derive()?;
        let window = if restarted {
            ReplayWindow::unknown(material.replay_window)
        } else {
            ReplayWindow::new(material.replay_window)
        };
        Ok(SecurityContext {
            name: format!("rid:{}", hex(&material.recipient_id)),
            material,
            keys,
            sequence: Mutex::new(sequence),
            window: Mutex::new(window),
            echo: rand::random(),
            _lock: None,
        })
    }

    /// This context holding `lock` (of its directory) until it is dropped.
    pub(crate) fn holding(mut self, lock: std::fs::File) -> SecurityContext {
        self._lock = Some(lock);
        self
    }

    /// This context with a name (e.g. the label of a credentials entry), which
    /// authorisation can check; by default `rid:` and the Recipient ID in hex.
    pub fn named(mut self, name: impl Into<String>) -> SecurityContext {
        self.name = name.into();
        self
    }

    /// The context's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The material it was made from.
    pub fn material(&self) -> &Material {
        &self.material
    }

    /// The sequence number the next protected message will use.
    pub fn next_sequence_number(&self) -> u64 {
        lock(&self.sequence).peek()
    }

    /// Whether a request with `kid` and `kid_context` (from its OSCORE option) is
    /// meant for this context.
    pub fn matches(&self, kid: &[u8], kid_context: Option<&[u8]>) -> bool {
        kid == self.material.recipient_id
            && kid_context.is_none_or(|c| self.material.id_context.as_deref() == Some(c))
    }

    /// A fresh Partial IV from the sender sequence.
    fn fresh_partial_iv(&self) -> Result<Vec<u8>, SequenceError> {
        Ok(partial_iv(lock(&self.sequence).take()?))
    }

    /// Encrypts `message`'s code, inner options and payload into its payload and
    /// leaves the outer options with `option` added and `outer_code` as its code.
    fn seal(
        &self,
        message: &mut Message,
        outer_code: Code,
        option: &OscoreOption,
        nonce_id: &[u8],
        nonce_piv: &[u8],
        binding: &RequestBinding,
    ) {
        let (inner, mut outer) = classes::split(&message.options);
        let mut plaintext = vec![message.code.0];
        encode_options_and_payload(&inner, &message.payload, &mut plaintext);
        let nonce = self.keys.nonce(nonce_id, nonce_piv);
        let aad = aad(&binding.kid, &binding.partial_iv);
        message.payload = self.keys.seal(&nonce, &aad, &plaintext);
        outer.push(OSCORE, option.encode());
        message.options = outer;
        message.code = outer_code;
    }

    /// Protects a request in place (RFC 8613 §8.1) with the next sequence number; what
    /// its response is bound to.
    pub fn protect_request(&self, message: &mut Message) -> Result<RequestBinding, SequenceError> {
        let piv = self.fresh_partial_iv()?;
        let binding = RequestBinding {
            kid: self.material.sender_id.clone(),
            partial_iv: piv.clone(),
        };
        let option = OscoreOption {
            partial_iv: piv.clone(),
            kid: Some(self.material.sender_id.clone()),
            kid_context: self.material.id_context.clone(),
        };
        let outer_code = if message.options.contains(opt::OBSERVE) {
            Code::FETCH
        } else {
            Code::POST
        };
        self.seal(
            message,
            outer_code,
            &option,
            &self.material.sender_id,
            &piv,
            &binding,
        );
        Ok(binding)
    }

    /// Verifies and decrypts a request whose OSCORE option `option` named this context
    /// (RFC 8613 §8.2), in place: the request as the client made it, and what the
    /// response is bound to.
    pub fn unprotect_request(
        &self,
        message: &mut Message,
        option: &OscoreOption,
    ) -> Result<RequestBinding, RequestError> {
        let kid = option.kid.as_ref().ok_or(RequestError::Incomplete)?;
        if option.partial_iv.is_empty() {
            return Err(RequestError::Incomplete);
        }
        let binding = RequestBinding {
            kid: kid.clone(),
            partial_iv: option.partial_iv.clone(),
        };
        let seq = sequence_number(&option.partial_iv);
        let unknown = match lock(&self.window).check(seq) {
            Ok(()) => false,
            Err(ReplayError::Unknown) => true,
            Err(ReplayError::Replayed) => return Err(RequestError::Replay),
        };
        let nonce = self.keys.nonce(kid, &option.partial_iv);
        let aad = aad(kid, &option.partial_iv);
        let plaintext = self
            .keys
            .open(&nonce, &aad, &message.payload)
            .map_err(|_| RequestError::Decrypt)?;
        let (code, mut inner) = decode_plaintext(&plaintext).ok_or(RequestError::Plaintext)?;
        {
            let mut window = lock(&self.window);
            if unknown && window.is_unknown() {
                if inner.options.get(opt::ECHO) != Some(&self.echo[..]) {
                    drop(window);
                    return Err(RequestError::EchoNeeded(Box::new(
                        self.echo_challenge(&binding)?,
                    )));
                }
                window.initialize(seq);
                inner.options.remove(opt::ECHO);
            } else {
                // Checked again: another request may have taken the number meanwhile.
                window.check(seq).map_err(|_| RequestError::Replay)?;
                window.accept(seq);
            }
        }
        for o in message.options.iter() {
            if classes::is_outer_only(o.number) && o.number != OSCORE {
                inner.options.push(o.number, o.value);
            }
        }
        if !message.options.contains(opt::OBSERVE) {
            inner.options.remove(opt::OBSERVE);
        }
        message.code = code;
        message.options = inner.options;
        message.payload = inner.payload;
        Ok(binding)
    }

    /// The protected 4.01 with an Echo that asks a client to repeat its request and
    /// so prove it fresh (Appendix B.1.2).
    fn echo_challenge(&self, binding: &RequestBinding) -> Result<Message, SequenceError> {
        let mut answer = Message::new(
            cobalt_proto::message::MessageType::Acknowledgement,
            Code::UNAUTHORIZED,
            0,
        );
        answer.options.set(opt::ECHO, self.echo);
        self.protect_response(&mut answer, binding, true)?;
        Ok(answer)
    }

    /// Protects a response in place (RFC 8613 §8.3) for the request `binding` names:
    /// with the request's nonce, or with a fresh Partial IV of its own when `fresh`
    /// (notifications, and any answer whose request may not be unique).
    pub fn protect_response(
        &self,
        message: &mut Message,
        binding: &RequestBinding,
        fresh: bool,
    ) -> Result<(), SequenceError> {
        let outer_code = if message.options.contains(opt::OBSERVE) {
            Code::CONTENT
        } else {
            Code::CHANGED
        };
        if fresh {
            let piv = self.fresh_partial_iv()?;
            let option = OscoreOption {
                partial_iv: piv.clone(),
                ..OscoreOption::default()
            };
            self.seal(
                message,
                outer_code,
                &option,
                &self.material.sender_id,
                &piv,
                binding,
            );
        } else {
            self.seal(
                message,
                outer_code,
                &OscoreOption::default(),
                &binding.kid,
                &binding.partial_iv,
                binding,
            );
        }
        Ok(())
    }

    /// Verifies and decrypts, in place, a response to the request `binding` names
    /// (RFC 8613 §8.4); the sequence number of its own Partial IV, if it has one
    /// (notifications: a later one must be higher).
    pub fn unprotect_response(
        &self,
        message: &mut Message,
        binding: &RequestBinding,
    ) -> Result<Option<u64>, ResponseError> {
        let option = OscoreOption::decode(message.options.get(OSCORE).unwrap_or_default())?;
        let nonce = if option.partial_iv.is_empty() {
            self.keys.nonce(&binding.kid, &binding.partial_iv)
        } else {
            self.keys
                .nonce(&self.material.recipient_id, &option.partial_iv)
        };
        let aad = aad(&binding.kid, &binding.partial_iv);
        let plaintext = self.keys.open(&nonce, &aad, &message.payload)?;
        let (code, mut inner) = decode_plaintext(&plaintext).ok_or(ResponseError::Plaintext)?;
        match message.options.get(opt::OBSERVE) {
            Some(outer) => inner.options.set(opt::OBSERVE, outer),
            None => inner.options.remove(opt::OBSERVE),
        }
        message.code = code;
        message.options = inner.options;
        message.payload = inner.payload;
        Ok((!option.partial_iv.is_empty()).then(|| sequence_number(&option.partial_iv)))
    }
}

/// The decrypted inner message: code, options and payload.
struct Inner {
    options: Options,
    payload: Vec<u8>,
}

/// Reads a plaintext: one code byte, then options and payload as on the wire.
fn decode_plaintext(plaintext: &[u8]) -> Option<(Code, Inner)> {
    let (&code, rest) = plaintext.split_first()?;
    let (options, payload) = decode_options_and_payload(rest).ok()?;
    if options.iter().any(|o| o.number == OSCORE) {
        return None;
    }
    Some((
        Code(code),
        Inner {
            options,
            payload: payload.to_vec(),
        },
    ))
}

#[cfg(test)]
mod tests;
