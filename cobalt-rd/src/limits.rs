//! The bounds the directory keeps against hostile or broken endpoints.

/// Every bound of the directory; what exceeds one is answered with the RFC 9176 /
/// RFC 7252 error code named on the field, and nothing is stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RdLimits {
    /// Largest link-format body of a registration or update, in bytes (4.13 with Size1).
    pub max_body_bytes: usize,
    /// Most links in one registration (4.13).
    pub max_links: usize,
    /// Longest `ep` and `d` value, in bytes; RFC 9176 §9.3 says 63 (4.00).
    pub max_name_bytes: usize,
    /// Longest value of any other registration or link attribute, `base` included (4.00).
    pub max_attr_bytes: usize,
    /// Most endpoint attributes (`et` and extra ones) on one registration (4.00).
    pub max_endpoint_attrs: usize,
    /// Most registrations from one peer address budget
    /// ([`AddressKey`](cobalt_proto::address::AddressKey)) (5.03 with Max-Age).
    pub max_per_peer: usize,
    /// Most registrations in the whole directory (5.03 with Max-Age).
    pub max_total: usize,
    /// The Max-Age, in seconds, sent with a 5.03 for a full directory or peer budget.
    pub retry_after_secs: u32,
    /// The Max-Age, in seconds, of lookup answers and their notifications: an observer
    /// that hears nothing for this long (plus a grace) registers again, which is how it
    /// finds a new node after the one it observed died (RFC 7641 §3.3.1). 60 (CoAP's
    /// default) is not sent.
    pub lookup_max_age_secs: u32,
    /// Largest `count` a lookup may ask for, and the page size when it asks for none.
    pub max_lookup_count: usize,
    /// Most simple registrations whose `/.well-known/core` is being fetched at once
    /// (5.03 with Max-Age beyond).
    pub max_simple_fetches: usize,
}

impl Default for RdLimits {
    fn default() -> Self {
        RdLimits {
            max_body_bytes: 16 * 1024,
            max_links: 256,
            max_name_bytes: 63,
            max_attr_bytes: 255,
            max_endpoint_attrs: 16,
            max_per_peer: 64,
            max_total: 100_000,
            retry_after_secs: 60,
            lookup_max_age_secs: 60,
            max_lookup_count: 1000,
            max_simple_fetches: 64,
        }
    }
}
