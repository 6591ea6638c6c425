//! Who may read what on the observability port. Probes and metrics are open (they carry no
//! job data); the status page's data (`/status.json`, `/history.json`) needs, when `[auth]` is
//! on, the same credentials as the client port: a bearer token whose role may read. Payloads
//! of commands are shown only when asked for (`?payloads=true`) and, with `[auth]`, only to an
//! operator or admin. Every request's `Host` must be an IP address, `localhost` or one of the
//! configured names, so that a page on another site cannot reach the port through DNS
//! rebinding.

use std::sync::Arc;

use axum::http::{header, HeaderMap, StatusCode};

use super::auth::{authorize, Action, Authenticator, Principal, Role};

/// The port's rules, built once from the configuration.
pub struct PageAccess {
    authenticator: Option<Arc<Authenticator>>,
    /// Lowercase host names allowed besides IP addresses and `localhost`.
    allowed_hosts: Vec<String>,
}

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
pub type Refusal = (StatusCode, String);

impl PageAccess {
    pub fn new(authenticator: Option<Arc<Authenticator>>, allowed_hosts: &[String]) -> PageAccess {
        PageAccess {
            authenticator,
            allowed_hosts: allowed_hosts
                .iter()
                .map(|h| h.to_ascii_lowercase())
                .collect(),
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

    /// Who sends `headers`, if they may read the job: anyone without `[auth]`, else the holder
    /// of a bearer token whose role may read.
    pub fn reader(&self, headers: &HeaderMap) -> Result<Reader, Refusal> {
        let Some(authenticator) = &self.authenticator else {
            return Ok(Reader::Anyone);
        };
        let token = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim);
        let Some(principal) = token.and_then(|t| authenticator.by_token(t)) else {
            return Err((
                StatusCode::UNAUTHORIZED,
                "this replica requires credentials: send `Authorization: Bearer <token>`, a \
                 token of the client port's tokens file\n"
                    .into(),
            ));
        };
        authorize(&principal, &Action::Read)
            .map_err(|refusal| (StatusCode::FORBIDDEN, format!("{refusal}\n")))?;
        Ok(Reader::Principal(principal))
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
