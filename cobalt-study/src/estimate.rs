//! How long emulated cases take in real time, estimated before they run: each as long
//! as the virtual run of the same case and seed (the link's timeline is the same), or,
//! for CoAP over TCP (no virtual model), as the slowest UDP variant of its case and
//! replication; plus the set-up of namespaces, server and clients.

use crate::case::{Case, Loss, Variant, Workload};
use crate::results::RunResult;
use std::collections::HashMap;
use std::time::Duration;

/// Set-up and tear-down of one emulated run, seconds (measured: a 33 s case takes
/// about 35 s of wall-clock time).
const SETUP_S: f64 = 2.0;

/// The estimated wall-clock time of the emulated cases `todo`, from `virtual_runs`
/// (cases without any virtual counterpart count their set-up only).
pub fn emulated_wall_time(todo: &[Case], virtual_runs: &[RunResult]) -> Duration {
    type Key = (Workload, usize, usize, Loss, u32);
    let mut span: HashMap<(Key, Variant), f64> = HashMap::new();
    let mut slowest: HashMap<Key, f64> = HashMap::new();
    for r in virtual_runs {
        let c = r.case;
        let key = (c.workload, c.clients, c.buffer, c.loss, c.rep);
        span.insert((key, c.variant), r.span_s);
        let s = slowest.entry(key).or_insert(0.0);
        *s = s.max(r.span_s);
    }
    let seconds: f64 = todo
        .iter()
        .map(|c| {
            let key = (c.workload, c.clients, c.buffer, c.loss, c.rep);
            span.get(&(key, c.variant))
                .or_else(|| slowest.get(&key))
                .copied()
                .unwrap_or(0.0)
                + SETUP_S
        })
        .sum();
    Duration::from_secs_f64(seconds)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::case::Mode;
    use crate::results::LinkCounters;

    fn run(variant: Variant, span_s: f64) -> RunResult {
        let case = Case {
            mode: Mode::Virtual,
            workload: Workload::Continuous,
            clients: 10,
            buffer: 2500,
            loss: Loss::None,
            variant,
            rep: 0,
        };
        RunResult {
            case,
            key: case.key(),
            seed: 1,
            fct: Vec::new(),
            unfinished: 0,
            retransmissions: Vec::new(),
            unnecessary: Vec::new(),
            handshake_retransmissions: Vec::new(),
            failures: 0,
            up: LinkCounters::default(),
            down: LinkCounters::default(),
            wall_s: 0.1,
            span_s,
        }
    }

    #[test]
    fn a_case_takes_its_virtual_span_and_tcp_the_slowest_udp_variants() {
        let virtual_runs = [run(Variant::Default, 40.0), run(Variant::Cocoa, 50.0)];
        let emulated = |variant| Case {
            mode: Mode::Emulated,
            variant,
            ..virtual_runs[0].case
        };
        let t = emulated_wall_time(&[emulated(Variant::Default)], &virtual_runs);
        assert_eq!(t, Duration::from_secs(42));
        let t = emulated_wall_time(
            &[emulated(Variant::Tcp), emulated(Variant::Cocoa)],
            &virtual_runs,
        );
        assert_eq!(t, Duration::from_secs(104));
        let other = Case {
            clients: 20,
            ..emulated(Variant::Default)
        };
        assert_eq!(
            emulated_wall_time(&[other], &virtual_runs),
            Duration::from_secs(2)
        );
    }
}
