//! Records with a DTLS Connection ID (RFC 9146) go to the shard whose session table
//! granted the CID, whatever address they come from: each shard's CIDs carry its
//! index in the byte after the node id ([`CidConfig::for_shard`]), and a classic BPF
//! program on the listener's `SO_REUSEPORT` group picks the socket by that byte. A
//! datagram without a CID (a handshake, a client without one) keeps the kernel's
//! hash of its addresses, as does one whose byte names no socket.
//!
//! [`CidConfig::for_shard`]: super::CidConfig::for_shard

#![cfg_attr(not(target_os = "linux"), allow(dead_code))]

use std::io;
use std::net::UdpSocket;

/// The content type of a record with a CID (RFC 9146 §4).
const TLS12_CID: u32 = 25;
/// Bytes before the CID in such a record: type, version, epoch, sequence number.
const CID_OFFSET: u32 = 11;
/// "No socket": the kernel then hashes the datagram's addresses as without a program.
const BY_HASH: u32 = u32::MAX;

/// The program: for a datagram (its UDP payload) that starts with a CID record long
/// enough to hold the shard byte, that byte; otherwise [`BY_HASH`].
fn program(shard_byte_at: u32) -> [libc::sock_filter; 7] {
    const LD_W_LEN: u16 = (libc::BPF_LD | libc::BPF_W | libc::BPF_LEN) as u16;
    const LD_B_ABS: u16 = (libc::BPF_LD | libc::BPF_B | libc::BPF_ABS) as u16;
    const JGT_K: u16 = (libc::BPF_JMP | libc::BPF_JGT | libc::BPF_K) as u16;
    const JEQ_K: u16 = (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16;
    const RET_A: u16 = (libc::BPF_RET | libc::BPF_A) as u16;
    const RET_K: u16 = (libc::BPF_RET | libc::BPF_K) as u16;
    let op = |code, jt, jf, k| libc::sock_filter { code, jt, jf, k };
    // Jumps count the instructions skipped after the next one.
    [
        // 0-1: too short to hold the shard byte: by hash (a load past the end would
        // end the program with 0, the first socket).
        op(LD_W_LEN, 0, 0, 0),
        op(JGT_K, 0, 4, shard_byte_at),
        // 2-3: not a CID record: by hash.
        op(LD_B_ABS, 0, 0, 0),
        op(JEQ_K, 0, 2, TLS12_CID),
        // 4-5: the shard byte.
        op(LD_B_ABS, 0, 0, shard_byte_at),
        op(RET_A, 0, 0, 0),
        // 6
        op(RET_K, 0, 0, BY_HASH),
    ]
}

/// Steers the CID records that reach `socket`'s `SO_REUSEPORT` group (the sockets of
/// one listener's shards, in the order they were bound) to the socket whose index is
/// the CID's byte after `node_id_len` bytes of node id.
#[cfg(target_os = "linux")]
pub(crate) fn steer_cid_records(socket: &UdpSocket, node_id_len: usize) -> io::Result<()> {
    let at = u32::try_from(node_id_len)
        .ok()
        .and_then(|n| n.checked_add(CID_OFFSET))
        .ok_or_else(|| io::Error::other("the node id is too long"))?;
    let mut filter = program(at);
    let prog = libc::sock_fprog {
        len: filter.len() as u16,
        filter: filter.as_mut_ptr(),
    };
    // SAFETY: SO_ATTACH_REUSEPORT_CBPF takes a sock_fprog, whose program lives through
    // the call (the kernel copies it).
    unsafe {
        crate::transport::udp::set_option(
            socket,
            libc::SOL_SOCKET,
            libc::SO_ATTACH_REUSEPORT_CBPF,
            &prog,
        )
    }
}

/// Elsewhere there is no such program (and the server runs one shard).
#[cfg(not(target_os = "linux"))]
pub(crate) fn steer_cid_records(_socket: &UdpSocket, _node_id_len: usize) -> io::Result<()> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "steering by Connection ID needs Linux (SO_ATTACH_REUSEPORT_CBPF)",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two shard sockets of one port: records with a CID reach the socket their
    /// shard byte names, from whatever source port; others are spread by the hash.
    #[cfg(target_os = "linux")]
    #[test]
    fn the_kernel_hands_a_cid_record_to_the_socket_of_its_shard_byte() {
        use crate::transport::udp::{bind_shard_sockets_sharing, SocketBuffers};
        use std::time::Duration;
        let addr = "127.0.0.1:0".parse().unwrap();
        let buffers = SocketBuffers { recv: 0, send: 0 };
        let shards = bind_shard_sockets_sharing(addr, 2, buffers, false).unwrap();
        steer_cid_records(&shards[0], 2).unwrap();
        let to = shards[0].local_addr().unwrap();
        for s in &shards {
            s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        }
        let received_by = |datagram: &[u8]| -> usize {
            let client = UdpSocket::bind("127.0.0.1:0").unwrap();
            client.send_to(datagram, to).unwrap();
            for s in &shards {
                s.set_nonblocking(true).unwrap();
            }
            let deadline = std::time::Instant::now() + Duration::from_secs(2);
            let mut buf = [0u8; 64];
            loop {
                for (i, s) in shards.iter().enumerate() {
                    if let Ok((n, _)) = s.recv_from(&mut buf) {
                        assert_eq!(&buf[..n], datagram);
                        return i;
                    }
                }
                assert!(std::time::Instant::now() < deadline, "nothing arrived");
                std::thread::sleep(Duration::from_millis(1));
            }
        };
        // Type 25, version, epoch 1, sequence number, then node id c0ba, shard, random.
        let record = |shard: u8| {
            let mut r = vec![25, 0xfe, 0xfd, 0, 1, 0, 0, 0, 0, 0, 7, 0xc0, 0xba, shard];
            r.extend_from_slice(&[9, 9, 9, 0, 20]);
            r
        };
        let mut by_hash = [0usize; 2];
        for _ in 0..16 {
            assert_eq!(received_by(&record(0)), 0);
            assert_eq!(received_by(&record(1)), 1);
            // No such shard, not a CID record, too short: by the hash.
            by_hash[received_by(&record(7))] += 1;
            by_hash[received_by(&[23, 0xfe, 0xfd, 0, 1])] += 1;
            by_hash[received_by(&record(1)[..13])] += 1;
        }
        assert!(by_hash[0] > 0 && by_hash[1] > 0, "{by_hash:?}");
    }
}
