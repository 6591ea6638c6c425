//! When the certificates a replica loaded stop being valid, for the metrics and the status
//! page (`ports::tls` reads them).

/// When a loaded certificate file stops being valid: the earliest `notAfter` of the
/// certificates it holds (a chain, or a CA bundle).
#[derive(Clone, Debug)]
pub struct CertificateExpiry {
    pub file: String,
    /// `ca` or `replica`.
    pub role: &'static str,
    /// Seconds since the Unix epoch.
    pub not_after: i64,
}

impl CertificateExpiry {
    /// Days from now until it expires; negative once it has.
    pub fn days_left(&self) -> f64 {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        (self.not_after - now) as f64 / 86_400.0
    }
}
