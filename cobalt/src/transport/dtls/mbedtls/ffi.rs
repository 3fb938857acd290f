//! The safe wrapper around Mbed TLS 3.6 (`mbedtls-rs-sys`): a DTLS 1.2 configuration
//! ([`Config`]) and one session context over it ([`Context`]). Every `unsafe` block of
//! the Mbed TLS backend is in this module.
//!
//! Mbed TLS works on callbacks; here they only touch memory this module owns:
//! - the record layer reads and writes through [`Io`] (one received datagram in, the
//!   datagrams to send out), boxed so that its address stays fixed while Mbed TLS
//!   holds it;
//! - its retransmission timer is [`Io`]'s two deadlines, measured against the `now`
//!   the caller passes in (no clock is read here);
//! - random bytes come from `rand`'s thread-local generator (ChaCha, seeded and
//!   reseeded from the operating system);
//! - the cookie of the HelloVerifyRequest is an HMAC-SHA256 of the peer's address
//!   under a per-configuration secret, computed from immutable data only (so a
//!   configuration is never written to after it is built);
//! - a server looks the client's PSK identity up in a [`PskStore`].

use crate::transport::credentials::{ClientPsk, PskStore};
use mbedtls_rs_sys as sys;
use rand::RngCore;
use std::cell::RefCell;
use std::ffi::{c_int, c_uchar, c_void, CStr};
use std::fmt;
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// An Mbed TLS error code (negative), with its meaning where it is a common one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MbedError(pub(crate) c_int);

impl fmt::Display for MbedError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let code = self.0;
        let meaning = match code {
            sys::MBEDTLS_ERR_SSL_TIMEOUT => "timed out",
            sys::MBEDTLS_ERR_SSL_PEER_CLOSE_NOTIFY => "the peer closed the session",
            sys::MBEDTLS_ERR_SSL_UNKNOWN_IDENTITY => "unknown psk identity",
            sys::MBEDTLS_ERR_SSL_UNEXPECTED_RECORD => "unexpected or replayed record",
            sys::MBEDTLS_ERR_SSL_INVALID_MAC => {
                "bad record mac: record authentication failed (forged, or a different key)"
            }
            sys::MBEDTLS_ERR_SSL_FATAL_ALERT_MESSAGE => {
                "the peer sent a fatal alert (in a handshake, most often: it does not \
                 accept this PSK identity or key)"
            }
            sys::MBEDTLS_ERR_SSL_HANDSHAKE_FAILURE => {
                "handshake failure (no common cipher suite, or a wrong PSK)"
            }
            sys::MBEDTLS_ERR_SSL_ALLOC_FAILED => "out of memory",
            sys::MBEDTLS_ERR_SSL_DECODE_ERROR => "malformed handshake message",
            sys::MBEDTLS_ERR_SSL_BAD_INPUT_DATA => "bad input data",
            _ => "Mbed TLS error",
        };
        write!(f, "{meaning} (Mbed TLS -0x{:04x})", code.unsigned_abs())
    }
}

fn check(ret: c_int) -> Result<(), MbedError> {
    if ret == 0 {
        Ok(())
    } else {
        Err(MbedError(ret))
    }
}

/// `psa_crypto_init` once per process (Mbed TLS 3.6 does its crypto through PSA),
/// after putting AES-NI under its AES (before anything keys an AES context).
fn init_psa() -> Result<(), MbedError> {
    static STATUS: OnceLock<c_int> = OnceLock::new();
    // SAFETY: `psa_crypto_init` takes no arguments and may be called at any time; the
    // `OnceLock` calls it once per process.
    check(*STATUS.get_or_init(|| {
        super::aes_ni::install();
        unsafe { sys::psa_crypto_init() }
    }))
}

/// Mbed TLS is built with `MBEDTLS_PSA_CRYPTO_EXTERNAL_RNG`: PSA takes its random
/// bytes from this function, which the application must supply.
///
/// # Safety
/// Called by Mbed TLS with `output` valid for `output_size` bytes and
/// `output_length` valid for a write.
#[no_mangle]
pub unsafe extern "C" fn mbedtls_psa_external_get_random(
    _context: *mut c_void,
    output: *mut u8,
    output_size: usize,
    output_length: *mut usize,
) -> c_int {
    if output.is_null() || output_length.is_null() {
        return -135; // PSA_ERROR_INVALID_ARGUMENT
    }
    // SAFETY: the caller passes a buffer of `output_size` bytes and a valid length pointer.
    let out = unsafe { std::slice::from_raw_parts_mut(output, output_size) };
    rand::rng().fill_bytes(out);
    // SAFETY: as above.
    unsafe { *output_length = output_size };
    0
}

/// The random source of the TLS configuration (`mbedtls_ssl_conf_rng`).
unsafe extern "C" fn fill_random(_p: *mut c_void, output: *mut c_uchar, len: usize) -> c_int {
    if output.is_null() {
        return -1;
    }
    // SAFETY: Mbed TLS passes a buffer of `len` bytes.
    let out = unsafe { std::slice::from_raw_parts_mut(output, len) };
    rand::rng().fill_bytes(out);
    0
}

/// The cipher suites: RFC 7252's mandatory PSK suite, then its certificate suite.
static CIPHERSUITES: [c_int; 3] = [
    sys::MBEDTLS_TLS_PSK_WITH_AES_128_CCM_8 as c_int,
    sys::MBEDTLS_TLS_ECDHE_ECDSA_WITH_AES_128_CCM_8 as c_int,
    0,
];

/// Length of the HelloVerifyRequest cookie (a truncated HMAC-SHA256).
const COOKIE_LEN: usize = 16;

/// What a server's callbacks read: the keys and the cookie secret. Never written
/// after the configuration is built.
struct ServerState {
    keys: Option<Arc<PskStore>>,
    cookie_secret: [u8; 32],
}

fn hmac_sha256(key: &[u8], input: &[u8]) -> Option<[u8; 32]> {
    let mut out = [0u8; 32];
    // SAFETY: `mbedtls_md_info_from_type` returns a pointer to a static table entry
    // (or null, checked); the buffers are valid for the lengths passed.
    let ret = unsafe {
        let md = sys::mbedtls_md_info_from_type(sys::mbedtls_md_type_t_MBEDTLS_MD_SHA256);
        if md.is_null() {
            return None;
        }
        sys::mbedtls_md_hmac(
            md,
            key.as_ptr(),
            key.len(),
            input.as_ptr(),
            input.len(),
            out.as_mut_ptr(),
        )
    };
    (ret == 0).then_some(out)
}

unsafe extern "C" fn cookie_write(
    ctx: *mut c_void,
    p: *mut *mut c_uchar,
    end: *mut c_uchar,
    info: *const c_uchar,
    ilen: usize,
) -> c_int {
    if ctx.is_null() || p.is_null() || info.is_null() {
        return sys::MBEDTLS_ERR_SSL_BAD_INPUT_DATA;
    }
    // SAFETY: `ctx` is the `ServerState` the configuration points at, alive as long as
    // the configuration; `info` holds `ilen` bytes; `*p..end` is Mbed TLS's output room.
    unsafe {
        let state = &*(ctx as *const ServerState);
        let id = std::slice::from_raw_parts(info, ilen);
        let Some(mac) = hmac_sha256(&state.cookie_secret, id) else {
            return sys::MBEDTLS_ERR_SSL_INTERNAL_ERROR;
        };
        let room = (end as usize).saturating_sub(*p as usize);
        if room < COOKIE_LEN {
            return sys::MBEDTLS_ERR_SSL_BUFFER_TOO_SMALL;
        }
        std::ptr::copy_nonoverlapping(mac.as_ptr(), *p, COOKIE_LEN);
        *p = (*p).add(COOKIE_LEN);
    }
    0
}

unsafe extern "C" fn cookie_check(
    ctx: *mut c_void,
    cookie: *const c_uchar,
    clen: usize,
    info: *const c_uchar,
    ilen: usize,
) -> c_int {
    if ctx.is_null() || info.is_null() || clen != COOKIE_LEN || cookie.is_null() {
        return -1;
    }
    // SAFETY: as in `cookie_write`; `cookie` holds `clen` bytes.
    unsafe {
        let state = &*(ctx as *const ServerState);
        let id = std::slice::from_raw_parts(info, ilen);
        let given = std::slice::from_raw_parts(cookie, clen);
        match hmac_sha256(&state.cookie_secret, id) {
            // Constant time: fold every byte's difference.
            Some(mac) => {
                let diff = mac[..COOKIE_LEN]
                    .iter()
                    .zip(given)
                    .fold(0u8, |acc, (a, b)| acc | (a ^ b));
                -c_int::from(diff != 0)
            }
            None => -1,
        }
    }
}

thread_local! {
    /// The PSK identity the server's callback accepted during the current
    /// `mbedtls_ssl_handshake` call (callbacks run synchronously on this thread).
    static ACCEPTED_IDENTITY: RefCell<Option<Vec<u8>>> = const { RefCell::new(None) };
}

unsafe extern "C" fn psk_lookup(
    ctx: *mut c_void,
    ssl: *mut sys::mbedtls_ssl_context,
    identity: *const c_uchar,
    len: usize,
) -> c_int {
    if ctx.is_null() || ssl.is_null() || identity.is_null() {
        return sys::MBEDTLS_ERR_SSL_UNKNOWN_IDENTITY;
    }
    // SAFETY: `ctx` is the configuration's `ServerState`; `identity` holds `len` bytes;
    // `ssl` is the context in handshake that called us.
    unsafe {
        let state = &*(ctx as *const ServerState);
        let id = std::slice::from_raw_parts(identity, len);
        let Some(key) = state.keys.as_ref().and_then(|k| k.get(id)) else {
            return sys::MBEDTLS_ERR_SSL_UNKNOWN_IDENTITY;
        };
        if sys::mbedtls_ssl_set_hs_psk(ssl, key.as_ptr(), key.len()) != 0 {
            return sys::MBEDTLS_ERR_SSL_UNKNOWN_IDENTITY;
        }
        ACCEPTED_IDENTITY.with(|a| *a.borrow_mut() = Some(id.to_vec()));
    }
    0
}

/// A server's certificate chain and private key, parsed.
struct OwnCert {
    chain: Box<sys::mbedtls_x509_crt>,
    key: Box<sys::mbedtls_pk_context>,
}

impl Drop for OwnCert {
    fn drop(&mut self) {
        // SAFETY: both initialised in `OwnCert::parse`, freed once; the configuration
        // that pointed at them was freed before (see `Config`'s field order).
        unsafe {
            sys::mbedtls_x509_crt_free(&mut *self.chain);
            sys::mbedtls_pk_free(&mut *self.key);
        }
    }
}

/// PEM text as Mbed TLS parses it: ending in a NUL, counted in the length.
fn nul_terminated(pem: &[u8]) -> Vec<u8> {
    let mut v = pem.to_vec();
    if v.last() != Some(&0) {
        v.push(0);
    }
    v
}

impl OwnCert {
    /// The chain (PEM, leaf first) and its key (PEM).
    fn parse(chain_pem: &[u8], key_pem: &[u8]) -> Result<OwnCert, MbedError> {
        // SAFETY: zeroed memory is what the `_init` functions initialise; the boxes
        // keep the addresses fixed for the configuration that will point at them.
        let mut own = OwnCert {
            chain: Box::new(unsafe { std::mem::zeroed() }),
            key: Box::new(unsafe { std::mem::zeroed() }),
        };
        let chain = nul_terminated(chain_pem);
        let key = nul_terminated(key_pem);
        // SAFETY: initialised contexts and buffers valid for the lengths passed; if a
        // parse fails, `Drop` frees what was set up.
        unsafe {
            sys::mbedtls_x509_crt_init(&mut *own.chain);
            sys::mbedtls_pk_init(&mut *own.key);
            check(sys::mbedtls_x509_crt_parse(
                &mut *own.chain,
                chain.as_ptr(),
                chain.len(),
            ))?;
            check(sys::mbedtls_pk_parse_key(
                &mut *own.key,
                key.as_ptr(),
                key.len(),
                std::ptr::null(),
                0,
                Some(fill_random),
                std::ptr::null_mut(),
            ))?;
        }
        Ok(own)
    }
}

/// The CA certificates a peer's certificate must chain to, parsed.
struct TrustedCas(Box<sys::mbedtls_x509_crt>);

impl Drop for TrustedCas {
    fn drop(&mut self) {
        // SAFETY: initialised in `TrustedCas::parse`, freed once, after the
        // configuration that pointed at it (see `Config`'s field order).
        unsafe { sys::mbedtls_x509_crt_free(&mut *self.0) };
    }
}

impl TrustedCas {
    /// One or more CA certificates (PEM).
    fn parse(pem: &[u8]) -> Result<TrustedCas, MbedError> {
        // SAFETY: zeroed memory is what `_init` initialises; the box keeps the address
        // fixed for the configuration that will point at it.
        let mut cas = TrustedCas(Box::new(unsafe { std::mem::zeroed() }));
        let pem = nul_terminated(pem);
        // SAFETY: an initialised chain and a buffer valid for its length.
        unsafe {
            sys::mbedtls_x509_crt_init(&mut *cas.0);
            check(sys::mbedtls_x509_crt_parse(
                &mut *cas.0,
                pem.as_ptr(),
                pem.len(),
            ))?;
        }
        Ok(cas)
    }
}

/// A UTC time as Mbed TLS writes certificate dates: (year, month, day, hour,
/// minute, second), comparable as a tuple.
type CivilTime = (i64, i64, i64, i64, i64, i64);

/// `secs` after the Unix epoch as a UTC civil time (the proleptic Gregorian calendar).
pub(super) fn civil_utc(secs: u64) -> CivilTime {
    let days = (secs / 86_400) as i64;
    let rest = (secs % 86_400) as i64;
    // Days since 1970-01-01 to a date (H. Hinnant's days-to-civil algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day, rest / 3600, rest / 60 % 60, rest % 60)
}

fn civil_of(t: &sys::mbedtls_x509_time) -> CivilTime {
    let f = |v: c_int| i64::from(v);
    (f(t.year), f(t.mon), f(t.day), f(t.hour), f(t.min), f(t.sec))
}

/// The certificate verification callback: Mbed TLS is built without a clock here,
/// so it checks signatures and the chain but not the validity dates; this checks
/// them against the system clock for each certificate of the chain.
unsafe extern "C" fn check_validity_dates(
    _ctx: *mut c_void,
    crt: *mut sys::mbedtls_x509_crt,
    _depth: c_int,
    flags: *mut u32,
) -> c_int {
    if crt.is_null() || flags.is_null() {
        return sys::MBEDTLS_ERR_X509_BAD_INPUT_DATA;
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let now = civil_utc(now);
    // SAFETY: Mbed TLS passes a parsed certificate and its flags for the call.
    unsafe {
        if now < civil_of(&(*crt).valid_from) {
            *flags |= sys::MBEDTLS_X509_BADCERT_FUTURE;
        }
        if now > civil_of(&(*crt).valid_to) {
            *flags |= sys::MBEDTLS_X509_BADCERT_EXPIRED;
        }
    }
    0
}

/// A DTLS 1.2 configuration: role, credentials, cipher suites, CID length.
pub(crate) struct Config {
    conf: Box<sys::mbedtls_ssl_config>,
    /// Read by the server's callbacks through the configuration's pointers.
    server: Option<Box<ServerState>>,
    /// The server's certificate, which `conf` points at (freed after it: `Drop` frees
    /// `conf` before the fields go).
    own_cert: Option<OwnCert>,
    /// The CAs the peer's certificate must chain to (likewise).
    trusted: Option<TrustedCas>,
    /// This side's CID length (0: this side receives records without a CID).
    cid_len: usize,
}

// SAFETY: a `Config` is not changed after it is built (its callbacks only read
// `ServerState`, and the cookie callbacks are ours, not Mbed TLS's counter-based
// ones), so contexts on different threads may read it at once; the pointers in it
// point into memory the `Config` owns.
unsafe impl Send for Config {}
// SAFETY: see `Send`: shared use is read-only.
unsafe impl Sync for Config {}

impl Drop for Config {
    fn drop(&mut self) {
        // SAFETY: initialised in `Config::new`; freed once. Contexts hold an `Arc` to
        // their configuration, so none is left using it.
        unsafe { sys::mbedtls_ssl_config_free(&mut *self.conf) };
    }
}

impl Config {
    fn new(server: bool, handshake_timeout: Duration) -> Result<Config, MbedError> {
        init_psa()?;
        // SAFETY: a zeroed `mbedtls_ssl_config` is what `mbedtls_ssl_config_init`
        // expects to initialise; the box keeps its address fixed.
        let mut conf: Box<sys::mbedtls_ssl_config> = Box::new(unsafe { std::mem::zeroed() });
        // SAFETY: `conf` is valid; the cipher suite list is static.
        unsafe {
            sys::mbedtls_ssl_config_init(&mut *conf);
            let endpoint = if server {
                sys::MBEDTLS_SSL_IS_SERVER
            } else {
                sys::MBEDTLS_SSL_IS_CLIENT
            };
            check(sys::mbedtls_ssl_config_defaults(
                &mut *conf,
                endpoint as c_int,
                sys::MBEDTLS_SSL_TRANSPORT_DATAGRAM as c_int,
                sys::MBEDTLS_SSL_PRESET_DEFAULT as c_int,
            ))?;
            sys::mbedtls_ssl_conf_rng(&mut *conf, Some(fill_random), std::ptr::null_mut());
            sys::mbedtls_ssl_conf_ciphersuites(&mut *conf, CIPHERSUITES.as_ptr());
            // RFC 6347's initial retransmission timeout of 1 s, doubling, until the
            // handshake's time is up (the table drops it then anyway).
            let max_ms = u32::try_from(handshake_timeout.as_millis()).unwrap_or(u32::MAX);
            sys::mbedtls_ssl_conf_handshake_timeout(&mut *conf, 1000, max_ms.max(1000));
        }
        Ok(Config {
            conf,
            server: None,
            own_cert: None,
            trusted: None,
            cid_len: 0,
        })
    }

    /// A server configuration accepting the identities in `keys` and/or presenting
    /// the certificate `cert` (chain and key, PEM); with `client_ca` (PEM), a client
    /// of a certificate suite must present a certificate that chains to it and is
    /// within its validity dates (else clients are not asked for one); with
    /// `cid_len` > 0 it negotiates a Connection ID of that length for itself
    /// (RFC 9146).
    pub(crate) fn server(
        keys: Option<Arc<PskStore>>,
        cert: Option<(&[u8], &[u8])>,
        client_ca: Option<&[u8]>,
        cid_len: usize,
        handshake_timeout: Duration,
    ) -> Result<Config, MbedError> {
        if cid_len > sys::MBEDTLS_SSL_CID_IN_LEN_MAX as usize {
            return Err(MbedError(sys::MBEDTLS_ERR_SSL_BAD_INPUT_DATA));
        }
        let mut config = Config::new(true, handshake_timeout)?;
        let mut cookie_secret = [0u8; 32];
        rand::rng().fill_bytes(&mut cookie_secret);
        let mut state = Box::new(ServerState {
            keys,
            cookie_secret,
        });
        let state_ptr: *mut ServerState = &mut *state;
        // SAFETY: `state` is boxed and owned by the configuration, so the pointer the
        // callbacks get stays valid for its life.
        unsafe {
            sys::mbedtls_ssl_conf_psk_cb(&mut *config.conf, Some(psk_lookup), state_ptr.cast());
            sys::mbedtls_ssl_conf_dtls_cookies(
                &mut *config.conf,
                Some(cookie_write),
                Some(cookie_check),
                state_ptr.cast(),
            );
            check(sys::mbedtls_ssl_conf_cid(
                &mut *config.conf,
                cid_len,
                sys::MBEDTLS_SSL_UNEXPECTED_CID_IGNORE as c_int,
            ))?;
        }
        if let Some((chain, key)) = cert {
            config.present_certificate(chain, key)?;
        }
        if let Some(pem) = client_ca {
            config.require_peer_certificate(pem)?;
        }
        config.server = Some(state);
        config.cid_len = cid_len;
        Ok(config)
    }

    /// A client configuration with `psk`. With `cid`, the client asks the server for
    /// a Connection ID (and offers a zero-length one of its own: the server's
    /// records to it need none, since the client's address is what changes).
    pub(crate) fn client(
        psk: &ClientPsk,
        cid: bool,
        handshake_timeout: Duration,
    ) -> Result<Config, MbedError> {
        let mut config = Config::new(false, handshake_timeout)?;
        // SAFETY: Mbed TLS copies the key and identity.
        unsafe {
            check(sys::mbedtls_ssl_conf_psk(
                &mut *config.conf,
                psk.key.as_ptr(),
                psk.key.len(),
                psk.identity.as_ptr(),
                psk.identity.len(),
            ))?;
        }
        if cid {
            config.ask_for_cid()?;
        }
        Ok(config)
    }

    /// A client configuration for the certificate suite: it presents `own` (chain
    /// and key, PEM; `None`: no certificate) and requires a server certificate that
    /// chains to `ca` (PEM) and is within its validity dates, for the name each
    /// context is given ([`Context::expect_server_name`]). `cid` as for
    /// [`Config::client`].
    pub(crate) fn client_x509(
        own: Option<(&[u8], &[u8])>,
        ca: &[u8],
        cid: bool,
        handshake_timeout: Duration,
    ) -> Result<Config, MbedError> {
        let mut config = Config::new(false, handshake_timeout)?;
        if let Some((chain, key)) = own {
            config.present_certificate(chain, key)?;
        }
        config.require_peer_certificate(ca)?;
        if cid {
            config.ask_for_cid()?;
        }
        Ok(config)
    }

    /// Client: asks the server for a Connection ID, offering a zero-length one.
    fn ask_for_cid(&mut self) -> Result<(), MbedError> {
        // SAFETY: a set-up configuration.
        check(unsafe {
            sys::mbedtls_ssl_conf_cid(
                &mut *self.conf,
                0,
                sys::MBEDTLS_SSL_UNEXPECTED_CID_IGNORE as c_int,
            )
        })
    }

    /// Presents the certificate `chain` (PEM, leaf first) with its `key` (PEM).
    fn present_certificate(&mut self, chain: &[u8], key: &[u8]) -> Result<(), MbedError> {
        let mut own = OwnCert::parse(chain, key)?;
        // SAFETY: `own` is kept in the configuration (boxed contexts, fixed
        // addresses) and freed after it.
        check(unsafe {
            sys::mbedtls_ssl_conf_own_cert(&mut *self.conf, &mut *own.chain, &mut *own.key)
        })?;
        self.own_cert = Some(own);
        Ok(())
    }

    /// Requires the peer's certificate to chain to the CAs in `ca_pem` and to be
    /// within its validity dates.
    fn require_peer_certificate(&mut self, ca_pem: &[u8]) -> Result<(), MbedError> {
        let mut cas = TrustedCas::parse(ca_pem)?;
        // SAFETY: `cas` is kept in the configuration (boxed, fixed address) and freed
        // after it; the callback takes no context.
        unsafe {
            sys::mbedtls_ssl_conf_ca_chain(&mut *self.conf, &mut *cas.0, std::ptr::null_mut());
            sys::mbedtls_ssl_conf_authmode(
                &mut *self.conf,
                sys::MBEDTLS_SSL_VERIFY_REQUIRED as c_int,
            );
            sys::mbedtls_ssl_conf_verify(
                &mut *self.conf,
                Some(check_validity_dates),
                std::ptr::null_mut(),
            );
        }
        self.trusted = Some(cas);
        Ok(())
    }
}

/// The record layer's side of a context: one received datagram at a time in, the
/// datagrams Mbed TLS writes out, and its retransmission timer.
#[derive(Debug)]
struct Io {
    incoming: Option<Vec<u8>>,
    outgoing: Vec<Vec<u8>>,
    /// The time of the call in progress (Mbed TLS asks the timer during calls only).
    now: Instant,
    /// The timer's intermediate and final deadlines (None: cancelled).
    intermediate: Option<Instant>,
    final_at: Option<Instant>,
}

/// Datagrams a context may queue before it has to wait (a flight is a few).
const OUTGOING_MAX: usize = 64;

unsafe extern "C" fn io_send(ctx: *mut c_void, buf: *const c_uchar, len: usize) -> c_int {
    if ctx.is_null() || buf.is_null() {
        return sys::MBEDTLS_ERR_SSL_BAD_INPUT_DATA;
    }
    // SAFETY: `ctx` is the context's boxed `Io`, alive while the context is; `buf`
    // holds `len` bytes.
    let io = unsafe { &mut *(ctx as *mut Io) };
    if io.outgoing.len() >= OUTGOING_MAX {
        return sys::MBEDTLS_ERR_SSL_WANT_WRITE;
    }
    // SAFETY: as above.
    io.outgoing
        .push(unsafe { std::slice::from_raw_parts(buf, len) }.to_vec());
    c_int::try_from(len).unwrap_or(c_int::MAX)
}

unsafe extern "C" fn io_recv(ctx: *mut c_void, buf: *mut c_uchar, len: usize) -> c_int {
    if ctx.is_null() || buf.is_null() {
        return sys::MBEDTLS_ERR_SSL_BAD_INPUT_DATA;
    }
    // SAFETY: as in `io_send`; `buf` has room for `len` bytes.
    let io = unsafe { &mut *(ctx as *mut Io) };
    match io.incoming.take() {
        Some(d) => {
            let n = d.len().min(len);
            // SAFETY: `n` is within both buffers.
            unsafe { std::ptr::copy_nonoverlapping(d.as_ptr(), buf, n) };
            c_int::try_from(n).unwrap_or(c_int::MAX)
        }
        None => sys::MBEDTLS_ERR_SSL_WANT_READ,
    }
}

unsafe extern "C" fn timer_set(ctx: *mut c_void, int_ms: u32, fin_ms: u32) {
    if ctx.is_null() {
        return;
    }
    // SAFETY: as in `io_send`.
    let io = unsafe { &mut *(ctx as *mut Io) };
    if fin_ms == 0 {
        io.intermediate = None;
        io.final_at = None;
    } else {
        io.intermediate = Some(io.now + Duration::from_millis(u64::from(int_ms)));
        io.final_at = Some(io.now + Duration::from_millis(u64::from(fin_ms)));
    }
}

unsafe extern "C" fn timer_get(ctx: *mut c_void) -> c_int {
    if ctx.is_null() {
        return -1;
    }
    // SAFETY: as in `io_send`.
    let io = unsafe { &*(ctx as *const Io) };
    match (io.intermediate, io.final_at) {
        (_, None) => -1,
        (_, Some(f)) if io.now >= f => 2,
        (Some(i), _) if io.now >= i => 1,
        _ => 0,
    }
}

/// How far a handshake got in one step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Handshake {
    /// Complete: the session is established.
    Done,
    /// Waiting for the peer (or the timer).
    InProgress,
    /// A server sent a HelloVerifyRequest: the context must be reset before the
    /// next ClientHello.
    HelloVerifySent,
    /// Failed for good.
    Failed(MbedError),
}

/// What reading application data gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Read {
    /// Nothing (more) to read.
    Nothing,
    /// The peer closed the session with close_notify.
    Closed,
    /// The session failed (a fatal alert, or an error).
    Failed(MbedError),
}

/// One DTLS session: an `mbedtls_ssl_context` over its boxed [`Io`].
pub(crate) struct Context {
    ssl: Box<sys::mbedtls_ssl_context>,
    io: Box<Io>,
    config: Arc<Config>,
    /// Server: the PSK identity the client used.
    psk_identity: Option<Vec<u8>>,
}

// SAFETY: the context and its `Io` are owned by this value and used through `&mut`
// only; the configuration it points at is shared read-only (`Config` is `Sync`).
unsafe impl Send for Context {}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: set up in `Context::new`, freed once, before `config` (held by the
        // `Arc` in this value) can go.
        unsafe { sys::mbedtls_ssl_free(&mut *self.ssl) };
    }
}

impl fmt::Debug for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Context").field("io", &self.io).finish()
    }
}

impl Context {
    /// A new context over `config`; `mtu` bounds the datagrams of its flights.
    pub(crate) fn new(config: &Arc<Config>, now: Instant, mtu: u16) -> Result<Context, MbedError> {
        // SAFETY: zeroed memory is what `mbedtls_ssl_init` initialises.
        let ssl: Box<sys::mbedtls_ssl_context> = Box::new(unsafe { std::mem::zeroed() });
        let io = Box::new(Io {
            incoming: None,
            outgoing: Vec::new(),
            now,
            intermediate: None,
            final_at: None,
        });
        let mut ctx = Context {
            ssl,
            io,
            config: config.clone(),
            psk_identity: None,
        };
        let io_ptr: *mut Io = &mut *ctx.io;
        // SAFETY: `ssl` is boxed (fixed address) and initialised before use; the
        // configuration outlives it (the `Arc`); `io_ptr` points at the boxed `Io`
        // owned by the same value, so it outlives the context's use of it. If
        // `mbedtls_ssl_setup` fails, `Drop` still frees what `mbedtls_ssl_init` set up.
        unsafe {
            sys::mbedtls_ssl_init(&mut *ctx.ssl);
            check(sys::mbedtls_ssl_setup(&mut *ctx.ssl, &*ctx.config.conf))?;
            sys::mbedtls_ssl_set_bio(
                &mut *ctx.ssl,
                io_ptr.cast(),
                Some(io_send),
                Some(io_recv),
                None,
            );
            sys::mbedtls_ssl_set_timer_cb(
                &mut *ctx.ssl,
                io_ptr.cast(),
                Some(timer_set),
                Some(timer_get),
            );
            sys::mbedtls_ssl_set_mtu(&mut *ctx.ssl, mtu);
        }
        Ok(ctx)
    }

    /// Asks for (client) or grants (server) a Connection ID, with `own_cid` as this
    /// side's (empty: this side receives records without one).
    pub(crate) fn enable_cid(&mut self, own_cid: &[u8]) -> Result<(), MbedError> {
        // SAFETY: a set-up context; Mbed TLS copies the CID.
        check(unsafe {
            sys::mbedtls_ssl_set_cid(
                &mut *self.ssl,
                sys::MBEDTLS_SSL_CID_ENABLED as c_int,
                own_cid.as_ptr(),
                own_cid.len(),
            )
        })
    }

    /// Server: the client's address, which the HelloVerifyRequest cookie covers.
    /// Must follow [`Context::reset`] (Mbed TLS clears it there).
    pub(crate) fn set_transport_id(&mut self, peer: SocketAddr) -> Result<(), MbedError> {
        let id = transport_id(peer);
        // SAFETY: a set-up context; Mbed TLS copies the bytes.
        check(unsafe {
            sys::mbedtls_ssl_set_client_transport_id(&mut *self.ssl, id.as_ptr(), id.len())
        })
    }

    /// Forgets the handshake in progress so the context can take a new ClientHello.
    pub(crate) fn reset(&mut self) -> Result<(), MbedError> {
        self.io.incoming = None;
        self.io.intermediate = None;
        self.io.final_at = None;
        self.psk_identity = None;
        // SAFETY: a set-up context.
        check(unsafe { sys::mbedtls_ssl_session_reset(&mut *self.ssl) })
    }

    /// Runs the handshake with `records` (if any) as the next datagram received.
    pub(crate) fn handshake(&mut self, now: Instant, records: Option<&[u8]>) -> Handshake {
        self.io.now = now;
        if let Some(r) = records {
            self.io.incoming = Some(r.to_vec());
        }
        ACCEPTED_IDENTITY.with(|a| a.borrow_mut().take());
        // SAFETY: a set-up context whose BIO and timer point at `self.io`.
        let ret = unsafe { sys::mbedtls_ssl_handshake(&mut *self.ssl) };
        if let Some(id) = ACCEPTED_IDENTITY.with(|a| a.borrow_mut().take()) {
            self.psk_identity = Some(id);
        }
        self.io.incoming = None;
        match ret {
            0 => Handshake::Done,
            sys::MBEDTLS_ERR_SSL_WANT_READ | sys::MBEDTLS_ERR_SSL_WANT_WRITE => {
                Handshake::InProgress
            }
            sys::MBEDTLS_ERR_SSL_HELLO_VERIFY_REQUIRED => Handshake::HelloVerifySent,
            // A record Mbed TLS drops without failing the handshake.
            sys::MBEDTLS_ERR_SSL_UNEXPECTED_RECORD | sys::MBEDTLS_ERR_SSL_CONTINUE_PROCESSING => {
                Handshake::InProgress
            }
            e => Handshake::Failed(MbedError(e)),
        }
    }

    /// Feeds `records` (one received datagram) to an established session and appends
    /// the application data it carried to `out`, one datagram each.
    pub(crate) fn read(&mut self, now: Instant, records: &[u8], out: &mut Vec<Vec<u8>>) -> Read {
        self.io.now = now;
        self.io.incoming = Some(records.to_vec());
        let mut buf = [0u8; 2048];
        let result = loop {
            // SAFETY: a set-up context; `buf` is valid for its length.
            let ret = unsafe { sys::mbedtls_ssl_read(&mut *self.ssl, buf.as_mut_ptr(), buf.len()) };
            match ret {
                n if n > 0 => out.push(buf[..n as usize].to_vec()),
                0 | sys::MBEDTLS_ERR_SSL_WANT_READ | sys::MBEDTLS_ERR_SSL_WANT_WRITE => {
                    break Read::Nothing
                }
                sys::MBEDTLS_ERR_SSL_PEER_CLOSE_NOTIFY => break Read::Closed,
                // Dropped records (bad MAC, replay, an unknown CID) are not fatal in DTLS.
                sys::MBEDTLS_ERR_SSL_UNEXPECTED_RECORD
                | sys::MBEDTLS_ERR_SSL_CONTINUE_PROCESSING
                | sys::MBEDTLS_ERR_SSL_INVALID_MAC => break Read::Nothing,
                // A new ClientHello on the session's address: the caller starts over.
                sys::MBEDTLS_ERR_SSL_CLIENT_RECONNECT => {
                    break Read::Failed(MbedError(sys::MBEDTLS_ERR_SSL_CLIENT_RECONNECT))
                }
                e => break Read::Failed(MbedError(e)),
            }
        };
        self.io.incoming = None;
        result
    }

    /// Protects one datagram of application data (at most the record size).
    pub(crate) fn write(&mut self, plaintext: &[u8]) -> Result<(), MbedError> {
        // SAFETY: a set-up, established context; `plaintext` is valid for its length.
        let ret =
            unsafe { sys::mbedtls_ssl_write(&mut *self.ssl, plaintext.as_ptr(), plaintext.len()) };
        match ret {
            n if n >= 0 && n as usize == plaintext.len() => Ok(()),
            n if n >= 0 => Err(MbedError(sys::MBEDTLS_ERR_SSL_BAD_INPUT_DATA)),
            e => Err(MbedError(e)),
        }
    }

    /// Queues a close_notify alert.
    pub(crate) fn close_notify(&mut self) {
        // SAFETY: a set-up context.
        let _ = unsafe { sys::mbedtls_ssl_close_notify(&mut *self.ssl) };
    }

    /// Whether the first record of `datagram` is authentic and not a replay for this
    /// session, without changing the session (RFC 9146 §6's test before an address
    /// update). Works on a copy: Mbed TLS may decrypt in place.
    pub(crate) fn check_record(&self, datagram: &[u8]) -> Result<(), MbedError> {
        let mut copy = datagram.to_vec();
        // SAFETY: a set-up context (only read); `copy` is valid for its length.
        check(unsafe { sys::mbedtls_ssl_check_record(&*self.ssl, copy.as_mut_ptr(), copy.len()) })
    }

    /// The CID the peer asked this side to put in its records, when CID is in use
    /// (`Some(empty)`: in use, and the peer's is empty).
    pub(crate) fn peer_cid(&mut self) -> Option<Vec<u8>> {
        let mut enabled: c_int = 0;
        let mut cid = [0u8; sys::MBEDTLS_SSL_CID_OUT_LEN_MAX as usize];
        let mut len = 0usize;
        // SAFETY: a set-up context; the buffers have the room Mbed TLS documents.
        let ret = unsafe {
            sys::mbedtls_ssl_get_peer_cid(&mut *self.ssl, &mut enabled, cid.as_mut_ptr(), &mut len)
        };
        (ret == 0 && enabled == sys::MBEDTLS_SSL_CID_ENABLED as c_int)
            .then(|| cid[..len.min(cid.len())].to_vec())
    }

    /// The negotiated cipher suite (IANA name as Mbed TLS writes it).
    pub(crate) fn ciphersuite(&self) -> Option<String> {
        // SAFETY: a set-up context; the result is null or a static C string.
        unsafe {
            let name = sys::mbedtls_ssl_get_ciphersuite(&*self.ssl);
            (!name.is_null()).then(|| CStr::from_ptr(name).to_string_lossy().into_owned())
        }
    }

    /// Client with a certificate configuration: the name (or IP address, written
    /// out) the server's certificate must carry.
    pub(crate) fn expect_server_name(&mut self, name: &str) -> Result<(), MbedError> {
        let name = std::ffi::CString::new(name)
            .map_err(|_| MbedError(sys::MBEDTLS_ERR_SSL_BAD_INPUT_DATA))?;
        // SAFETY: a set-up context; Mbed TLS copies the name.
        check(unsafe { sys::mbedtls_ssl_set_hostname(&mut *self.ssl, name.as_ptr()) })
    }

    /// Server: the PSK identity the client proved.
    pub(crate) fn psk_identity(&self) -> Option<&[u8]> {
        self.psk_identity.as_deref()
    }

    /// Server: the subject of the certificate the client presented (which verified:
    /// the configuration requires that of any certificate), `CN=...,O=...` in the
    /// certificate's order.
    pub(crate) fn peer_subject(&self) -> Option<String> {
        let mut buf = [0u8; 512];
        // SAFETY: a set-up context; the certificate (if any) lives as long as the
        // session, and `mbedtls_x509_dn_gets` writes at most `buf.len()` bytes,
        // NUL-terminated.
        let n = unsafe {
            let crt = sys::mbedtls_ssl_get_peer_cert(&*self.ssl);
            if crt.is_null() {
                return None;
            }
            sys::mbedtls_x509_dn_gets(buf.as_mut_ptr().cast(), buf.len(), &(*crt).subject)
        };
        let n = usize::try_from(n).ok()?;
        let text = String::from_utf8_lossy(&buf[..n.min(buf.len())]);
        // Mbed TLS separates the entries with ", ", OpenSSL's form with ",".
        Some(text.replace(", ", ","))
    }

    /// When the handshake's retransmission timer fires next (Mbed TLS retransmits
    /// when its final deadline has passed).
    pub(crate) fn retransmit_at(&self) -> Option<Instant> {
        self.io.final_at
    }

    /// Whether datagrams wait to be taken.
    pub(crate) fn has_outgoing(&self) -> bool {
        !self.io.outgoing.is_empty()
    }

    /// The datagrams written since the last call.
    pub(crate) fn take_outgoing(&mut self) -> std::vec::Drain<'_, Vec<u8>> {
        self.io.outgoing.drain(..)
    }
}

/// The client's transport identifier for the cookie: its address and port.
fn transport_id(peer: SocketAddr) -> Vec<u8> {
    let mut id = match peer.ip() {
        std::net::IpAddr::V4(a) => a.octets().to_vec(),
        std::net::IpAddr::V6(a) => a.octets().to_vec(),
    };
    id.extend_from_slice(&peer.port().to_be_bytes());
    id
}
