//! A blocking client for scripts and tests: the async [`Client`](super::Client) driven
//! by a private runtime.
//!
//! ```no_run
//! let client = cobalt::client::blocking::Client::new()?;
//! let response = client.get("coap://127.0.0.1/hello")?;
//! println!("{}", response.text_payload());
//! # Ok::<(), cobalt::Error>(())
//! ```

use crate::server::Response;
use crate::Result;
use cobalt_proto::endpoint::EndpointConfig;
use cobalt_proto::message::Code;
use std::time::Duration;

/// A blocking CoAP client. Do not use it from inside an async runtime.
#[derive(Debug)]
pub struct Client {
    inner: super::Client,
    rt: tokio::runtime::Runtime,
}

impl Client {
    /// A client with the default parameters.
    pub fn new() -> Result<Client> {
        Client::with_config(EndpointConfig::default())
    }

    /// A client with custom protocol parameters.
    pub fn with_config(config: EndpointConfig) -> Result<Client> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        Ok(Client {
            inner: super::Client::with_config(config)?,
            rt,
        })
    }

    /// GET `uri`.
    pub fn get(&self, uri: &str) -> Result<Response> {
        self.rt.block_on(self.inner.get(uri))
    }

    /// POST `payload` to `uri`.
    pub fn post(&self, uri: &str, payload: impl Into<Vec<u8>>) -> Result<Response> {
        self.rt.block_on(self.inner.post(uri, payload))
    }

    /// PUT `payload` to `uri`.
    pub fn put(&self, uri: &str, payload: impl Into<Vec<u8>>) -> Result<Response> {
        self.rt.block_on(self.inner.put(uri, payload))
    }

    /// DELETE `uri`.
    pub fn delete(&self, uri: &str) -> Result<Response> {
        self.rt.block_on(self.inner.delete(uri))
    }

    /// Any method, with an overall timeout.
    pub fn request(
        &self,
        method: Code,
        uri: &str,
        payload: Vec<u8>,
        timeout: Duration,
    ) -> Result<Response> {
        self.rt.block_on(
            self.inner
                .request(method, uri)
                .payload(payload)
                .timeout(timeout)
                .send(),
        )
    }
}
