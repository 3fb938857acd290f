//! Fixtures shared by Cobalt's integration tests: a throwaway PKI as credentials
//! (the library's unit tests' `TestCredentials`, included from its source).
#![cfg(feature = "openssl")]
#![allow(dead_code)] // each test crate uses a part

use cobalt::transport::credentials::X509Credentials;

#[path = "../../src/transport/credentials/test_credentials.rs"]
mod test_credentials;

pub use test_credentials::TestCredentials;
