//! Who may read what on the observability port. Probes and metrics are open (they carry no
//! job data); the status page's data (`/status.json`, `/history.json`) needs, when `[auth]` is
//! on, the same credentials as the client port: a bearer token whose role may read. Payloads
//! of commands are shown only when asked for (`?payloads=true`) and, with `[auth]`, only to an
//! operator or admin. Every request's `Host` must be an IP address, `localhost` or one of the
//! configured names, so that a page on another site cannot reach the port through DNS
//! rebinding.
//!
//! A wrong token closes its connection, and a source address that sent
//! [`FAILED_TOKENS_PER_SECOND`] wrong tokens within a second is answered 429 without a look at
//! its next tokens until the second is over: tokens cannot be guessed at the port's speed
//! (3d7237e answered 2,000 wrong tokens on one connection in 0.2 s, and kept it open).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use crate::server::ports::auth::{authorize, Action, Authenticator, Principal, Role};

/// The port's rules, built once from the configuration.
pub struct PageAccess {
    authenticator: Option<Arc<Authenticator>>,
    /// Lowercase host names allowed besides IP addresses and `localhost`.
    allowed_hosts: Vec<String>,
    /// Wrong tokens by source address: since when it is counted, and how many.
    failures: Mutex<HashMap<IpAddr, (Instant, u32)>>,
}

/// Wrong tokens one source address may send in a second before it is answered 429.
pub const FAILED_TOKENS_PER_SECOND: u32 = 5;

/// The window [`FAILED_TOKENS_PER_SECOND`] counts in.
const FAILURE_WINDOW: Duration = Duration::from_secs(1);

/// Who is reading a page.
pub enum Reader {
    /// Nobody asks for credentials: `[auth]` is off.
    Anyone,
    Principal(Principal),
}

impl Reader {
    /// Whether this reader may see command payloads (when it asks).
    pub fn may_see_payloads(&self) -> bool {
        match self {
            Reader::Anyone => true,
            Reader::Principal(p) => matches!(p.role, Role::Admin | Role::Operator),
        }
    }
}

/// A refused request: its status and why.
#[derive(Debug)]
pub struct Refusal {
    pub status: StatusCode,
    pub message: String,
}

impl Refusal {
    fn new(status: StatusCode, message: impl Into<String>) -> Refusal {
        Refusal {
            status,
            message: message.into(),
        }
    }
}

/// A wrong or throttled token also closes the connection: the next guess costs a new one.
impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let closes = matches!(
            self.status,
            StatusCode::UNAUTHORIZED | StatusCode::TOO_MANY_REQUESTS
        );
        let mut response = (self.status, self.message).into_response();
        if closes {
            response
                .headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        response
    }
}

impl PageAccess {
    pub fn new(authenticator: Option<Arc<Authenticator>>, allowed_hosts: &[String]) -> PageAccess {
        PageAccess {
            authenticator,
            allowed_hosts: allowed_hosts
                .iter()
                .map(|h| h.to_ascii_lowercase())
                .collect(),
            failures: Mutex::default(),
        }
    }

    /// Whether a request naming `host` (the `Host` header, port included) is for this port.
    pub fn host_allowed(&self, host: Option<&str>) -> bool {
        let Some(host) = host else {
            return true; // HTTP/1.0 without Host: no browser, no rebinding
        };
        let name = match host.strip_prefix('[') {
            Some(v6) => {
                return v6
                    .split(']')
                    .next()
                    .is_some_and(|ip| ip.parse::<std::net::Ipv6Addr>().is_ok())
            }
            None => match host.rsplit_once(':') {
                Some((name, port)) if port.chars().all(|c| c.is_ascii_digit()) => name,
                _ => host,
            },
        };
        let name = name.to_ascii_lowercase();
        name.parse::<std::net::IpAddr>().is_ok()
            || name == "localhost"
            || self.allowed_hosts.contains(&name)
    }

    /// Who sends `headers` from `source`, if they may read the job: anyone without `[auth]`,
    /// else the holder of a bearer token whose role may read.
    pub fn reader(&self, headers: &HeaderMap, source: IpAddr) -> Result<Reader, Refusal> {
        let Some(authenticator) = &self.authenticator else {
            return Ok(Reader::Anyone);
        };
        let now = Instant::now();
        if self.failures_within_window(source, now) >= FAILED_TOKENS_PER_SECOND {
            return Err(Refusal::new(
                StatusCode::TOO_MANY_REQUESTS,
                "too many wrong tokens from this address: try again in a second\n",
            ));
        }
        let token = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim);
        let Some(principal) = token.and_then(|t| authenticator.by_token(t)) else {
            if token.is_some() {
                self.count_failure(source, now);
            }
            return Err(Refusal::new(
                StatusCode::UNAUTHORIZED,
                "this replica requires credentials: send `Authorization: Bearer <token>`, a \
                 token of the client port's tokens file\n",
            ));
        };
        authorize(&principal, &Action::Read)
            .map_err(|refusal| Refusal::new(StatusCode::FORBIDDEN, format!("{refusal}\n")))?;
        Ok(Reader::Principal(principal))
    }

    /// Wrong tokens from `source` in its current window.
    fn failures_within_window(&self, source: IpAddr, now: Instant) -> u32 {
        let failures = self.failures.lock().expect("never poisoned");
        match failures.get(&source) {
            Some((since, count)) if now.duration_since(*since) < FAILURE_WINDOW => *count,
            _ => 0,
        }
    }

    fn count_failure(&self, source: IpAddr, now: Instant) {
        let mut failures = self.failures.lock().expect("never poisoned");
        // Windows that ended are forgotten, so that many sources cannot grow the table.
        failures.retain(|_, (since, _)| now.duration_since(*since) < FAILURE_WINDOW);
        let (_, count) = failures.entry(source).or_insert((now, 0));
        *count += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_are_ip_addresses_localhost_or_configured_names() {
        let access = PageAccess::new(None, &["Ctrlog-0.ctrlog.svc".into()]);
        for allowed in [
            None,
            Some("127.0.0.1:7080"),
            Some("10.0.0.1"),
            Some("[::1]:7080"),
            Some("localhost:7080"),
            Some("ctrlog-0.ctrlog.svc:7080"),
        ] {
            assert!(access.host_allowed(allowed), "{allowed:?}");
        }
        for refused in [
            "attacker.example:7080",
            "attacker.example",
            "127.0.0.1.nip.io:7080",
            "[evil]:1",
        ] {
            assert!(!access.host_allowed(Some(refused)), "{refused}");
        }
    }
}
