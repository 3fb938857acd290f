use super::stream::{StreamEndpoint, StreamTransmit};
use super::*;
use crate::endpoint::{DeliveryFailure, EndpointConfig};
use crate::message::{Code, MessageType};
use crate::tcp_connection::TcpConfig;

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

#[test]
fn endpoint_events_survive_the_round_trip_through_the_session_view() {
    let peer = addr("10.0.0.1:5683");
    let request = Message::new(MessageType::Confirmable, Code::GET, 0);
    let events = [
        Event::Request {
            id: ExchangeId(1),
            peer,
            request: request.clone(),
        },
        Event::Response {
            id: RequestId(2),
            response: request,
        },
        Event::Timeout {
            id: RequestId(3),
            peer,
            retransmissions: 4,
        },
        Event::Reset {
            id: RequestId(5),
            peer,
        },
        Event::ResponseFailed {
            id: ExchangeId(6),
            reason: DeliveryFailure::Reset,
        },
    ];
    for event in events {
        let session = SessionEvent::from(event.clone());
        assert_eq!(Event::try_from(session), Ok(event));
    }
    let stream = SessionEvent::Failed {
        id: Outbound::Stream {
            peer,
            token: Token::new(&[1]).unwrap(),
        },
        peer,
        reason: Failure::Closed(CloseReason::PeerClosed),
    };
    assert_eq!(Event::try_from(stream.clone()), Err(stream));
}

#[test]
fn ids_of_the_other_kind_of_session_are_refused() {
    let now = Instant::now();
    let peer = addr("10.0.0.1:5683");
    let mut endpoint = Endpoint::new(EndpointConfig::default(), now);
    let stream_id = Inbound::Stream {
        peer,
        token: Token::new(&[1]).unwrap(),
    };
    let ok = Message::new(MessageType::Acknowledgement, Code::CONTENT, 0);
    assert_eq!(
        Session::respond(&mut endpoint, now, stream_id.clone(), ok.clone()),
        Err(SessionError::WrongSession)
    );
    let mut streams = StreamEndpoint::new(TcpConfig::default(), 1);
    assert_eq!(
        streams.respond(now, Inbound::Datagram(ExchangeId(1)), ok.clone()),
        Err(SessionError::WrongSession)
    );
    assert_eq!(
        streams.respond(now, stream_id, ok),
        Err(SessionError::NotConnected(peer))
    );
}

#[test]
fn a_stream_request_connects_and_a_closed_connection_is_forgotten() {
    let now = Instant::now();
    let peer = addr("10.0.0.1:5683");
    let mut streams = StreamEndpoint::new(TcpConfig::default(), 1);
    let get = Message::new(MessageType::Confirmable, Code::GET, 0);
    let id = Session::request(&mut streams, now, peer, get).unwrap();
    assert_eq!(streams.poll_transmit(), Some(StreamTransmit::Connect(peer)));
    // The CSM and the request, written together.
    assert!(matches!(streams.poll_transmit(), Some(StreamTransmit::Data(p, _)) if p == peer));
    assert_eq!(streams.poll_transmit(), None);
    assert_eq!(streams.connections(), 1);
    // The peer goes away: the request fails, the connection is closed and forgotten.
    streams.handle_eof(peer);
    assert_eq!(
        streams.poll_event(),
        Some(SessionEvent::Failed {
            id,
            peer,
            reason: Failure::Closed(CloseReason::PeerClosed)
        })
    );
    assert!(matches!(
        streams.poll_event(),
        Some(SessionEvent::Connection {
            event: TcpEvent::Closed { .. },
            ..
        })
    ));
    assert_eq!(streams.poll_transmit(), Some(StreamTransmit::Close(peer)));
    assert_eq!(streams.connections(), 0);
}
