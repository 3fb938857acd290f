//! Group requests (RFC 7252 §8.1, draft-ietf-core-groupcomm-bis): a NON request to a
//! multicast address, and every answer that comes back until a deadline.
//!
//! Token reuse: each group request goes out from a socket of its own, bound for that
//! request only, with a fresh random 8-byte token; the socket closes when the wait
//! ends, so a late answer (one within groupcomm-bis's MIN_TOKEN_REUSE_TIME) finds no
//! one listening and can never be taken for the answer to a later request.

use crate::server::Response;
use crate::{Error, Result};
use cobalt_proto::message::{codec, Code, Message, MessageType, Token};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;
use tokio::net::UdpSocket;

/// The most answers one group request collects (the rest are dropped): anyone on the
/// link can answer.
pub const MAX_GROUP_ANSWERS: usize = 1024;

/// What a datagram that came back to a group request holds: the answer, when it is
/// a response (NON or CON) with the request's token.
fn group_answer(datagram: &[u8], token: &Token) -> Option<Message> {
    let m = codec::decode(datagram).ok()?;
    let response = matches!(m.code.class(), 2 | 4 | 5);
    let kind = matches!(
        m.mtype,
        MessageType::NonConfirmable | MessageType::Confirmable
    );
    (response && kind && m.token == *token).then_some(m)
}

/// Sends `message` (made NON, with a fresh token) to the group `group` and returns
/// every answer that came within `wait`, in the order received, one per responder
/// and message ID.
pub(crate) async fn ask_group(
    mut message: Message,
    group: SocketAddr,
    wait: Duration,
) -> Result<Vec<(SocketAddr, Response)>> {
    if !group.ip().is_multicast() {
        return Err(Error::Io(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!(
                "{} is not a multicast address: send a unicast request instead",
                group.ip()
            ),
        )));
    }
    let local: SocketAddr = match group {
        SocketAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        SocketAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let socket = UdpSocket::bind(local).await?;
    let token = Token::random(&mut rand::rng());
    message.mtype = MessageType::NonConfirmable;
    message.mid = rand::random();
    message.token = token.clone();
    socket.send_to(&codec::encode(&message), group).await?;
    let deadline = tokio::time::Instant::now() + wait;
    let mut answers: Vec<(SocketAddr, u16, Response)> = Vec::new();
    let mut buf = vec![0u8; 65536];
    loop {
        let received = tokio::time::timeout_at(deadline, socket.recv_from(&mut buf)).await;
        let Ok(received) = received else { break };
        let Ok((n, from)) = received else { continue };
        let Some(answer) = group_answer(&buf[..n], &token) else {
            continue;
        };
        if answer.mtype == MessageType::Confirmable {
            let ack = Message::new(MessageType::Acknowledgement, Code::EMPTY, answer.mid);
            let _ = socket.send_to(&codec::encode(&ack), from).await;
        }
        let seen = answers
            .iter()
            .any(|(f, mid, _)| *f == from && *mid == answer.mid);
        if !seen && answers.len() < MAX_GROUP_ANSWERS {
            answers.push((from, answer.mid, Response::from_message(answer)));
        }
    }
    Ok(answers.into_iter().map(|(from, _, r)| (from, r)).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn datagram(mtype: MessageType, code: Code, token: &[u8]) -> Vec<u8> {
        let mut m = Message::new(mtype, code, 4);
        m.token = Token::new(token).unwrap();
        m.payload = b"x".to_vec();
        codec::encode(&m)
    }

    #[test]
    fn only_responses_with_the_token_are_answers() {
        let token = Token::new(&[9, 9]).unwrap();
        let ok = datagram(MessageType::NonConfirmable, Code::CONTENT, &[9, 9]);
        assert_eq!(group_answer(&ok, &token).unwrap().payload, b"x");
        let con = datagram(MessageType::Confirmable, Code::NOT_FOUND, &[9, 9]);
        assert!(group_answer(&con, &token).is_some());
        let other = datagram(MessageType::NonConfirmable, Code::CONTENT, &[1]);
        assert!(group_answer(&other, &token).is_none());
        let request = datagram(MessageType::NonConfirmable, Code::GET, &[9, 9]);
        assert!(group_answer(&request, &token).is_none());
        let ack = datagram(MessageType::Acknowledgement, Code::CONTENT, &[9, 9]);
        assert!(group_answer(&ack, &token).is_none());
        assert!(group_answer(&[0x40], &token).is_none());
    }

    #[tokio::test]
    async fn a_unicast_address_is_refused() {
        let m = Message::new(MessageType::NonConfirmable, Code::GET, 1);
        let e = ask_group(m, "127.0.0.1:5683".parse().unwrap(), Duration::ZERO)
            .await
            .unwrap_err();
        assert!(e.to_string().contains("not a multicast address"), "{e}");
    }
}
