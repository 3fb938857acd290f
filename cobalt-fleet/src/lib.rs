//! Simulated CoAP device fleets and a mashup that observes them: the services of
//! `cobalt devices` and of the mashup example.
//!
//! - [`device::Device`]: one simulated device, sans-IO (an explicit `now`, datagrams
//!   in and out), with observable sensors ([`sensor`]) in one of two
//!   [`content::Profile`]s — RFC 9176 sensors or LwM2M 1.1 objects — and its
//!   registration at a directory ([`registration`]), renewed before the lifetime
//!   ends and removed at shutdown.
//! - [`fleet::Fleet`]: many devices on one tokio runtime, a UDP socket each
//!   (optionally spread over a source network, optionally DTLS with a PSK), one small
//!   task each; [`stats`] counts what they did.
//! - [`mashup`]: finds devices by a directory lookup, observes each (a bounded
//!   number), and keeps an aggregate (count, mean, max) that it serves as an
//!   observable resource.
//!
//! ```no_run
//! use cobalt_fleet::content::Profile;
//! use cobalt_fleet::device::DeviceSettings;
//! use cobalt_fleet::fleet::{Fleet, FleetConfig};
//! use cobalt_fleet::registration::DirectoryTarget;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let mut settings = DeviceSettings::new(Profile::Rd);
//! settings.directory = Some(DirectoryTarget {
//!     profile: Profile::Rd,
//!     server: "127.0.0.1:5683".parse()?,
//!     path: Vec::new(), // found by discovery
//! });
//! let fleet = Fleet::start(FleetConfig::new(100, settings)).await?;
//! tokio::time::sleep(std::time::Duration::from_secs(10)).await;
//! println!("{}", fleet.shutdown().await); // registered 100 (now 0), ...
//! # Ok(()) }
//! ```

pub mod content;
pub mod device;
pub mod fleet;
pub mod mashup;
pub mod registration;
pub mod sensor;
pub mod stats;
