//! Server configuration: one TOML file, environment variables and command-line overrides.
//!
//! Every setting has a built-in default, so no file is needed. Sources are applied in
//! this order, each overriding the ones before:
//!
//! 1. built-in defaults ([`Config::default`], printed by [`Config::default_toml`]);
//! 2. the TOML file ([`ConfigLoader::file`]);
//! 3. environment variables `COBALT_<SECTION>_<KEY>`, e.g. `COBALT_ENDPOINT_ACK_TIMEOUT=3s`
//!    ([`ConfigLoader::env`]);
//! 4. command-line overrides `section.key=value` ([`ConfigLoader::set`]).
//!
//! Unknown keys are refused naming the key, and so are values outside their range
//! (naming the key and the allowed range), before anything starts.
//!
//! Durations are strings with a unit — `"1500ms"`, `"2s"`, `"5m"`, `"24h"`, combinations
//! such as `"1m30s"` — or a plain number of seconds (`2`, `0.5`).
//!
//! ```
//! use cobalt::config::Config;
//!
//! let config = Config::loader()
//!     .toml("[endpoint]\nack_timeout = \"3s\"\n", "example.toml")?
//!     .set("server.port", "5684", "--set")?
//!     .build()?;
//! assert_eq!(config.endpoint.ack_timeout, std::time::Duration::from_secs(3));
//! assert_eq!(config.server.port, 5684);
//! # Ok::<(), cobalt::config::ConfigError>(())
//! ```

use crate::server::{ServerLimits, ServerSettings};
use crate::transport::dtls::DtlsConfig;
use crate::transport::limits::TcpServerLimits;
use crate::transport::udp::SocketBuffers;
use cobalt_proto::endpoint::EndpointConfig;
pub use cobalt_proto::settings::Settings;
pub use cobalt_proto::settings::{format_duration, parse_duration};
use cobalt_proto::settings::{ConfigError as RangeError, Param};
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::path::Path;

/// The whole configuration of a server. `Default` gives the built-in defaults.
///
/// Each section is the settings type the server runs with, read and written by its own
/// serde and checked by its own `params` (the keys, what they do, the values allowed).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Protocol parameters (RFC 7252 §4.8) and state bounds of the endpoint.
    pub endpoint: EndpointConfig,
    /// Server-role limits: observers, uploads, block size.
    pub limits: ServerLimits,
    /// Shards, receive batching and socket buffers.
    pub runtime: RuntimeSection,
    /// Where to listen.
    pub server: ServerSection,
    /// CoAP over TCP, TLS and WebSockets: connection limits and timers.
    pub connections: TcpServerLimits,
    /// CoAP over DTLS: session and handshake budgets, timers (per DTLS shard).
    pub dtls: DtlsConfig,
    /// Logging.
    pub log: LogSection,
}

/// Default datagrams read per wake-up of a shard (4 `recvmmsg` batches of 64).
pub const DEFAULT_RECV_BATCH: usize = 256;
/// Default socket buffer size asked of the kernel (4 MiB; the kernel may cap it).
pub const DEFAULT_SOCKET_BUFFER: usize = 4 << 20;

/// `[runtime]`: threads and sockets.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RuntimeSection {
    /// Shards (threads with their own `SO_REUSEPORT` socket); 0: one per core.
    pub shards: usize,
    /// Datagrams read per wake-up before timers and commands get a turn (rounded up
    /// to whole `recvmmsg` batches of 64).
    pub recv_batch: usize,
    /// `SO_RCVBUF` asked for each shard socket (bytes); 0 keeps the kernel default.
    pub socket_recv_buffer: usize,
    /// `SO_SNDBUF` asked for each shard socket (bytes); 0 keeps the kernel default.
    pub socket_send_buffer: usize,
}

impl Default for RuntimeSection {
    fn default() -> Self {
        RuntimeSection {
            shards: 0,
            recv_batch: DEFAULT_RECV_BATCH,
            socket_recv_buffer: DEFAULT_SOCKET_BUFFER,
            socket_send_buffer: DEFAULT_SOCKET_BUFFER,
        }
    }
}

/// `[server]`: addresses.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerSection {
    /// IP address to listen on (`::` serves IPv4 and IPv6).
    pub bind: IpAddr,
    /// UDP port (0: any free port).
    pub port: u16,
    /// Address of the Prometheus metrics HTTP endpoint (`GET /metrics`); `None`
    /// (`""` in the file) serves none.
    #[serde(with = "optional_addr")]
    pub metrics_addr: Option<SocketAddr>,
}

impl Default for ServerSection {
    fn default() -> Self {
        ServerSection {
            bind: IpAddr::V6(Ipv6Addr::UNSPECIFIED),
            port: 5683,
            metrics_addr: None,
        }
    }
}

impl ServerSection {
    /// The UDP address to bind: `bind` and `port`.
    pub fn socket_addr(&self) -> SocketAddr {
        SocketAddr::new(self.bind, self.port)
    }
}

impl Settings for ServerSection {
    /// Every parameter with what it does and the values allowed, in file order.
    fn params(&self) -> Vec<Param> {
        vec![
            Param::new("bind", "IP address to listen on; \"::\" serves IPv4 and IPv6.", "an IPv4 or IPv6 address", true),
            Param::new("port", "UDP port; 0: any free port.", "0 to 65535", true),
            Param::new("metrics_addr", "Address of the Prometheus endpoint (GET /metrics over HTTP), e.g. \"127.0.0.1:9100\"; \"\": none.", "\"\" or IP:port", true),
        ]
    }
}

impl Settings for RuntimeSection {
    /// Every parameter with what it does and the values allowed, in file order.
    fn params(&self) -> Vec<Param> {
        vec![
            Param::new("shards", "Shards: threads with their own SO_REUSEPORT socket; 0: one per core.", "0 to 1024", self.shards <= 1024),
            Param::new("recv_batch", "Datagrams read per wake-up of a shard before timers and commands get a turn (rounded up to whole recvmmsg batches of 64).", "1 to 4096", (1..=4096).contains(&self.recv_batch)),
            Param::new("socket_recv_buffer", "SO_RCVBUF asked for each shard socket, in bytes (the kernel may cap it); 0: kernel default.", "0 to 1073741824", self.socket_recv_buffer <= 1 << 30),
            Param::new("socket_send_buffer", "SO_SNDBUF asked for each shard socket, in bytes (the kernel may cap it); 0: kernel default.", "0 to 1073741824", self.socket_send_buffer <= 1 << 30),
        ]
    }
}

/// The log levels accepted by `log.level`.
pub const LOG_LEVELS: [&str; 6] = ["off", "error", "warn", "info", "debug", "trace"];

/// `[log]`: logging.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogSection {
    /// Most verbose level logged to stderr (one of [`LOG_LEVELS`]); `RUST_LOG` wins.
    pub level: String,
}

impl Settings for LogSection {
    /// Every parameter with what it does and the values allowed.
    fn params(&self) -> Vec<Param> {
        vec![Param::new(
            "level",
            "Most verbose level logged to stderr; the RUST_LOG variable, when set, wins.",
            "off, error, warn, info, debug, trace",
            LOG_LEVELS.contains(&self.level.as_str()),
        )]
    }
}

impl Default for LogSection {
    fn default() -> Self {
        LogSection {
            level: "info".into(),
        }
    }
}

/// Why a configuration was refused. Every variant names the key or the source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigError {
    /// The file could not be read.
    Read {
        /// The file.
        path: String,
        /// The operating system's reason.
        reason: String,
    },
    /// Malformed TOML, an unknown key or a value of the wrong type in a file.
    Parse {
        /// Where the text came from (the file name).
        origin: String,
        /// The parser's message (it names the key, with line and column).
        message: String,
    },
    /// An override names a key that does not exist.
    UnknownKey {
        /// The key as `section.key`.
        key: String,
        /// The environment variable or command-line flag it came from.
        origin: String,
    },
    /// An override's value cannot be read as the key's type.
    BadValue {
        /// The key as `section.key`.
        key: String,
        /// The environment variable or command-line flag it came from.
        origin: String,
        /// What is wrong.
        message: String,
    },
    /// A value outside its allowed range.
    OutOfRange {
        /// The key as `section.key`.
        key: String,
        /// The value given.
        value: String,
        /// The allowed range.
        allowed: String,
    },
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConfigError::Read { path, reason } => {
                write!(f, "cannot read configuration file {path}: {reason}")
            }
            ConfigError::Parse { origin, message } => {
                write!(f, "invalid configuration in {origin}: {}", message.trim_end())
            }
            ConfigError::UnknownKey { key, origin } => write!(
                f,
                "unknown configuration key `{key}` (from {origin}); `cobalt serve --print-config` lists them all"
            ),
            ConfigError::BadValue {
                key,
                origin,
                message,
            } => write!(f, "invalid value for `{key}` (from {origin}): {message}"),
            ConfigError::OutOfRange {
                key,
                value,
                allowed,
            } => write!(f, "invalid value for `{key}`: {value}; allowed {allowed}"),
        }
    }
}

impl std::error::Error for ConfigError {}

impl Config {
    /// The settings a server runs with, as this configuration gives them (everything
    /// but `[server]`, the addresses, and `[log]`):
    /// `Server::new().with_config(&config.server_settings())`.
    pub fn server_settings(&self) -> ServerSettings {
        ServerSettings {
            endpoint: self.endpoint.clone(),
            limits: self.limits.clone(),
            shards: (self.runtime.shards > 0).then_some(self.runtime.shards),
            recv_batch: Some(self.runtime.recv_batch.max(1)),
            socket_buffers: SocketBuffers {
                recv: self.runtime.socket_recv_buffer,
                send: self.runtime.socket_send_buffer,
            },
            connections: self.connections.clone(),
            dtls: self.dtls.clone(),
        }
    }

    /// A loader starting from the built-in defaults.
    pub fn loader() -> ConfigLoader {
        ConfigLoader::default()
    }

    /// Defaults, then the file (if any), then the process's `COBALT_<SECTION>_<KEY>`
    /// environment variables; validated.
    pub fn load(file: Option<&Path>) -> Result<Config, ConfigError> {
        let mut loader = Config::loader();
        if let Some(path) = file {
            loader = loader.file(path)?;
        }
        loader.env_from_process()?.build()
    }

    /// Parses one TOML document over the defaults, and validates it.
    pub fn from_toml(text: &str) -> Result<Config, ConfigError> {
        Config::loader().toml(text, "TOML text")?.build()
    }

    /// Every section in file order: its name, what it is for, and its parameters.
    fn sections(&self) -> [(&'static str, &'static str, Vec<Param>); 7] {
        [
            ("endpoint", "Protocol parameters of RFC 7252 §4.8 and bounds on the endpoint's state.", self.endpoint.params()),
            ("limits", "Server-role limits: observers, uploads, block size.", self.limits.params()),
            ("runtime", "Threads and sockets.", self.runtime.params()),
            ("server", "Where to listen.", self.server.params()),
            ("connections", "CoAP over TCP, TLS and WebSockets (each listener): connection limits and timers.", self.connections.params()),
            ("dtls", "CoAP over DTLS (each shard's session table): session and handshake budgets, timers.", self.dtls.params()),
            ("log", "Logging to stderr.", self.log.params()),
        ]
    }

    /// Checks every value; the error names the key, the value and the allowed range.
    pub fn validate(&self) -> Result<(), ConfigError> {
        for (section, _, params) in self.sections() {
            if let Err(RangeError { key, allowed }) = cobalt_proto::settings::check(&params) {
                let value = self
                    .to_table()
                    .get(section)
                    .and_then(|s| s.get(key))
                    .map_or_else(String::new, toml::Value::to_string);
                return Err(ConfigError::OutOfRange {
                    key: format!("{section}.{key}"),
                    value,
                    allowed: allowed.to_string(),
                });
            }
        }
        Ok(())
    }

    fn to_table(&self) -> toml::Table {
        toml::Table::try_from(self).expect("the configuration serializes to TOML")
    }

    /// The configuration as a TOML file: every key with a comment saying what it
    /// does, its default and its allowed values. Parses back to `self`.
    pub fn to_toml(&self) -> String {
        let table = self.to_table();
        let defaults = Config::default().to_table();
        let mut out = String::new();
        out.push_str(
            "# Cobalt server configuration (cobalt serve --config FILE).\n\
             #\n\
             # Every key is optional; a missing key keeps its default. Precedence, lowest first:\n\
             # built-in defaults < this file < environment variables COBALT_<SECTION>_<KEY>\n\
             # (e.g. COBALT_ENDPOINT_ACK_TIMEOUT=3s) < command-line flags (--set section.key=value,\n\
             # --bind, --port, --shards, --metrics, --log-level).\n\
             #\n\
             # Durations: a string with units (\"1500ms\", \"2s\", \"5m\", \"24h\", \"1m30s\";\n\
             # units ns, us, ms, s, m, h, d) or a number of seconds (2, 0.5).\n\
             # Unknown keys and values out of range are refused at start.\n",
        );
        for (section, about, params) in self.sections() {
            let _ = write!(out, "\n# {about}\n[{section}]\n");
            for p in params {
                let value = &table[section][p.key];
                let default = &defaults[section][p.key];
                out.push('\n');
                for line in wrap(p.doc, 88) {
                    let _ = writeln!(out, "# {line}");
                }
                let _ = write!(
                    out,
                    "# default: {default}; allowed: {}\n{} = {value}\n",
                    p.allowed, p.key
                );
            }
        }
        out
    }

    /// The built-in defaults as a commented TOML file (see [`Config::to_toml`]).
    pub fn default_toml() -> String {
        Config::default().to_toml()
    }
}

/// Splits `text` into lines of at most `width` characters at spaces.
fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines = Vec::new();
    let mut line = String::new();
    for word in text.split(' ') {
        if !line.is_empty() && line.chars().count() + 1 + word.chars().count() > width {
            lines.push(std::mem::take(&mut line));
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    lines.push(line);
    lines
}

/// Builds a [`Config`] from defaults and overriding sources; see the
/// [module documentation](self) for the order.
#[derive(Debug, Clone, Default)]
pub struct ConfigLoader {
    table: toml::Table,
}

impl ConfigLoader {
    /// Reads a TOML file over what is there.
    pub fn file(self, path: &Path) -> Result<ConfigLoader, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Read {
            path: path.display().to_string(),
            reason: e.to_string(),
        })?;
        self.toml(&text, &path.display().to_string())
    }

    /// Applies a TOML document over what is there; `origin` names it in errors.
    pub fn toml(mut self, text: &str, origin: &str) -> Result<ConfigLoader, ConfigError> {
        let parse_error = |e: toml::de::Error| ConfigError::Parse {
            origin: origin.to_string(),
            message: e.to_string(),
        };
        // Deserializing the text itself reports unknown keys and wrong types with
        // their line and column.
        toml::from_str::<Config>(text).map_err(parse_error)?;
        let doc: toml::Table = text.parse().map_err(parse_error)?;
        for (section, values) in doc {
            if let toml::Value::Table(values) = values {
                let target = self.section(&section);
                for (key, value) in values {
                    target.insert(key, value);
                }
            }
        }
        Ok(self)
    }

    fn section(&mut self, section: &str) -> &mut toml::Table {
        let entry = self
            .table
            .entry(section.to_string())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        if !entry.is_table() {
            *entry = toml::Value::Table(toml::Table::new());
        }
        entry.as_table_mut().expect("made a table above")
    }

    /// Applies the variables named `COBALT_<SECTION>_<KEY>` (case-insensitive after
    /// the prefix), where SECTION is one of the sections of [`Config`]: `endpoint`,
    /// `limits`, `runtime`, `server`, `connections`, `dtls`, `log`. Other variables are
    /// ignored; an unknown KEY in a known section is an error.
    pub fn env(
        mut self,
        vars: impl IntoIterator<Item = (String, String)>,
    ) -> Result<ConfigLoader, ConfigError> {
        let defaults = Config::default().to_table();
        let mut vars: Vec<(String, String)> = vars.into_iter().collect();
        vars.sort();
        for (name, value) in vars {
            let Some(rest) = name.strip_prefix("COBALT_") else {
                continue;
            };
            let rest = rest.to_ascii_lowercase();
            let Some((section, key)) = rest.split_once('_') else {
                continue;
            };
            if defaults.contains_key(section) {
                self = self.set(&format!("{section}.{key}"), &value, &name)?;
            }
        }
        Ok(self)
    }

    /// [`ConfigLoader::env`] with this process's environment.
    pub fn env_from_process(self) -> Result<ConfigLoader, ConfigError> {
        let vars = std::env::vars_os()
            .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)));
        self.env(vars)
    }

    /// Sets `key` (`section.key`) from its text form: numbers and booleans as written,
    /// strings without quotes (quotes are allowed). `origin` names the source in errors.
    pub fn set(
        mut self,
        key: &str,
        value: &str,
        origin: &str,
    ) -> Result<ConfigLoader, ConfigError> {
        let unknown = || ConfigError::UnknownKey {
            key: key.to_string(),
            origin: origin.to_string(),
        };
        let (section, name) = key.split_once('.').ok_or_else(unknown)?;
        // The keys and their types are those the sections serialize to.
        let defaults = Config::default().to_table();
        let default = defaults
            .get(section)
            .and_then(|s| s.get(name))
            .ok_or_else(unknown)?;
        let bad = |message: String| ConfigError::BadValue {
            key: key.to_string(),
            origin: origin.to_string(),
            message,
        };
        let text = value.trim();
        let unquoted = text
            .strip_prefix('"')
            .and_then(|t| t.strip_suffix('"'))
            .unwrap_or(text);
        let parsed = match default {
            toml::Value::Integer(_) => toml::Value::Integer(
                text.parse()
                    .map_err(|_| bad(format!("`{value}` is not an integer")))?,
            ),
            toml::Value::Float(_) => toml::Value::Float(
                text.parse()
                    .map_err(|_| bad(format!("`{value}` is not a number")))?,
            ),
            toml::Value::Boolean(_) => toml::Value::Boolean(
                text.parse()
                    .map_err(|_| bad(format!("`{value}` is not true or false")))?,
            ),
            _ => toml::Value::String(unquoted.to_string()),
        };
        // Check the value alone, so that a type error names this key and source.
        let mut alone = toml::Table::new();
        let mut inner = toml::Table::new();
        inner.insert(name.to_string(), parsed.clone());
        alone.insert(section.to_string(), toml::Value::Table(inner));
        toml::Value::Table(alone)
            .try_into::<Config>()
            .map_err(|e| bad(e.to_string().trim_end().to_string()))?;
        self.section(section).insert(name.to_string(), parsed);
        Ok(self)
    }

    /// Applies `section.key=value` (the form of `--set`).
    pub fn set_arg(self, arg: &str, origin: &str) -> Result<ConfigLoader, ConfigError> {
        let Some((key, value)) = arg.split_once('=') else {
            return Err(ConfigError::BadValue {
                key: arg.to_string(),
                origin: origin.to_string(),
                message: "expected section.key=value".into(),
            });
        };
        self.set(key.trim(), value, origin)
    }

    /// The configuration, validated.
    pub fn build(self) -> Result<Config, ConfigError> {
        let config: Config =
            toml::Value::Table(self.table)
                .try_into()
                .map_err(|e| ConfigError::Parse {
                    origin: "the merged configuration".into(),
                    message: e.to_string(),
                })?;
        config.validate()?;
        Ok(config)
    }
}

/// Serde for an optional socket address: `""` is `None`.
mod optional_addr {
    use serde::{de, Deserialize, Deserializer, Serializer};
    use std::net::SocketAddr;

    pub fn serialize<S: Serializer>(a: &Option<SocketAddr>, s: S) -> Result<S::Ok, S::Error> {
        match a {
            Some(a) => s.serialize_str(&a.to_string()),
            None => s.serialize_str(""),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<SocketAddr>, D::Error> {
        let s = String::deserialize(d)?;
        if s.trim().is_empty() {
            return Ok(None);
        }
        s.trim().parse().map(Some).map_err(|_| {
            de::Error::custom(format!(
                "`{s}` is not an IP:port address (e.g. \"127.0.0.1:9100\" or \"[::1]:9100\")"
            ))
        })
    }
}

#[cfg(test)]
mod tests;
