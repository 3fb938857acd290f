//! The per-packet log: one CSV line per packet at its fate (delivery or drop), with
//! the header fields needed to follow CoAP exchanges over UDP (type and message ID)
//! and TCP segments (sequence and acknowledgement numbers, flags, payload length).

use cobalt_proto::sim::link::{Fate, Nanos};
use std::io::{self, Write};
use std::net::Ipv4Addr;

/// The CSV header line.
pub const HEADER: &str =
    "arrived_ns,at_ns,dir,fate,len,proto,src,sport,dst,dport,coap_type,coap_mid,tcp_seq,tcp_ack,tcp_flags,tcp_payload";

/// One logged packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// When it reached the emulator (ns since the start).
    pub arrived: Nanos,
    /// When it was delivered or dropped.
    pub at: Nanos,
    /// True from the client side to the server side.
    pub up: bool,
    /// Its fate.
    pub fate: Fate,
    /// IP packet length.
    pub len: usize,
    /// IP protocol number (17 UDP, 6 TCP).
    pub proto: u8,
    /// Source address and port.
    pub src: (Ipv4Addr, u16),
    /// Destination address and port.
    pub dst: (Ipv4Addr, u16),
    /// UDP: the CoAP message type (0 CON, 1 NON, 2 ACK, 3 RST) and ID, if it parses.
    pub coap: Option<(u8, u16)>,
    /// TCP: sequence and acknowledgement numbers, flags and payload length.
    pub tcp: Option<(u32, u32, u8, usize)>,
}

fn fate_name(f: Fate) -> &'static str {
    match f {
        Fate::Delivered => "delivered",
        Fate::DroppedMtu => "mtu",
        Fate::DroppedQueue => "queue",
        Fate::DroppedLoss => "loss",
    }
}

/// Parses the headers of an IPv4 packet for the log.
pub fn parse_packet(arrived: Nanos, at: Nanos, up: bool, fate: Fate, p: &[u8]) -> Record {
    let mut r = Record {
        arrived,
        at,
        up,
        fate,
        len: p.len(),
        proto: 0,
        src: (Ipv4Addr::UNSPECIFIED, 0),
        dst: (Ipv4Addr::UNSPECIFIED, 0),
        coap: None,
        tcp: None,
    };
    if p.len() < 20 || p[0] >> 4 != 4 {
        return r;
    }
    let ihl = usize::from(p[0] & 0x0f) * 4;
    r.proto = p[9];
    let addr = |o: usize| Ipv4Addr::new(p[o], p[o + 1], p[o + 2], p[o + 3]);
    let port = |o: usize| {
        p.get(o..o + 2)
            .map_or(0, |b| u16::from_be_bytes([b[0], b[1]]))
    };
    r.src = (addr(12), port(ihl));
    r.dst = (addr(16), port(ihl + 2));
    match r.proto {
        17 => {
            if let Some(h) = p.get(ihl + 8..ihl + 12) {
                if h[0] >> 6 == 1 {
                    r.coap = Some(((h[0] >> 4) & 3, u16::from_be_bytes([h[2], h[3]])));
                }
            }
        }
        6 => {
            if let Some(h) = p.get(ihl..ihl + 20) {
                let word = |o: usize| u32::from_be_bytes([h[o], h[o + 1], h[o + 2], h[o + 3]]);
                let doff = usize::from(h[12] >> 4) * 4;
                r.tcp = Some((word(4), word(8), h[13], p.len().saturating_sub(ihl + doff)));
            }
        }
        _ => {}
    }
    r
}

/// Writes the line of one packet.
pub fn write_line(
    w: &mut impl Write,
    arrived: Nanos,
    at: Nanos,
    up: bool,
    fate: Fate,
    packet: &[u8],
) -> io::Result<()> {
    let r = parse_packet(arrived, at, up, fate, packet);
    let (ct, cm) = r.coap.map_or((String::new(), String::new()), |(t, m)| {
        (t.to_string(), m.to_string())
    });
    let (seq, ack, flags, len) = r.tcp.map_or_else(Default::default, |(s, a, f, l)| {
        (s.to_string(), a.to_string(), f.to_string(), l.to_string())
    });
    writeln!(
        w,
        "{},{},{},{},{},{},{},{},{},{},{ct},{cm},{seq},{ack},{flags},{len}",
        r.arrived,
        r.at,
        if r.up { "up" } else { "down" },
        fate_name(r.fate),
        r.len,
        r.proto,
        r.src.0,
        r.src.1,
        r.dst.0,
        r.dst.1,
    )
}

/// Reads one line written by [`write_line`]; `None` for the header or a bad line.
pub fn parse_line(line: &str) -> Option<Record> {
    let f: Vec<&str> = line.trim_end().split(',').collect();
    if f.len() != 16 || f[0] == "arrived_ns" {
        return None;
    }
    let fate = match f[3] {
        "delivered" => Fate::Delivered,
        "mtu" => Fate::DroppedMtu,
        "queue" => Fate::DroppedQueue,
        "loss" => Fate::DroppedLoss,
        _ => return None,
    };
    fn opt(s: &str) -> Option<&str> {
        (!s.is_empty()).then_some(s)
    }
    Some(Record {
        arrived: f[0].parse().ok()?,
        at: f[1].parse().ok()?,
        up: f[2] == "up",
        fate,
        len: f[4].parse().ok()?,
        proto: f[5].parse().ok()?,
        src: (f[6].parse().ok()?, f[7].parse().ok()?),
        dst: (f[8].parse().ok()?, f[9].parse().ok()?),
        coap: match (opt(f[10]), opt(f[11])) {
            (Some(t), Some(m)) => Some((t.parse().ok()?, m.parse().ok()?)),
            _ => None,
        },
        tcp: match (opt(f[12]), opt(f[13]), opt(f[14]), opt(f[15])) {
            (Some(s), Some(a), Some(fl), Some(l)) => Some((
                s.parse().ok()?,
                a.parse().ok()?,
                fl.parse().ok()?,
                l.parse().ok()?,
            )),
            _ => None,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ipv4(proto: u8, l4: &[u8]) -> Vec<u8> {
        let mut p = vec![
            0x45, 0, 0, 0, 0, 0, 0, 0, 64, proto, 0, 0, 10, 78, 1, 2, 10, 78, 2, 1,
        ];
        p.extend_from_slice(l4);
        let len = p.len() as u16;
        p[2..4].copy_from_slice(&len.to_be_bytes());
        p
    }

    #[test]
    fn coap_over_udp_and_tcp_segments_round_trip_through_the_log() {
        // UDP 40000 → 5683, CoAP CON GET with MID 0x1234.
        let udp = ipv4(
            17,
            &[0x9c, 0x40, 0x16, 0x33, 0, 12, 0, 0, 0x41, 0x01, 0x12, 0x34],
        );
        // TCP 40001 → 5683, seq 7, ack 9, PSH|ACK, 5 bytes of payload.
        let mut tcp_h = vec![
            0x9c, 0x41, 0x16, 0x33, 0, 0, 0, 7, 0, 0, 0, 9, 0x50, 0x18, 0, 0,
        ];
        tcp_h.extend_from_slice(&[0; 4]);
        tcp_h.extend_from_slice(b"hello");
        let tcp = ipv4(6, &tcp_h);
        let mut out = Vec::new();
        write_line(&mut out, 1, 2, true, Fate::Delivered, &udp).unwrap();
        write_line(&mut out, 3, 4, false, Fate::DroppedQueue, &tcp).unwrap();
        let text = String::from_utf8(out).unwrap();
        let recs: Vec<Record> = text.lines().filter_map(parse_line).collect();
        assert_eq!(recs.len(), 2);
        assert_eq!(recs[0].coap, Some((0, 0x1234)));
        assert_eq!(recs[0].src, ("10.78.1.2".parse().unwrap(), 40000));
        assert_eq!(recs[1].tcp, Some((7, 9, 0x18, 5)));
        assert_eq!(recs[1].fate, Fate::DroppedQueue);
        assert!(!recs[1].up);
        assert!(parse_line(HEADER).is_none());
    }
}
