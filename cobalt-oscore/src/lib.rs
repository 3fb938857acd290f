//! OSCORE, Object Security for Constrained RESTful Environments (RFC 8613), for Cobalt.
//!
//! - [`Oscore`]: the layer, for a server ([`Server::layer`](cobalt::Server::layer):
//!   requests protected under the contexts it accepts are unprotected before routing,
//!   their answers and notifications protected) and for a client
//!   ([`Client::layer`](cobalt::Client::layer): requests to matching URIs protected,
//!   answers verified). [`RequireOscore`] makes a resource answer 4.01 to requests
//!   that came unprotected; [`Protected`] tells a handler which context a request
//!   used.
//! - [`Credentials`]: one credentials file for OSCORE contexts, EDHOC credentials,
//!   DTLS PSKs and certificates, in aiocoap's JSON format (`cobalt get|serve
//!   --credentials`).
//! - [`edhoc`]: EDHOC (RFC 9528, with `lakers`) to derive OSCORE contexts from
//!   P-256 credentials: [`EdhocResponder`] in a server's layer
//!   ([`Oscore::edhoc`]), [`edhoc::establish`] for a client, also with the EDHOC +
//!   OSCORE combined request (RFC 9668).
//! - [`Material`] and [`Keys`]: a security context's input and what HKDF-SHA256 derives
//!   from it; [`SecurityContext`]: the keys with the sender sequence and the replay
//!   window, protecting and verifying CoAP messages (AES-CCM-16-64-128, COSE_Encrypt0
//!   with the AAD of RFC 8613 §5.4, the OSCORE option of §6.1, errors as §8 says).
//! - [`SenderSequence`]: sequence numbers written ahead to `sequence.json` (aiocoap's
//!   file) so that a restart never reuses a nonce; after a restart the replay window
//!   recovers with an Echo (Appendix B.1.2).
//!
//! ```no_run
//! use cobalt_oscore::{Material, Oscore, SecurityContext, UriPattern};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! // The client's side of a context shared with the server (IDs swapped there).
//! let material = Material::new(b"0123456789abcdef", b"C", b"S");
//! let oscore = Oscore::new().protect(
//!     UriPattern::parse("coap://sensor.example/*")?,
//!     SecurityContext::new(material)?,
//! );
//! let client = cobalt::Client::new().layer(oscore);
//! let answer = client.get("coap://sensor.example/temp").await?;
//! println!("{}", answer.text_payload());
//! # Ok(())
//! # }
//! ```

mod cbor;
pub mod classes;
pub mod context;
pub mod credentials;
pub mod edhoc;
pub mod layer;
pub mod option;
pub mod replay;
pub mod security;
pub mod sequence;
pub mod target;
mod uploads;

pub use context::{Keys, Material, MaterialError};
pub use credentials::{Credentials, CredentialsError};
pub use edhoc::{Ccs, CredentialStyle, EdhocIdentity, EdhocResponder};
pub use layer::{Oscore, Protected, RequireOscore};
pub use option::{OscoreOption, EDHOC, OSCORE};
pub use replay::ReplayWindow;
pub use security::{RequestBinding, RequestError, ResponseError, SecurityContext};
pub use sequence::{SenderSequence, SequenceError};
pub use target::UriPattern;
