//! A client's side of EDHOC: message_1 and message_3 sent to a server's
//! `/.well-known/edhoc` (RFC 9528 Appendix A.2), message_2 verified against the
//! server's credential the client expects, and the OSCORE context that results.

use super::credential::{Ccs, EdhocIdentity};
use super::{crypto, encode_connection_id, error_text, guarded, is_compact_id, oscore_material};
use super::{CID_EDHOC_CBOR_SEQ, WELL_KNOWN_EDHOC};
use crate::security::SecurityContext;
use cobalt::proto::message::Code;
use cobalt::{Client, Response};
use lakers::{EDHOCMethod, EDHOCSuite, EdhocInitiator, EdhocMessageBuffer};

/// Why EDHOC with a server did not give a context.
#[derive(Debug, thiserror::Error)]
pub enum EdhocError {
    /// The request could not be sent or got no answer.
    #[error("EDHOC {step} to {uri}: {source}")]
    Request {
        /// `message_1` or `message_3`.
        step: &'static str,
        /// The server's EDHOC resource.
        uri: String,
        /// What went wrong.
        source: cobalt::Error,
    },
    /// The server answered with an error.
    #[error("the server refused EDHOC {step} with {code}: {why}")]
    Refused {
        /// `message_1` or `message_3`.
        step: &'static str,
        /// Its response code.
        code: Code,
        /// Its EDHOC error message's text, or its payload.
        why: String,
    },
    /// The server's answer is not a valid EDHOC message.
    #[error("the server's {step} is not acceptable: {why}")]
    Invalid {
        /// `message_2` or `message_4`.
        step: &'static str,
        /// What lakers or the check said.
        why: String,
    },
    /// The server authenticated with another credential than the one expected.
    #[error("the server authenticated with another credential than the one configured for it (peer_cred)")]
    UnexpectedCredential,
}

/// How a client ends EDHOC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Completion {
    /// message_3 in a request of its own, answered with message_4 (RFC 9528 Appendix
    /// A.2): one round trip more, but every EDHOC server takes it.
    #[default]
    Message4,
    /// message_3 in front of the first OSCORE request (the EDHOC + OSCORE combined
    /// request, RFC 9668), for servers that support it.
    Combined,
}

/// The OSCORE context a client's EDHOC made, and for [`Completion::Combined`] the
/// message_3 its first request must carry
/// ([`Oscore::protect_edhoc`](crate::Oscore::protect_edhoc) sends it).
#[derive(Debug)]
pub struct EdhocContext {
    context: SecurityContext,
    message_3: Option<Vec<u8>>,
}

impl EdhocContext {
    /// The OSCORE context.
    pub fn context(&self) -> &SecurityContext {
        &self.context
    }

    /// Whether the server still waits for message_3 in the first request.
    pub fn awaits_combined_request(&self) -> bool {
        self.message_3.is_some()
    }

    pub(crate) fn into_parts(self) -> (SecurityContext, Option<Vec<u8>>) {
        (self.context, self.message_3)
    }
}

/// Runs EDHOC with the server at `origin` (`coap://host:port`) as `identity`, expecting
/// it to authenticate with `server`: the OSCORE context for requests to it, named
/// `origin`, for [`Oscore::protect_edhoc`](crate::Oscore::protect_edhoc).
pub async fn establish(
    client: &Client,
    origin: &str,
    identity: &EdhocIdentity,
    server: &Ccs,
    completion: Completion,
) -> Result<EdhocContext, EdhocError> {
    let uri = format!(
        "{}/{}",
        origin.trim_end_matches('/'),
        WELL_KNOWN_EDHOC.join("/")
    );
    let invalid = |step, e: lakers::EDHOCError| EdhocError::Invalid {
        step,
        why: format!("{e:?}"),
    };
    let mut initiator =
        EdhocInitiator::new(crypto(), EDHOCMethod::StatStat, EDHOCSuite::CipherSuite2);
    initiator.set_identity(identity.private_key(), identity.credential().lakers());
    let c_i = pick_own_id();
    let conn_id = lakers::ConnId::from_slice(&c_i).expect("a one-byte identifier fits");
    let (waiting, message_1) = initiator
        .prepare_message_1(Some(conn_id), &None)
        .map_err(|e| invalid("message_1", e))?;
    let mut payload = vec![0xf5]; // CBOR true: this is message_1
    payload.extend_from_slice(message_1.as_slice());
    let answer = post(client, &uri, "message_1", payload).await?;
    let message_2 =
        EdhocMessageBuffer::new_from_slice(&answer.payload).map_err(|_| EdhocError::Invalid {
            step: "message_2",
            why: "too long".into(),
        })?;
    let (mut processing, c_r, id_cred_r, ead_2) =
        guarded(|| waiting.parse_message_2(&message_2)).map_err(|e| invalid("message_2", e))?;
    if ead_2.is_some_and(|ead| ead.is_critical) {
        return Err(EdhocError::Invalid {
            step: "message_2",
            why: "it carries a critical EAD item".into(),
        });
    }
    if !server.is_named_by(&id_cred_r) {
        return Err(EdhocError::UnexpectedCredential);
    }
    let c_r = c_r.as_slice().to_vec();
    if c_r == c_i {
        return Err(EdhocError::Invalid {
            step: "message_2",
            why: "C_R is this client's C_I".into(),
        });
    }
    // The identity was set before message_1; lakers only refuses a second one.
    let _ = processing.set_identity(identity.private_key(), identity.credential().lakers());
    let processed = processing
        .verify_message_2(server.lakers())
        .map_err(|e| invalid("message_2", e))?;
    let (waiting, message_3, _prk_out) = processed
        .prepare_message_3(identity.style().lakers(), &None)
        .map_err(|e| invalid("message_3", e))?;
    let derived = |material| {
        SecurityContext::new(material)
            .map(|c| c.named(origin))
            .map_err(|e| EdhocError::Invalid {
                step: "message_2",
                why: format!("the derived context is not usable: {e}"),
            })
    };
    if completion == Completion::Combined {
        let mut done = waiting
            .completed_without_message_4()
            .map_err(|e| invalid("message_3", e))?;
        return Ok(EdhocContext {
            context: derived(oscore_material(&mut done, &c_i, &c_r))?,
            message_3: Some(message_3.as_slice().to_vec()),
        });
    }
    let mut payload = encode_connection_id(&c_r);
    payload.extend_from_slice(message_3.as_slice());
    let answer = post(client, &uri, "message_3", payload).await?;
    let material = if answer.payload.is_empty() {
        let mut done = waiting
            .completed_without_message_4()
            .map_err(|e| invalid("message_4", e))?;
        oscore_material(&mut done, &c_i, &c_r)
    } else {
        let message_4 = EdhocMessageBuffer::new_from_slice(&answer.payload).map_err(|_| {
            EdhocError::Invalid {
                step: "message_4",
                why: "too long".into(),
            }
        })?;
        let (mut done, _ead_4) = guarded(|| waiting.process_message_4(&message_4))
            .map_err(|e| invalid("message_4", e))?;
        oscore_material(&mut done, &c_i, &c_r)
    };
    Ok(EdhocContext {
        context: derived(material)?,
        message_3: None,
    })
}

/// POSTs an EDHOC message; the 2.04 answer or why there was none.
async fn post(
    client: &Client,
    uri: &str,
    step: &'static str,
    payload: Vec<u8>,
) -> Result<Response, EdhocError> {
    let answer = client
        .request(Code::POST, uri)
        .content_format(CID_EDHOC_CBOR_SEQ)
        .payload(payload)
        .send()
        .await
        .map_err(|source| EdhocError::Request {
            step,
            uri: uri.to_string(),
            source,
        })?;
    if answer.code != Code::CHANGED {
        let why = error_text(&answer.payload).unwrap_or_else(|| answer.text_payload());
        return Err(EdhocError::Refused {
            step,
            code: answer.code,
            why,
        });
    }
    Ok(answer)
}

/// A random connection identifier of one byte (one of the 48 that encode as an
/// integer): the client's Recipient ID.
fn pick_own_id() -> Vec<u8> {
    let byte: u8 = rand::random::<u8>() % 48;
    let id = if byte < 24 { byte } else { 0x20 + byte - 24 };
    debug_assert!(is_compact_id(id));
    vec![id]
}
