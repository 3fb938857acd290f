//! The cases of the study: who runs (workload, clients, congestion control), over
//! which link (buffer, error profile), how (emulated or in virtual time), and which
//! replication.

use cobalt_proto::congestion::Algorithm;
use cobalt_proto::sim::link::{GilbertElliott, LinkConfig, LossModel};
use serde::{Deserialize, Serialize};
use std::fmt;

/// Exchanges each client completes.
pub const EXCHANGES: u32 = 50;
/// Response payload size, bytes.
pub const PAYLOAD: usize = 60;
/// MAX_RETRANSMIT of the clients (the paper's 20).
pub const MAX_RETRANSMIT: u32 = 20;
/// Token length of every request, bytes (over UDP and TCP alike).
pub const TOKEN_LEN: usize = 1;

/// How the case runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Over the emulated link in real time (cobalt-linkem, kernel UDP and TCP).
    Emulated,
    /// In the cobalt-proto simulator (UDP variants only).
    Virtual,
}

/// The paper's two kinds of client.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Workload {
    /// 50 exchanges one after another.
    Continuous,
    /// Short-lived clients of U{1..10} exchanges each (new socket or connection, state
    /// reset) until 50 exchanges are done.
    Random,
}

/// Congestion control: one of Cobalt's UDP algorithms, or CoAP over TCP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Variant {
    /// RFC 7252 over UDP.
    Default,
    /// CoCoA over UDP.
    Cocoa,
    /// CoCoA with strong samples only, over UDP.
    CocoaStrong,
    /// FASOR over UDP.
    Fasor,
    /// FASOR-K (FASOR with Karn's retention) over UDP.
    FasorK,
    /// RFC 6298 with Karn's retention over UDP.
    Karn,
    /// CoAP over TCP (Cobalt's coap+tcp, the kernel's TCP).
    Tcp,
}

impl Variant {
    /// Every variant, in table order.
    pub const ALL: [Variant; 7] = [
        Variant::Default,
        Variant::Cocoa,
        Variant::CocoaStrong,
        Variant::Fasor,
        Variant::FasorK,
        Variant::Karn,
        Variant::Tcp,
    ];

    /// The UDP algorithm, if a UDP variant.
    pub fn algorithm(self) -> Option<Algorithm> {
        match self {
            Variant::Default => Some(Algorithm::Default),
            Variant::Cocoa => Some(Algorithm::Cocoa),
            Variant::CocoaStrong => Some(Algorithm::CocoaStrong),
            Variant::Fasor => Some(Algorithm::Fasor),
            Variant::FasorK => Some(Algorithm::FasorK),
            Variant::Karn => Some(Algorithm::Karn),
            Variant::Tcp => None,
        }
    }

    /// The name in tables and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Variant::Default => "default",
            Variant::Cocoa => "cocoa",
            Variant::CocoaStrong => "cocoa-strong",
            Variant::Fasor => "fasor",
            Variant::FasorK => "fasor-k",
            Variant::Karn => "karn",
            Variant::Tcp => "tcp",
        }
    }

    /// The name as the paper writes it.
    pub fn label(self) -> &'static str {
        match self {
            Variant::Default => "Default CoAP",
            Variant::Cocoa => "CoCoA",
            Variant::CocoaStrong => "CoCoA-strong",
            Variant::Fasor => "FASOR",
            Variant::FasorK => "FASOR-K",
            Variant::Karn => "Karn (RFC 6298)",
            Variant::Tcp => "CoAP over TCP",
        }
    }

    /// Parses [`Variant::name`].
    pub fn parse(s: &str) -> Option<Variant> {
        Variant::ALL.into_iter().find(|v| v.name() == s.trim())
    }
}

/// The link's error profile.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Loss {
    /// Error-free (losses only from the full queue).
    None,
    /// Gilbert–Elliott, ≈ 10 %.
    Medium,
    /// Gilbert–Elliott, ≈ 18 %.
    High,
}

impl Loss {
    /// Every profile.
    pub const ALL: [Loss; 3] = [Loss::None, Loss::Medium, Loss::High];

    /// The link's loss model.
    pub fn model(self) -> LossModel {
        match self {
            Loss::None => LossModel::None,
            Loss::Medium => LossModel::GilbertElliott(GilbertElliott::medium()),
            Loss::High => LossModel::GilbertElliott(GilbertElliott::high()),
        }
    }

    /// Its name.
    pub fn name(self) -> &'static str {
        match self {
            Loss::None => "none",
            Loss::Medium => "medium",
            Loss::High => "high",
        }
    }

    /// Parses [`Loss::name`].
    pub fn parse(s: &str) -> Option<Loss> {
        Loss::ALL.into_iter().find(|l| l.name() == s.trim())
    }
}

/// One run: a configuration and a replication.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Case {
    /// Emulated or virtual.
    pub mode: Mode,
    /// Continuous or random clients.
    pub workload: Workload,
    /// Clients at once.
    pub clients: usize,
    /// Bytes of the drop-tail queue.
    pub buffer: usize,
    /// Error profile.
    pub loss: Loss,
    /// Congestion control.
    pub variant: Variant,
    /// Replication number.
    pub rep: u32,
}

impl Case {
    /// The configuration without the replication (what results are grouped by).
    pub fn group(&self) -> Group {
        Group {
            mode: self.mode,
            workload: self.workload,
            clients: self.clients,
            buffer: self.buffer,
            loss: self.loss,
            variant: self.variant,
        }
    }

    /// A stable key naming this run (for resuming).
    pub fn key(&self) -> String {
        format!("{}#{}", self.group(), self.rep)
    }

    /// The seed of this run: the same for both modes and for every variant (common
    /// random numbers: each variant meets the same loss timeline and jitter draws, so
    /// that differences between variants are theirs, not the dice's).
    pub fn seed(&self, base: u64) -> u64 {
        let mut h = base ^ 0x9e37_79b9_7f4a_7c15;
        for v in [
            self.workload as u64,
            self.clients as u64,
            self.buffer as u64,
            self.loss as u64,
            u64::from(self.rep),
        ] {
            h = (h ^ v).wrapping_mul(0x1000_0000_01b3).rotate_left(29);
        }
        h
    }

    /// The link.
    pub fn link(&self) -> LinkConfig {
        LinkConfig::paper(self.buffer, self.loss.model())
    }
}

/// A case without its replication.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Group {
    /// Emulated or virtual.
    pub mode: Mode,
    /// Continuous or random clients.
    pub workload: Workload,
    /// Clients at once.
    pub clients: usize,
    /// Bytes of the drop-tail queue.
    pub buffer: usize,
    /// Error profile.
    pub loss: Loss,
    /// Congestion control.
    pub variant: Variant,
}

impl fmt::Display for Group {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/{}/{}/{}B/{}/{}",
            match self.mode {
                Mode::Emulated => "emulated",
                Mode::Virtual => "virtual",
            },
            match self.workload {
                Workload::Continuous => "continuous",
                Workload::Random => "random",
            },
            self.clients,
            self.buffer,
            self.loss.name(),
            self.variant.name()
        )
    }
}

/// A set of cases: every combination of its lists, each replicated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Matrix {
    /// Workloads.
    pub workloads: Vec<Workload>,
    /// Client counts.
    pub clients: Vec<usize>,
    /// Buffers.
    pub buffers: Vec<usize>,
    /// Error profiles.
    pub losses: Vec<Loss>,
    /// Variants.
    pub variants: Vec<Variant>,
    /// Replications on the error-free link.
    pub reps: u32,
    /// Replications on the error-prone links.
    pub reps_lossy: u32,
}

impl Matrix {
    /// The cases for `mode` (virtual time runs no TCP).
    pub fn cases(&self, mode: Mode) -> Vec<Case> {
        let mut out = Vec::new();
        for &workload in &self.workloads {
            for &clients in &self.clients {
                for &buffer in &self.buffers {
                    for &loss in &self.losses {
                        for &variant in &self.variants {
                            if mode == Mode::Virtual && variant == Variant::Tcp {
                                continue;
                            }
                            let reps = if loss == Loss::None {
                                self.reps
                            } else {
                                self.reps_lossy
                            };
                            for rep in 0..reps {
                                out.push(Case {
                                    mode,
                                    workload,
                                    clients,
                                    buffer,
                                    loss,
                                    variant,
                                    rep,
                                });
                            }
                        }
                    }
                }
            }
        }
        out
    }
}

/// The named subsets: (name, what it covers, the matrices).
pub fn subset(name: &str) -> Option<Vec<Matrix>> {
    use Workload::{Continuous, Random};
    let all_variants = Variant::ALL.to_vec();
    let both = vec![Continuous, Random];
    let m = |workloads: &[Workload],
             clients: &[usize],
             buffers: &[usize],
             losses: &[Loss],
             reps: u32,
             lossy: u32| Matrix {
        workloads: workloads.to_vec(),
        clients: clients.to_vec(),
        buffers: buffers.to_vec(),
        losses: losses.to_vec(),
        variants: all_variants.clone(),
        reps,
        reps_lossy: lossy,
    };
    let buffers = [2_500, 28_200, 1_410_000];
    Some(match name {
        // Error-free cases of every size and buffer, and the error-prone 10-client ones,
        // with the paper's replications (20 and 40).
        "full" => vec![
            m(
                &both,
                &[1, 50, 100, 200, 400],
                &buffers,
                &[Loss::None],
                20,
                40,
            ),
            m(&both, &[10], &[2_500], &Loss::ALL, 20, 40),
        ],
        "table1" => vec![m(&both, &[1, 50], &[2_500, 1_410_000], &[Loss::None], 3, 3)],
        "fig2" => vec![m(&[Continuous], &[100], &buffers, &[Loss::None], 3, 3)],
        "fig3" => vec![m(&[Continuous], &[200, 400], &buffers, &[Loss::None], 2, 2)],
        "fig5" => vec![m(&[Random], &[200, 400], &buffers, &[Loss::None], 2, 2)],
        "fig6" => vec![m(&both, &[10], &[2_500], &Loss::ALL, 3, 5)],
        // The cases FASOR-K was chosen on (the default until the verdict over every
        // case): heavy congestion on the small buffer, the error-prone link with few
        // clients.
        "beyond" => vec![
            m(&[Continuous], &[200, 400], &[2_500], &[Loss::None], 2, 2),
            m(
                &[Continuous],
                &[10],
                &[2_500],
                &[Loss::Medium, Loss::High],
                3,
                3,
            ),
        ],
        // The emulated cases of bench/congestion/README.md (about 2 h): Table I, the
        // figures' congested cases, the error-prone link, for the variants that tell.
        "measured" => {
            let v = |vs: &[Variant], mut m: Matrix| {
                m.variants = vs.to_vec();
                m
            };
            use Variant::{Cocoa, CocoaStrong, Default, Fasor, FasorK, Karn, Tcp};
            let all = [Default, Cocoa, CocoaStrong, Fasor, FasorK, Karn, Tcp];
            let key = [Default, Cocoa, Fasor, FasorK, Tcp];
            vec![
                v(&all, m(&[Continuous], &[1], &[2_500], &[Loss::None], 2, 2)),
                v(
                    &[Default, FasorK, Tcp],
                    m(&[Random], &[1], &[2_500], &[Loss::None], 1, 1),
                ),
                v(
                    &all,
                    m(&[Continuous], &[50, 100], &[2_500], &[Loss::None], 1, 1),
                ),
                v(
                    &[Default, Cocoa, FasorK, Tcp],
                    m(&[Continuous], &[50], &[1_410_000], &[Loss::None], 1, 1),
                ),
                v(
                    &[Default, Tcp],
                    m(&[Random], &[50], &[2_500, 1_410_000], &[Loss::None], 1, 1),
                ),
                v(
                    &key,
                    m(&[Continuous], &[200, 400], &[2_500], &[Loss::None], 1, 1),
                ),
                v(
                    &key,
                    m(
                        &[Continuous],
                        &[10],
                        &[2_500],
                        &[Loss::Medium, Loss::High],
                        2,
                        2,
                    ),
                ),
                v(
                    &[Default, Cocoa, FasorK, Tcp],
                    m(&[Continuous], &[100], &[1_410_000], &[Loss::None], 1, 1),
                ),
            ]
        }
        // Beyond the paper: workloads FASOR-K was not tuned on (other client counts and
        // buffers, the error-prone link with more clients), for the UDP variants.
        "heldout" => vec![
            m(
                &both,
                &[25, 150, 300],
                &[5_000, 14_100],
                &[Loss::None],
                5,
                5,
            ),
            m(&both, &[25], &[2_500], &[Loss::Medium, Loss::High], 10, 10),
        ],
        // What CI runs: one emulated client, a small virtual study.
        "ci" => vec![m(&[Continuous], &[1], &[2_500], &[Loss::None], 1, 1)],
        "ci-virtual" => vec![
            m(&both, &[1, 10, 50], &[2_500], &[Loss::None], 2, 2),
            m(&[Continuous], &[10], &[2_500], &[Loss::High], 2, 2),
        ],
        _ => return None,
    })
}

/// The names of [`subset`]s.
pub const SUBSETS: [&str; 11] = [
    "full",
    "heldout",
    "measured",
    "table1",
    "fig2",
    "fig3",
    "fig5",
    "fig6",
    "beyond",
    "ci",
    "ci-virtual",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_full_matrix_has_the_papers_cases_and_replications() {
        let full = subset("full").unwrap();
        let emulated: Vec<Case> = full.iter().flat_map(|m| m.cases(Mode::Emulated)).collect();
        // Error-free: 2 workloads × 5 sizes × 3 buffers × 7 variants × 20, plus
        // 10 clients: 2 × 7 × (20 + 40 + 40).
        assert_eq!(emulated.len(), 2 * 5 * 3 * 7 * 20 + 2 * 7 * 100);
        let virt: Vec<Case> = full.iter().flat_map(|m| m.cases(Mode::Virtual)).collect();
        assert!(virt.iter().all(|c| c.variant != Variant::Tcp));
        let keys: std::collections::HashSet<String> = emulated.iter().map(Case::key).collect();
        assert_eq!(keys.len(), emulated.len());
        for name in SUBSETS {
            assert!(subset(name).is_some(), "{name}");
        }
    }

    #[test]
    fn both_modes_draw_the_same_link_for_a_case() {
        let c = Case {
            mode: Mode::Emulated,
            workload: Workload::Continuous,
            clients: 50,
            buffer: 2500,
            loss: Loss::High,
            variant: Variant::Fasor,
            rep: 3,
        };
        let v = Case {
            mode: Mode::Virtual,
            ..c
        };
        assert_eq!(c.seed(1), v.seed(1));
        let tcp = Case {
            variant: Variant::Tcp,
            ..c
        };
        assert_eq!(c.seed(1), tcp.seed(1));
        assert_ne!(c.seed(1), Case { rep: 4, ..c }.seed(1));
        assert_eq!(c.key(), "emulated/continuous/50/2500B/high/fasor#3");
    }
}
