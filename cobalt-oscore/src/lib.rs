//! OSCORE, Object Security for Constrained RESTful Environments (RFC 8613), for Cobalt.
//!
//! - [`Material`] and [`Keys`]: a security context's input and what HKDF-SHA256 derives
//!   from it; [`SecurityContext`]: the keys with the sender sequence and the replay
//!   window, protecting and verifying CoAP messages (AES-CCM-16-64-128, COSE_Encrypt0
//!   with the AAD of RFC 8613 §5.4, the OSCORE option of §6.1).
//! - [`SenderSequence`]: sequence numbers written ahead to `sequence.json` (aiocoap's
//!   file) so that a restart never reuses a nonce; after a restart the replay window
//!   recovers with an Echo (Appendix B.1.2).

mod cbor;
pub mod classes;
pub mod context;
pub mod credentials;
pub mod layer;
pub mod option;
pub mod replay;
pub mod security;
pub mod sequence;
pub mod target;
mod uploads;

pub use context::{Keys, Material, MaterialError};
pub use credentials::{Credentials, CredentialsError};
pub use layer::{Oscore, Protected, RequireOscore};
pub use option::{OscoreOption, OSCORE};
pub use replay::ReplayWindow;
pub use security::{RequestBinding, RequestError, ResponseError, SecurityContext};
pub use sequence::{SenderSequence, SequenceError};
pub use target::UriPattern;
