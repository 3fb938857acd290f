//! Flow completion times and retransmissions per case, pooled over its replications:
//! what the report, the figures and the README's findings are made of.

use crate::case::Group;
use crate::results::RunResult;
use serde::Serialize;
use std::collections::BTreeMap;

/// The percentiles reported: 10th, 25th, 50th, 75th, 90th.
pub const QUANTILES: [f64; 5] = [0.10, 0.25, 0.50, 0.75, 0.90];

/// Percentiles of `values` by linear interpolation between order statistics.
pub fn percentiles(values: &[f64]) -> Option<[f64; 5]> {
    if values.is_empty() {
        return None;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    Some(QUANTILES.map(|q| {
        let pos = q * (v.len() - 1) as f64;
        let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
        v[lo] + (v[hi] - v[lo]) * (pos - lo as f64)
    }))
}

/// One case summarised over its replications.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Summary {
    /// The case.
    pub group: Group,
    /// Replications.
    pub runs: usize,
    /// Clients that finished, over all replications.
    pub finished: usize,
    /// Clients that did not finish in time.
    pub unfinished: usize,
    /// FCT percentiles, seconds (p10, p25, median, p75, p90).
    pub fct: Option<[f64; 5]>,
    /// Mean retransmissions per client (per connection for TCP random clients).
    pub retransmissions: f64,
    /// Mean unnecessary retransmissions per client.
    pub unnecessary: f64,
    /// Mean TCP SYN/SYN-ACK retransmissions per connection.
    pub handshake: f64,
    /// Exchanges repeated after a timeout, over all replications.
    pub failures: u64,
    /// Queue drops on the downlink per replication.
    pub drops_queue_down: f64,
    /// Wall-clock seconds of all replications together.
    pub wall_s: f64,
}

fn mean(v: impl Iterator<Item = u64>) -> f64 {
    let (n, s) = v.fold((0u64, 0u64), |(n, s), x| (n + 1, s + x));
    if n == 0 {
        0.0
    } else {
        s as f64 / n as f64
    }
}

/// Summarises results by case.
pub fn summarise(results: &[RunResult]) -> Vec<Summary> {
    let mut groups: BTreeMap<Group, Vec<&RunResult>> = BTreeMap::new();
    for r in results {
        groups.entry(r.case.group()).or_default().push(r);
    }
    groups
        .into_iter()
        .map(|(group, runs)| {
            let fct: Vec<f64> = runs.iter().flat_map(|r| r.fct.iter().copied()).collect();
            Summary {
                group,
                runs: runs.len(),
                finished: fct.len(),
                unfinished: runs.iter().map(|r| r.unfinished).sum(),
                fct: percentiles(&fct),
                retransmissions: mean(runs.iter().flat_map(|r| r.retransmissions.iter().copied())),
                unnecessary: mean(runs.iter().flat_map(|r| r.unnecessary.iter().copied())),
                handshake: mean(
                    runs.iter()
                        .flat_map(|r| r.handshake_retransmissions.iter().copied()),
                ),
                failures: runs.iter().map(|r| r.failures).sum(),
                drops_queue_down: mean(runs.iter().map(|r| r.down.drops_queue)),
                wall_s: runs.iter().map(|r| r.wall_s).sum(),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_interpolate_between_order_statistics() {
        let v: Vec<f64> = (1..=11).map(f64::from).collect();
        assert_eq!(percentiles(&v).unwrap(), [2.0, 3.5, 6.0, 8.5, 10.0]);
        assert_eq!(percentiles(&[4.0]).unwrap(), [4.0; 5]);
        assert!(percentiles(&[]).is_none());
    }
}
