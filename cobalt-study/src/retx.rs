//! Retransmissions, and which of them were unnecessary, from the fates of packets on
//! the link (the simulator's observer or the emulator's packet log).
//!
//! CoAP over UDP: the copies of a confirmable request (same client port and message
//! ID) are matched with the server's ACKs in order — the server answers every copy it
//! receives, the first with the response and each duplicate with the same response
//! again, and the link never reorders — so the k-th delivered copy's answer is the k-th
//! ACK. A retransmission is unnecessary when an earlier copy reached the server and its
//! answer reached the client: that copy alone would have completed the exchange.
//!
//! TCP: a data segment is a retransmission when its sequence number was sent before on
//! the same connection and direction, and unnecessary when an earlier copy was
//! delivered (lost ACKs are not accounted, so this can overstate). SYN and SYN-ACK
//! copies after the first are counted apart (handshake retransmissions).

use std::collections::HashMap;

/// One packet's headers and fate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pkt {
    /// When it entered the link.
    pub sent: u64,
    /// From the client side.
    pub up: bool,
    /// Whether it was delivered.
    pub delivered: bool,
    /// The client's port (source if `up`, destination otherwise).
    pub port: u16,
    /// CoAP over UDP: message type and ID.
    pub coap: Option<(u8, u16)>,
    /// TCP: sequence number, flags, payload length.
    pub tcp: Option<(u32, u8, usize)>,
}

/// Retransmissions of one client port.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Retx {
    /// CoAP requests retransmitted (UDP) or data segments (TCP).
    pub total: u64,
    /// Of those, unnecessary ones.
    pub unnecessary: u64,
    /// TCP SYN and SYN-ACK retransmissions.
    pub handshake: u64,
}

const CON: u8 = 0;
const ACK: u8 = 2;
const SYN: u8 = 0x02;

/// Counts per client port.
pub fn analyse(mut pkts: Vec<Pkt>) -> HashMap<u16, Retx> {
    pkts.sort_by_key(|p| p.sent);
    let mut out: HashMap<u16, Retx> = HashMap::new();
    // CoAP: copies of each request, answers to each.
    let mut copies: HashMap<(u16, u16), Vec<bool>> = HashMap::new();
    let mut answers: HashMap<(u16, u16), Vec<bool>> = HashMap::new();
    // TCP: copies per (port, direction, seq); handshake copies per (port, direction).
    let mut segments: HashMap<(u16, bool, u32), Vec<bool>> = HashMap::new();
    let mut handshakes: HashMap<(u16, bool), u64> = HashMap::new();
    for p in &pkts {
        if let Some((t, mid)) = p.coap {
            match (p.up, t) {
                (true, CON) => copies.entry((p.port, mid)).or_default().push(p.delivered),
                (false, ACK) => answers.entry((p.port, mid)).or_default().push(p.delivered),
                _ => {}
            }
        }
        if let Some((seq, flags, len)) = p.tcp {
            if flags & SYN != 0 {
                let n = handshakes.entry((p.port, p.up)).or_default();
                if *n > 0 {
                    out.entry(p.port).or_default().handshake += 1;
                }
                *n += 1;
            } else if len > 0 {
                segments
                    .entry((p.port, p.up, seq))
                    .or_default()
                    .push(p.delivered);
            }
        }
    }
    for ((port, mid), copies) in copies {
        let answered = answers.get(&(port, mid));
        let mut delivered_so_far = 0usize;
        let mut any_answered = false;
        let r = out.entry(port).or_default();
        for (i, delivered) in copies.into_iter().enumerate() {
            if i > 0 {
                r.total += 1;
                if any_answered {
                    r.unnecessary += 1;
                }
            }
            if delivered {
                let got = answered.and_then(|a| a.get(delivered_so_far)).copied();
                any_answered |= got == Some(true);
                delivered_so_far += 1;
            }
        }
    }
    for ((port, _, _), copies) in segments {
        let r = out.entry(port).or_default();
        let mut earlier_delivered = false;
        for (i, delivered) in copies.into_iter().enumerate() {
            if i > 0 {
                r.total += 1;
                if earlier_delivered {
                    r.unnecessary += 1;
                }
            }
            earlier_delivered |= delivered;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const TCP_ACK: u8 = 0x10;

    fn coap(sent: u64, up: bool, delivered: bool, t: u8, mid: u16) -> Pkt {
        Pkt {
            sent,
            up,
            delivered,
            port: 40000,
            coap: Some((t, mid)),
            tcp: None,
        }
    }

    #[test]
    fn a_retransmission_is_unnecessary_when_an_earlier_copy_went_both_ways() {
        let pkts = vec![
            // MID 1: the first copy is delivered and answered (late): both copies after
            // it are unnecessary.
            coap(0, true, true, CON, 1),
            coap(2, true, true, CON, 1),
            coap(3, false, true, ACK, 1),
            coap(4, false, true, ACK, 1),
            coap(6, true, false, CON, 1),
            // MID 2: the first copy dropped, the second answered: necessary.
            coap(10, true, false, CON, 2),
            coap(12, true, true, CON, 2),
            coap(13, false, true, ACK, 2),
            // MID 3: the first copy arrives but its answer is dropped: necessary.
            coap(20, true, true, CON, 3),
            coap(21, false, false, ACK, 3),
            coap(22, true, true, CON, 3),
            coap(23, false, true, ACK, 3),
        ];
        let r = analyse(pkts)[&40000];
        assert_eq!((r.total, r.unnecessary), (4, 2));
    }

    #[test]
    fn tcp_counts_repeated_sequence_numbers_and_handshakes() {
        let seg = |sent, up, delivered, seq, flags, len| Pkt {
            sent,
            up,
            delivered,
            port: 50000,
            coap: None,
            tcp: Some((seq, flags, len)),
        };
        let pkts = vec![
            seg(0, true, false, 1, SYN, 0),
            seg(1, true, true, 1, SYN, 0),
            seg(2, false, true, 9, SYN | TCP_ACK, 0),
            seg(3, true, true, 2, TCP_ACK, 10),
            seg(4, true, true, 2, TCP_ACK, 10), // unnecessary
            seg(5, false, false, 10, TCP_ACK, 20),
            seg(6, false, true, 10, TCP_ACK, 20), // necessary
            seg(7, true, true, 12, TCP_ACK, 0),   // pure ACK: not data
        ];
        let r = analyse(pkts)[&50000];
        assert_eq!((r.total, r.unnecessary, r.handshake), (2, 1, 1));
    }
}
