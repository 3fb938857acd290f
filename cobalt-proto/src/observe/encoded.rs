//! A notification encoded once for every observer that gets the same representation.
//!
//! When a resource changes, every observer whose registration asks for the same
//! representation gets the same notification but for three things: the message type
//! (CON or NON), the message ID and the token. All three sit in the header and the
//! token in front of the options (RFC 7252 §3), so the options and payload, the Observe
//! value included, are encoded once per change and each observer's datagram is its
//! header and token written in front of them: byte for byte what encoding the whole
//! message for that observer gives.

use crate::message::codec;
use crate::message::{Code, Message, MessageType, Token};

/// A notification's options and payload encoded once, kept with the message they were
/// encoded from (for the paths that need the message itself: a notification waiting for
/// its observer's address to be verified, a transport that frames messages otherwise).
#[derive(Debug, Clone)]
pub struct EncodedNotification {
    message: Message,
    /// The options and payload as they go on the wire.
    tail: Vec<u8>,
}

impl EncodedNotification {
    /// Encodes `message`'s options and payload; its type, message ID and token are
    /// set per observer by [`EncodedNotification::write`].
    pub fn new(message: Message) -> EncodedNotification {
        let mut tail = Vec::with_capacity(codec::options_and_payload_len(
            &message.options,
            &message.payload,
        ));
        codec::encode_options_and_payload(&message.options, &message.payload, &mut tail);
        EncodedNotification { message, tail }
    }

    /// The message it was encoded from.
    pub fn message(&self) -> &Message {
        &self.message
    }

    /// The response code.
    pub fn code(&self) -> Code {
        self.message.code
    }

    /// The length of one observer's datagram with a token of `token_len` bytes.
    pub fn len_with_token(&self, token_len: usize) -> usize {
        4 + codec::token_wire_len(token_len) + self.tail.len()
    }

    /// Replaces `out`'s contents with the datagram for one observer: the notification
    /// with type `mtype`, message ID `mid` and `token`.
    pub fn write(&self, mtype: MessageType, mid: u16, token: &Token, out: &mut Vec<u8>) {
        out.clear();
        out.reserve(self.len_with_token(token.len()));
        // The header and token: what a message without options or payload encodes to.
        let mut header = Message::new(mtype, self.message.code, mid);
        header.token = token.clone();
        codec::encode_into(&header, out);
        out.extend_from_slice(&self.tail);
    }

    /// The notification for one observer as a message (what [`EncodedNotification::write`]
    /// encodes).
    pub fn to_message(&self, mtype: MessageType, mid: u16, token: Token) -> Message {
        let mut message = self.message.clone();
        message.mtype = mtype;
        message.mid = mid;
        message.token = token;
        message
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::opt;

    fn notification() -> Message {
        let mut m = Message::new(MessageType::NonConfirmable, Code::CONTENT, 0);
        m.options.set_uint(opt::OBSERVE, 0x01_02_03);
        m.options.set_uint(opt::CONTENT_FORMAT, 0);
        m.options.set_uint(opt::MAX_AGE, 60);
        m.payload = b"state-000042".to_vec();
        m
    }

    #[test]
    fn each_observers_datagram_is_the_whole_message_encoded() {
        let encoded = EncodedNotification::new(notification());
        let mut out = Vec::new();
        let tokens = [
            Token::EMPTY,
            Token::new(&[7]).unwrap(),
            Token::new(&[1, 2, 3, 4, 5, 6, 7, 8]).unwrap(),
            Token::new(&[0x5a; 13]).unwrap(),
            Token::new(&[0xa5; 300]).unwrap(),
        ];
        for (i, token) in tokens.into_iter().enumerate() {
            for mtype in [MessageType::Confirmable, MessageType::NonConfirmable] {
                let mid = 0xfff0 + i as u16;
                encoded.write(mtype, mid, &token, &mut out);
                let whole = encoded.to_message(mtype, mid, token.clone());
                assert_eq!(out, codec::encode(&whole), "{mtype:?}, token {token:?}");
                assert_eq!(out.len(), encoded.len_with_token(token.len()));
                let back = codec::decode(&out).unwrap();
                assert_eq!((back.mtype, back.mid, &back.token), (mtype, mid, &token));
                assert_eq!(back.options.observe(), Some(0x01_02_03));
            }
        }
    }

    #[test]
    fn a_notification_without_payload_has_no_payload_marker() {
        let mut m = notification();
        m.payload.clear();
        let encoded = EncodedNotification::new(m);
        let mut out = vec![0xaa; 100]; // replaced, not appended to
        encoded.write(MessageType::NonConfirmable, 1, &Token::EMPTY, &mut out);
        assert!(!out.contains(&0xff), "{out:?}");
        assert_eq!(
            out,
            codec::encode(&encoded.to_message(MessageType::NonConfirmable, 1, Token::EMPTY))
        );
    }
}
