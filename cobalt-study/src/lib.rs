//! The CoAP congestion-control study (UDP against TCP on a constrained link) reproduced
//! and extended: flow completion times of CoAP clients over the paper's constrained link
//! with Default CoAP, CoCoA, CoCoA-strong, FASOR, FASOR-K and Karn over UDP and CoAP
//! over TCP, over the emulated link ([`emu_run`], real time, kernel UDP and the kernel's
//! TCP set as the paper's by [`paper_tcp`]) and in virtual time ([`sim_run`], the
//! `cobalt-proto` simulator, UDP only); the tables of [`report`], the paper's figures
//! redrawn by [`figures`] beside its values ([`paper`]), and the README's findings
//! ([`findings`]), all generated from the stored results ([`results`]).
#![warn(missing_docs)]

pub mod case;
pub mod emu_run;
pub mod estimate;
pub mod figures;
pub mod findings;
pub mod paper;
pub mod paper_tcp;
pub mod report;
pub mod results;
pub mod retx;
pub mod sim_run;
pub mod sockops;
pub mod summary;
pub mod workload;
