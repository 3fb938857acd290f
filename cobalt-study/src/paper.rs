//! The paper's numbers (`shared/papers/002_…`), each with where it comes from: Table I
//! states percentiles; the text states a few medians of Figs. 2–3 outright, gives
//! others only as differences and percentages (the medians here are back-calculated
//! from those, and marked [`Source::Derived`]), and gives Figs. 5–6 only as ratios.

use crate::case::{Loss, Variant, Workload};
use serde::Serialize;

/// Where a paper value comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    /// Printed in the paper as it is used here.
    Stated,
    /// Back-calculated from a difference and a percentage the paper prints.
    Derived,
}

/// The "infinite" buffer of the paper, bytes.
pub const INFINITE: usize = 1_410_000;

/// The paper's Table I: (workload, clients, buffer, variant) → p10, p25, median, p75,
/// p90 in seconds, 20 replications, error-free link. Every value is stated.
pub const TABLE_I: [(Workload, usize, usize, Variant, [f64; 5]); 12] = {
    use Variant::{Cocoa, Default, Tcp};
    use Workload::{Continuous as C, Random as R};
    [
        (
            C,
            1,
            2500,
            Default,
            [33.003, 33.003, 33.003, 33.003, 33.003],
        ),
        (C, 1, 2500, Cocoa, [33.002, 33.002, 33.003, 33.003, 33.003]),
        (C, 1, 2500, Tcp, [33.208, 33.208, 33.208, 33.208, 33.208]),
        (R, 1, 2500, Tcp, [43.432, 45.099, 47.093, 47.746, 47.928]),
        (
            C,
            50,
            2500,
            Default,
            [61.250, 61.500, 62.001, 63.342, 63.767],
        ),
        (C, 50, 2500, Cocoa, [61.275, 61.525, 62.001, 63.347, 63.767]),
        (C, 50, 2500, Tcp, [62.102, 63.257, 65.032, 67.760, 72.684]),
        (R, 50, 2500, Tcp, [83.196, 86.248, 88.433, 90.463, 93.199]),
        (
            C,
            50,
            INFINITE,
            Default,
            [62.177, 62.377, 62.690, 63.003, 63.178],
        ),
        (
            C,
            50,
            INFINITE,
            Cocoa,
            [62.177, 62.377, 62.690, 63.003, 63.179],
        ),
        (
            C,
            50,
            INFINITE,
            Tcp,
            [69.382, 69.570, 69.868, 70.184, 70.383],
        ),
        (
            R,
            50,
            INFINITE,
            Tcp,
            [85.789, 87.233, 90.086, 90.846, 91.259],
        ),
    ]
};

/// A median flow completion time the paper gives for one of its figures'
/// cases (error-free link, continuous clients).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Median {
    /// Simultaneous clients.
    pub clients: usize,
    /// Router buffer, bytes.
    pub buffer: usize,
    /// The variant.
    pub variant: Variant,
    /// Seconds.
    pub median: f64,
    /// Stated or back-calculated.
    pub source: Source,
    /// The paper's words it comes from.
    pub from: &'static str,
}

const FIG2_TEXT: &str = "§V-A2: \"around 101.6 seconds for Default CoAP and around 104.7 seconds for CoCoA while TCP over CoAP yields a shorter median FCT being around 86.7 seconds\"";
const FIG3_200: &str = "§V-A4: TCP \"about 16.6 seconds (approx. 9%) shorter\" than Default CoAP and \"about 27.2 seconds (approx 13.7%) shorter\" than CoCoA: CoCoA = 27.2/0.137 (the percentage with three digits), TCP = CoCoA − 27.2, Default = TCP + 16.6 (then 16.6/Default = 8.8 %, \"approx. 9%\")";
const FIG3_400: &str = "§V-A4: TCP \"about 70.1 seconds (approx. 18%) shorter\" than Default CoAP and \"about 88.8 seconds (approx. 21.8%) shorter\" than CoCoA: CoCoA = 88.8/0.218, TCP = CoCoA − 88.8, Default = TCP + 70.1 (then 70.1/Default = 18.0 %)";

/// The medians of Figs. 2a and 3 (2,500 B buffer): stated at 100 clients, derived at
/// 200 and 400 from the differences (seconds, three digits) and CoCoA's percentage (three
/// digits); Default CoAP's percentage has one or two digits and only checks the result.
pub const MEDIANS: [Median; 9] = {
    use Source::{Derived, Stated};
    use Variant::{Cocoa, Default, Tcp};
    const fn m(
        clients: usize,
        variant: Variant,
        median: f64,
        source: Source,
        from: &'static str,
    ) -> Median {
        Median {
            clients,
            buffer: 2500,
            variant,
            median,
            source,
            from,
        }
    }
    [
        m(100, Default, 101.6, Stated, FIG2_TEXT),
        m(100, Cocoa, 104.7, Stated, FIG2_TEXT),
        m(100, Tcp, 86.7, Stated, FIG2_TEXT),
        m(200, Default, 187.9, Derived, FIG3_200),
        m(200, Cocoa, 198.5, Derived, FIG3_200),
        m(200, Tcp, 171.3, Derived, FIG3_200),
        m(400, Default, 388.6, Derived, FIG3_400),
        m(400, Cocoa, 407.3, Derived, FIG3_400),
        m(400, Tcp, 318.5, Derived, FIG3_400),
    ]
};

/// A ratio of two medians the paper states (Figs. 5 and 6 have no stated values).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Ratio {
    /// The workload.
    pub workload: Workload,
    /// Simultaneous clients.
    pub clients: usize,
    /// Router buffer, bytes.
    pub buffer: usize,
    /// The link's error profile.
    pub loss: Loss,
    /// The variant whose median is compared...
    pub variant: Variant,
    /// ...with this one's.
    pub over: Variant,
    /// median(variant) / median(over).
    pub ratio: f64,
    /// The paper's words.
    pub from: &'static str,
}

/// The ratios the paper states for Figs. 5b and 6 (Fig. 6 on the 2,500 B buffer, the
/// paper's error-prone runs do not say otherwise).
pub const RATIOS: [Ratio; 8] = {
    use Variant::{Cocoa, Default, Tcp};
    use Workload::{Continuous as C, Random as R};
    const fn r(
        workload: Workload,
        clients: usize,
        buffer: usize,
        loss: Loss,
        variant: Variant,
        ratio: f64,
        from: &'static str,
    ) -> Ratio {
        Ratio {
            workload,
            clients,
            buffer,
            loss,
            variant,
            over: Tcp,
            ratio,
            from,
        }
    }
    [
        r(R, 400, INFINITE, Loss::None, Default, 2.0, "Fig. 5b: Default CoAP takes \"roughly twice as long\" as CoAP over TCP"),
        r(R, 400, INFINITE, Loss::None, Cocoa, 2.34, "Fig. 5b: CoCoA takes \"approx. 134% longer\" than CoAP over TCP"),
        r(C, 10, 2500, Loss::Medium, Cocoa, 1.124, "Fig. 6: medium errors, CoCoA 12.4% longer than CoAP over TCP"),
        r(C, 10, 2500, Loss::Medium, Default, 1.384, "Fig. 6: medium errors, Default CoAP 38.4% longer than CoAP over TCP"),
        r(C, 10, 2500, Loss::High, Cocoa, 1.129, "Fig. 6: high errors, CoCoA 12.9% longer than CoAP over TCP"),
        r(C, 10, 2500, Loss::High, Default, 1.350, "Fig. 6: high errors, Default CoAP 35.0% longer than CoAP over TCP"),
        Ratio {
            workload: R,
            clients: 10,
            buffer: 2500,
            loss: Loss::None,
            variant: Tcp,
            over: Cocoa,
            ratio: 1.433,
            from: "Fig. 6: error-free, random clients, CoAP over TCP 43.3% longer than the other algorithms",
        },
        Ratio {
            workload: R,
            clients: 10,
            buffer: 2500,
            loss: Loss::High,
            variant: Tcp,
            over: Cocoa,
            ratio: 1.368,
            from: "Fig. 6: high errors, random clients, CoAP over TCP 36.8% longer than CoCoA",
        },
    ]
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_medians_reproduce_the_differences_the_paper_states() {
        let get = |n, v| {
            MEDIANS
                .iter()
                .find(|m| m.clients == n && m.variant == v)
                .unwrap()
                .median
        };
        for (n, d_tcp, d_pct, c_tcp, c_pct) in [
            (200, 16.6, 0.09, 27.2, 0.137),
            (400, 70.1, 0.18, 88.8, 0.218),
        ] {
            let (d, c, t) = (
                get(n, Variant::Default),
                get(n, Variant::Cocoa),
                get(n, Variant::Tcp),
            );
            assert!((d - t - d_tcp).abs() < 0.06, "{n}: {d} - {t}");
            assert!((c - t - c_tcp).abs() < 0.06, "{n}: {c} - {t}");
            assert!(
                ((d - t) / d - d_pct).abs() < 0.005,
                "{n}: Default's percentage"
            );
            assert!(
                ((c - t) / c - c_pct).abs() < 0.0005,
                "{n}: CoCoA's percentage"
            );
        }
        assert!(MEDIANS
            .iter()
            .all(|m| (m.clients == 100) == (m.source == Source::Stated)));
    }
}
