//! The outbound policy (a guard against server-side request forgery): which
//! addresses the hub may connect to, whatever a URL says.
//!
//! Some ranges are always refused unless `[outbound] allow` lists them: the
//! unspecified, multicast, broadcast and link-local ranges and the cloud
//! metadata addresses. Loopback, RFC 1918, CGNAT and unique local addresses
//! are "private": allowed or refused by `[outbound] private`. An address
//! that embeds an IPv4 one (IPv4-mapped, IPv4-compatible, 6to4, NAT64) is
//! judged by the embedded address.
//!
//! The policy is enforced where the hub connects: on every address a host
//! name resolves to ([`Guard`], the HTTP connector's resolver), so a name
//! that resolves to a forbidden address, or starts to, is caught; and on
//! IP-literal hosts, which the connector does not resolve, before sending
//! ([`Policy::check_uri`]). Registration checks the same ahead of time
//! ([`Policy::check_url_resolving`]).

use std::fmt;
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::Uri;
use hyper_util::client::legacy::connect::dns::Name;

/// Why a request may not go where its URL points. The text names the
/// address and the rule, for the operator and the agent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Refused(String);

impl Refused {
    pub fn reason(&self) -> &str {
        &self.0
    }
}

/// A special range an address falls in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Range {
    /// 0.0.0.0/8, `::`.
    Unspecified,
    /// 224.0.0.0/4, ff00::/8.
    Multicast,
    /// 255.255.255.255.
    Broadcast,
    /// 169.254.0.0/16, fe80::/10.
    LinkLocal,
    /// 127.0.0.0/8, `::1`.
    Loopback,
    /// 10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16.
    Private,
    /// 100.64.0.0/10 (RFC 6598).
    SharedCgnat,
    /// fc00::/7.
    UniqueLocal,
    /// fec0::/10 (deprecated, but still routed inside some networks).
    SiteLocal,
}

impl Range {
    /// Allowed or refused by `[outbound] private`; every other range is refused.
    pub fn is_private(self) -> bool {
        matches!(
            self,
            Range::Loopback
                | Range::Private
                | Range::SharedCgnat
                | Range::UniqueLocal
                | Range::SiteLocal
        )
    }
}

/// How an IPv6 address carries an IPv4 one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Embedding {
    /// `::ffff:a.b.c.d`.
    Mapped,
    /// `::a.b.c.d` (deprecated).
    Compatible,
    /// `2002:AABB:CCDD::/48`.
    SixToFour,
    /// `64:ff9b::a.b.c.d`, and the local-use `64:ff9b:1::/48` with the
    /// address in its last 32 bits.
    Nat64,
    /// `2001:0::/32`: the client's IPv4 address, inverted, in the last 32 bits.
    Teredo,
}

impl fmt::Display for Embedding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Embedding::Mapped => "IPv4-mapped",
            Embedding::Compatible => "IPv4-compatible",
            Embedding::SixToFour => "6to4",
            Embedding::Nat64 => "NAT64",
            Embedding::Teredo => "Teredo",
        })
    }
}

/// What an address is, when it is not an ordinary public one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Special {
    pub range: Range,
    /// A cloud provider's instance metadata service: always refused.
    pub metadata: bool,
    /// The IPv4 address the verdict is about, when the address embeds one.
    pub embedded: Option<(Embedding, Ipv4Addr)>,
}

impl Special {
    /// Refused whatever `[outbound] private` says (unless allowed by name or CIDR).
    pub fn always_refused(&self) -> bool {
        self.metadata || !self.range.is_private()
    }

    fn what(&self) -> &'static str {
        match (self.range, self.metadata) {
            (Range::LinkLocal, true) => "link-local (cloud metadata)",
            (Range::UniqueLocal, true) => "unique local (cloud metadata)",
            (Range::SharedCgnat, true) => "CGNAT shared address space (cloud metadata)",
            (_, true) => "a cloud metadata address",
            (Range::Unspecified, _) => "unspecified",
            (Range::Multicast, _) => "multicast",
            (Range::Broadcast, _) => "the broadcast address",
            (Range::LinkLocal, _) => "link-local",
            (Range::Loopback, _) => "loopback",
            (Range::Private, _) => "private (RFC 1918)",
            (Range::SharedCgnat, _) => "CGNAT shared address space (100.64.0.0/10)",
            (Range::UniqueLocal, _) => "unique local (fc00::/7)",
            (Range::SiteLocal, _) => "site-local (fec0::/10)",
        }
    }

    fn rule(&self) -> &'static str {
        if self.always_refused() {
            "refused unless `[outbound] allow` lists it"
        } else {
            "refused by `[outbound] private = \"deny\"`"
        }
    }
}

const METADATA_V4: [Ipv4Addr; 2] = [
    // AWS, GCP, Azure, OpenStack, DigitalOcean, Oracle…
    Ipv4Addr::new(169, 254, 169, 254),
    // Alibaba Cloud.
    Ipv4Addr::new(100, 100, 100, 200),
];
/// AWS's IPv6 instance metadata endpoint.
const METADATA_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254);

/// The special range `ip` is in, if any (an embedded IPv4 address decides
/// for the IPv6 forms that carry one).
pub fn classify(ip: IpAddr) -> Option<Special> {
    match ip {
        IpAddr::V4(v4) => classify_v4(v4),
        IpAddr::V6(v6) => classify_v6(v6),
    }
}

fn classify_v4(ip: Ipv4Addr) -> Option<Special> {
    let [a, b, ..] = ip.octets();
    let range = if a == 0 {
        Range::Unspecified
    } else if ip == Ipv4Addr::BROADCAST {
        Range::Broadcast
    } else if ip.is_multicast() {
        Range::Multicast
    } else if ip.is_link_local() {
        Range::LinkLocal
    } else if ip.is_loopback() {
        Range::Loopback
    } else if ip.is_private() {
        Range::Private
    } else if a == 100 && (b & 0xc0) == 64 {
        Range::SharedCgnat
    } else {
        return None;
    };
    Some(Special {
        range,
        metadata: METADATA_V4.contains(&ip),
        embedded: None,
    })
}

fn classify_v6(ip: Ipv6Addr) -> Option<Special> {
    if let Some((embedding, v4)) = embedded_v4(ip) {
        return classify_v4(v4).map(|s| Special {
            embedded: Some((embedding, v4)),
            ..s
        });
    }
    let first = ip.segments()[0];
    let range = if ip.is_unspecified() {
        Range::Unspecified
    } else if ip.is_loopback() {
        Range::Loopback
    } else if ip.is_multicast() {
        Range::Multicast
    } else if first & 0xffc0 == 0xfe80 {
        Range::LinkLocal
    } else if first & 0xffc0 == 0xfec0 {
        Range::SiteLocal
    } else if first & 0xfe00 == 0xfc00 {
        Range::UniqueLocal
    } else {
        return None;
    };
    Some(Special {
        range,
        metadata: ip == METADATA_V6,
        embedded: None,
    })
}

/// The IPv4 address an IPv6 one carries: IPv4-mapped (`::ffff:0:0/96`),
/// IPv4-compatible (`::/96`, but `::` and `::1`), 6to4 (`2002::/16`),
/// NAT64 (`64:ff9b::/96`, and `64:ff9b:1::/48` as `/96`-style) and Teredo
/// (`2001::/32`, whose packets reach the client's IPv4 address).
pub fn embedded_v4(ip: Ipv6Addr) -> Option<(Embedding, Ipv4Addr)> {
    let s = ip.segments();
    let last = |hi: u16, lo: u16| Ipv4Addr::from((u32::from(hi) << 16) | u32::from(lo));
    match s {
        [0, 0, 0, 0, 0, 0xffff, hi, lo] => Some((Embedding::Mapped, last(hi, lo))),
        [0, 0, 0, 0, 0, 0, 0, 0 | 1] => None,
        [0, 0, 0, 0, 0, 0, hi, lo] => Some((Embedding::Compatible, last(hi, lo))),
        [0x2002, hi, lo, ..] => Some((Embedding::SixToFour, last(hi, lo))),
        [0x64, 0xff9b, 0, 0, 0, 0, hi, lo] | [0x64, 0xff9b, 1, _, _, _, hi, lo] => {
            Some((Embedding::Nat64, last(hi, lo)))
        }
        [0x2001, 0, _, _, _, _, hi, lo] => Some((Embedding::Teredo, last(!hi, !lo))),
        _ => None,
    }
}

/// A CIDR of `[outbound] allow`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Net {
    addr: IpAddr,
    prefix: u8,
}

impl Net {
    fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }
}

/// An entry of `[outbound] allow`: a CIDR (an address alone is one address)
/// or a host name.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Allowed {
    Net(Net),
    Host(String),
}

fn parse_allowed(entry: &str) -> Result<Allowed, String> {
    let entry = entry.trim();
    let neither = || {
        format!("`{entry}` is neither a CIDR (10.0.0.0/8, fd00::/8), an address nor a host name")
    };
    if let Some((addr, prefix)) = entry.split_once('/') {
        let addr: IpAddr = addr.parse().map_err(|_| neither())?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix: u8 = prefix
            .parse()
            .ok()
            .filter(|p| *p <= max)
            .ok_or_else(|| format!("`{entry}`: the prefix length must be 0 to {max}"))?;
        let net = Net { addr, prefix };
        let base = Net {
            addr: network(addr, prefix),
            prefix,
        };
        if base != net {
            return Err(format!(
                "`{entry}` has bits set past the prefix; did you mean {}/{prefix}?",
                base.addr
            ));
        }
        return Ok(Allowed::Net(net));
    }
    if let Ok(addr) = entry.trim_start_matches('[').trim_end_matches(']').parse() {
        let prefix = if matches!(addr, IpAddr::V4(_)) {
            32
        } else {
            128
        };
        return Ok(Allowed::Net(Net { addr, prefix }));
    }
    let name = normalize_host(entry);
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    };
    if name.is_empty() || name.len() > 253 || !name.split('.').all(label_ok) {
        return Err(neither());
    }
    Ok(Allowed::Host(name))
}

fn network(addr: IpAddr, prefix: u8) -> IpAddr {
    match addr {
        IpAddr::V4(v4) => {
            let mask = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
            IpAddr::V4(Ipv4Addr::from(u32::from(v4) & mask))
        }
        IpAddr::V6(v6) => {
            let mask = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
            IpAddr::V6(Ipv6Addr::from(u128::from(v6) & mask))
        }
    }
}

/// Host names compare without case and without a final dot.
fn normalize_host(host: &str) -> String {
    host.trim_end_matches('.').to_ascii_lowercase()
}

/// The host of a URL the policy has looked at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Host {
    /// An address, written as one (including the numeric forms `inet_aton`
    /// reads, such as `2130706433` or `0x7f.1`).
    Ip(IpAddr),
    /// A host name, to be resolved.
    Name(String),
}

/// Which addresses the hub may connect to. The default allows private ones
/// (`[outbound] private = "allow"`) and nothing of the always-refused ranges.
#[derive(Debug, Clone, Default)]
pub struct Policy {
    deny_private: bool,
    nets: Vec<Net>,
    hosts: Vec<String>,
}

impl Policy {
    /// A policy refusing private addresses when `deny_private`, with the
    /// `allow` entries (CIDRs, addresses, host names) as exceptions. Every
    /// entry that does not parse is returned, by its index, with the reason.
    pub fn new(deny_private: bool, allow: &[String]) -> Result<Policy, Vec<(usize, String)>> {
        let mut policy = Policy {
            deny_private,
            ..Policy::default()
        };
        let mut problems = Vec::new();
        for (i, entry) in allow.iter().enumerate() {
            match parse_allowed(entry) {
                Ok(Allowed::Net(net)) => policy.nets.push(net),
                Ok(Allowed::Host(host)) => policy.hosts.push(host),
                Err(problem) => problems.push((i, problem)),
            }
        }
        if problems.is_empty() {
            Ok(policy)
        } else {
            Err(problems)
        }
    }

    /// Whether private addresses are refused.
    pub fn denies_private(&self) -> bool {
        self.deny_private
    }

    /// Whether `host` is allowed by name (then any address it resolves to is).
    pub fn allows_host(&self, host: &str) -> bool {
        if self.hosts.is_empty() {
            return false;
        }
        let host = normalize_host(host);
        self.hosts.contains(&host)
    }

    fn allows_net(&self, ip: IpAddr, special: &Special) -> bool {
        let ip = canonical(ip);
        self.nets.iter().any(|n| {
            n.contains(ip)
                || special
                    .embedded
                    .is_some_and(|(_, v4)| n.contains(IpAddr::V4(v4)))
        })
    }

    /// Checks an address the hub is about to connect to, written as one.
    pub fn check_ip(&self, ip: IpAddr) -> Result<(), Refused> {
        self.judge(ip).map_err(|special| {
            Refused(match special.embedded {
                Some((form, v4)) => format!(
                    "{ip} is the {form} form of {v4}, which is {}: {}",
                    special.what(),
                    special.rule()
                ),
                None => format!("{ip} is {}: {}", special.what(), special.rule()),
            })
        })
    }

    /// Checks an address `host` resolved to (an allowed host name allows all of them).
    pub fn check_resolved(&self, host: &str, ip: IpAddr) -> Result<(), Refused> {
        if self.allows_host(host) {
            return Ok(());
        }
        self.judge(ip).map_err(|special| {
            Refused(match special.embedded {
                Some((form, v4)) => format!(
                    "`{host}` resolves to {ip}, the {form} form of {v4}, which is {}: {}",
                    special.what(),
                    special.rule()
                ),
                None => format!(
                    "`{host}` resolves to {ip}, which is {}: {}",
                    special.what(),
                    special.rule()
                ),
            })
        })
    }

    /// `Err` with what `ip` is when the policy refuses it.
    fn judge(&self, ip: IpAddr) -> Result<(), Special> {
        let Some(special) = classify(ip) else {
            return Ok(());
        };
        if !special.always_refused() && !self.deny_private {
            return Ok(());
        }
        if self.allows_net(ip, &special) {
            return Ok(());
        }
        Err(special)
    }

    /// Checks what can be told from a request's URL alone: http or https,
    /// no user info, a host, and an IP-literal host against the policy
    /// (the connector does not resolve those, so [`Guard`] never sees them).
    pub fn check_uri(&self, uri: &Uri) -> Result<Host, Refused> {
        match uri.scheme_str() {
            Some("http" | "https") => {}
            Some(other) => {
                return Err(Refused(format!(
                    "only http and https URLs are allowed, not `{other}`"
                )));
            }
            None => return Err(Refused("the URL has no scheme (http or https)".to_owned())),
        }
        let authority = uri
            .authority()
            .ok_or_else(|| Refused("the URL has no host".to_owned()))?;
        if authority.as_str().contains('@') {
            return Err(Refused(
                "URLs with user info (`user@host`) are refused".to_owned(),
            ));
        }
        let host = authority
            .host()
            .trim_start_matches('[')
            .trim_end_matches(']');
        if host.is_empty() {
            return Err(Refused("the URL has no host".to_owned()));
        }
        match literal_ip(host) {
            Some(ip) => {
                self.check_ip(ip)?;
                Ok(Host::Ip(ip))
            }
            None => Ok(Host::Name(host.to_owned())),
        }
    }

    /// [`Policy::check_uri`] on a URL as written.
    pub fn check_url(&self, url: &str) -> Result<Host, Refused> {
        let uri: Uri = url
            .parse()
            .map_err(|e| Refused(format!("not a valid URL: {e}")))?;
        self.check_uri(&uri)
    }

    /// [`Policy::check_url`], then every address a host name resolves to
    /// within `timeout` (for registering a URL: any forbidden address
    /// refuses it). A name that does not resolve in time passes: it is
    /// checked again whenever the hub connects.
    pub async fn check_url_resolving(&self, url: &str, timeout: Duration) -> Result<(), Refused> {
        let Host::Name(host) = self.check_url(url)? else {
            return Ok(());
        };
        if self.allows_host(&host) {
            return Ok(());
        }
        let Ok(Ok(addrs)) = tokio::time::timeout(timeout, lookup(&host)).await else {
            return Ok(());
        };
        for addr in addrs {
            self.check_resolved(&host, addr.ip())?;
        }
        Ok(())
    }

    /// Resolves `host` and keeps the addresses the policy allows; when it
    /// allows none of them, the refusal of the first.
    pub async fn resolve(&self, host: &str) -> Result<Vec<SocketAddr>, ResolveError> {
        let addrs = lookup(host).await.map_err(ResolveError::Lookup)?;
        let mut first_refusal = None;
        let mut allowed = Vec::with_capacity(addrs.len());
        for addr in addrs {
            match self.check_resolved(host, addr.ip()) {
                Ok(()) => allowed.push(addr),
                Err(refused) => {
                    first_refusal.get_or_insert(refused);
                }
            }
        }
        match (allowed.is_empty(), first_refusal) {
            (true, Some(refused)) => Err(ResolveError::Refused(refused)),
            (true, None) => Err(ResolveError::Lookup(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!("`{host}` resolves to no address"),
            ))),
            (false, _) => Ok(allowed),
        }
    }
}

/// `::ffff:a.b.c.d` is compared with IPv4 CIDRs as `a.b.c.d`.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

async fn lookup(host: &str) -> std::io::Result<Vec<SocketAddr>> {
    Ok(tokio::net::lookup_host((host, 0)).await?.collect())
}

/// An IP literal: what `IpAddr` parses, and the numeric IPv4 forms
/// `inet_aton` (and so `getaddrinfo`) accepts: `2130706433`, `0x7f.1`,
/// `0177.0.0.1`, `127.1`.
pub fn literal_ip(host: &str) -> Option<IpAddr> {
    if let Ok(ip) = host.parse() {
        return Some(ip);
    }
    inet_aton(host).map(IpAddr::V4)
}

fn inet_aton(host: &str) -> Option<Ipv4Addr> {
    let parts: Vec<&str> = host.split('.').collect();
    if parts.is_empty() || parts.len() > 4 {
        return None;
    }
    let mut values = Vec::with_capacity(parts.len());
    for part in &parts {
        let (digits, radix) =
            if let Some(hex) = part.strip_prefix("0x").or_else(|| part.strip_prefix("0X")) {
                (hex, 16)
            } else if part.len() > 1 && part.starts_with('0') {
                (&part[1..], 8)
            } else {
                (*part, 10)
            };
        if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
            return None;
        }
        values.push(u64::from_str_radix(digits, radix).ok()?);
    }
    let (last, first) = values.split_last()?;
    if first.iter().any(|v| *v > 255) {
        return None;
    }
    let last_bits = 8 * (4 - first.len() as u32);
    if *last >= 1u64 << last_bits {
        return None;
    }
    let mut addr: u64 = 0;
    for (i, v) in first.iter().enumerate() {
        addr |= v << (24 - 8 * i as u32);
    }
    u32::try_from(addr | last).ok().map(Ipv4Addr::from)
}

/// Why a host name gave no address to connect to.
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    #[error("{0}")]
    Refused(Refused),
    #[error("cannot resolve: {0}")]
    Lookup(std::io::Error),
}

impl ResolveError {
    /// The policy's refusal, found in an error's chain (the client wraps the
    /// resolver's error in its own).
    pub fn refusal_in<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a Refused> {
        let mut next = Some(e);
        while let Some(e) = next {
            if let Some(ResolveError::Refused(r)) = e.downcast_ref::<ResolveError>() {
                return Some(r);
            }
            if let Some(r) = e.downcast_ref::<Refused>() {
                return Some(r);
            }
            next = e.source();
        }
        None
    }
}

/// The HTTP connector's resolver: `tokio`'s `getaddrinfo`, with the
/// addresses the policy refuses left out (and the request refused when
/// none is left).
#[derive(Clone)]
pub struct Guard {
    policy: Arc<Policy>,
}

impl Guard {
    pub fn new(policy: Arc<Policy>) -> Guard {
        Guard { policy }
    }
}

impl tower_service::Service<Name> for Guard {
    type Response = std::vec::IntoIter<SocketAddr>;
    type Error = ResolveError;
    type Future =
        Pin<Box<dyn Future<Output = Result<std::vec::IntoIter<SocketAddr>, ResolveError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), ResolveError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, name: Name) -> Self::Future {
        let policy = self.policy.clone();
        Box::pin(async move { Ok(policy.resolve(name.as_str()).await?.into_iter()) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        literal_ip(s).unwrap_or_else(|| panic!("{s} is not an address"))
    }

    fn open() -> Policy {
        Policy::default()
    }

    fn strict() -> Policy {
        Policy::new(true, &[]).expect("no entries")
    }

    fn allowing(deny_private: bool, entries: &[&str]) -> Policy {
        let entries: Vec<String> = entries.iter().map(|e| (*e).to_owned()).collect();
        Policy::new(deny_private, &entries).expect("entries parse")
    }

    fn refusal(policy: &Policy, address: &str) -> Option<String> {
        policy.check_ip(ip(address)).err().map(|r| r.to_string())
    }

    fn url_refusal(policy: &Policy, url: &str) -> Option<String> {
        policy.check_url(url).err().map(|r| r.to_string())
    }

    const ALWAYS: &str = "refused unless `[outbound] allow` lists it";
    const PRIVATE: &str = "refused by `[outbound] private = \"deny\"`";

    #[test]
    fn always_refused_ranges_are_refused_under_both_settings() {
        let cases = [
            (
                "169.254.169.254",
                "169.254.169.254 is link-local (cloud metadata)",
            ),
            ("169.254.1.1", "169.254.1.1 is link-local"),
            ("0.0.0.0", "0.0.0.0 is unspecified"),
            ("0.1.2.3", "0.1.2.3 is unspecified"),
            ("::", ":: is unspecified"),
            ("224.0.0.1", "224.0.0.1 is multicast"),
            ("ff02::1", "ff02::1 is multicast"),
            (
                "255.255.255.255",
                "255.255.255.255 is the broadcast address",
            ),
            ("fe80::1", "fe80::1 is link-local"),
            (
                "fd00:ec2::254",
                "fd00:ec2::254 is unique local (cloud metadata)",
            ),
            (
                "100.100.100.200",
                "100.100.100.200 is CGNAT shared address space (cloud metadata)",
            ),
            (
                "::ffff:169.254.169.254",
                "::ffff:169.254.169.254 is the IPv4-mapped form of 169.254.169.254, \
                 which is link-local (cloud metadata)",
            ),
            (
                "2002:a9fe:a9fe::",
                "2002:a9fe:a9fe:: is the 6to4 form of 169.254.169.254, \
                 which is link-local (cloud metadata)",
            ),
            (
                "64:ff9b::a9fe:a9fe",
                "64:ff9b::a9fe:a9fe is the NAT64 form of 169.254.169.254, \
                 which is link-local (cloud metadata)",
            ),
            (
                "::169.254.169.254",
                "::a9fe:a9fe is the IPv4-compatible form of 169.254.169.254, \
                 which is link-local (cloud metadata)",
            ),
            (
                "64:ff9b:1::a9fe:a9fe",
                "64:ff9b:1::a9fe:a9fe is the NAT64 form of 169.254.169.254, \
                 which is link-local (cloud metadata)",
            ),
            (
                "2001:0:4136:e378:8000:63bf:5601:5601",
                "2001:0:4136:e378:8000:63bf:5601:5601 is the Teredo form of 169.254.169.254, \
                 which is link-local (cloud metadata)",
            ),
        ];
        for policy in [open(), strict()] {
            for (address, text) in cases {
                assert_eq!(
                    refusal(&policy, address),
                    Some(format!("{text}: {ALWAYS}")),
                    "{address}, private denied: {}",
                    policy.denies_private()
                );
            }
        }
    }

    #[test]
    fn private_ranges_follow_the_private_setting() {
        let cases = [
            ("127.0.0.1", "127.0.0.1 is loopback"),
            ("127.8.9.10", "127.8.9.10 is loopback"),
            ("::1", "::1 is loopback"),
            ("10.0.0.1", "10.0.0.1 is private (RFC 1918)"),
            ("172.16.5.4", "172.16.5.4 is private (RFC 1918)"),
            ("192.168.1.1", "192.168.1.1 is private (RFC 1918)"),
            (
                "100.64.0.1",
                "100.64.0.1 is CGNAT shared address space (100.64.0.0/10)",
            ),
            ("fd00::1", "fd00::1 is unique local (fc00::/7)"),
            ("fc00::1", "fc00::1 is unique local (fc00::/7)"),
            ("fec0::1", "fec0::1 is site-local (fec0::/10)"),
            (
                "::ffff:127.0.0.1",
                "::ffff:127.0.0.1 is the IPv4-mapped form of 127.0.0.1, which is loopback",
            ),
            (
                "::ffff:10.0.0.1",
                "::ffff:10.0.0.1 is the IPv4-mapped form of 10.0.0.1, \
                 which is private (RFC 1918)",
            ),
            (
                "::10.0.0.1",
                "::a00:1 is the IPv4-compatible form of 10.0.0.1, \
                 which is private (RFC 1918)",
            ),
            (
                "2002:7f00:1::",
                "2002:7f00:1:: is the 6to4 form of 127.0.0.1, which is loopback",
            ),
            (
                "2002:a00:1::",
                "2002:a00:1:: is the 6to4 form of 10.0.0.1, which is private (RFC 1918)",
            ),
            (
                "64:ff9b::a00:1",
                "64:ff9b::a00:1 is the NAT64 form of 10.0.0.1, which is private (RFC 1918)",
            ),
            (
                "64:ff9b::6440:1",
                "64:ff9b::6440:1 is the NAT64 form of 100.64.0.1, \
                 which is CGNAT shared address space (100.64.0.0/10)",
            ),
            // inet_aton's forms of 127.0.0.1, as getaddrinfo reads them.
            ("2130706433", "127.0.0.1 is loopback"),
            ("0x7f.1", "127.0.0.1 is loopback"),
            ("0177.0.0.1", "127.0.0.1 is loopback"),
            ("127.1", "127.0.0.1 is loopback"),
        ];
        for (address, text) in cases {
            assert_eq!(
                refusal(&open(), address),
                None,
                "{address} with private allowed"
            );
            assert_eq!(
                refusal(&strict(), address),
                Some(format!("{text}: {PRIVATE}")),
                "{address} with private denied"
            );
        }
    }

    #[test]
    fn public_addresses_pass_under_both_settings() {
        for address in [
            "93.184.216.34",
            "8.8.8.8",
            "100.128.0.1",
            "172.32.0.1",
            "2606:2800:220:1::1",
            "::ffff:8.8.8.8",
            "2002:808:808::1",
            "64:ff9b::808:808",
        ] {
            assert_eq!(refusal(&open(), address), None, "{address}");
            assert_eq!(refusal(&strict(), address), None, "{address}");
        }
    }

    #[test]
    fn allow_entries_override_both_rules() {
        let policy = allowing(
            true,
            &[
                "10.1.0.0/16",
                "169.254.169.254",
                "fd00::/8",
                "Metadata.Internal.",
                "::1",
            ],
        );
        assert_eq!(refusal(&policy, "10.1.2.3"), None);
        assert_eq!(
            refusal(&policy, "::ffff:10.1.2.3"),
            None,
            "mapped form of an allowed one"
        );
        assert_eq!(
            refusal(&policy, "64:ff9b::a01:203"),
            None,
            "NAT64 form of an allowed one"
        );
        assert!(refusal(&policy, "10.2.0.1").is_some());
        assert_eq!(refusal(&policy, "169.254.169.254"), None);
        assert!(refusal(&policy, "169.254.169.253").is_some());
        assert_eq!(refusal(&policy, "fd00::1"), None);
        assert_eq!(
            refusal(&policy, "fd00:ec2::254"),
            None,
            "inside an allowed CIDR"
        );
        assert_eq!(refusal(&policy, "::1"), None);
        assert!(refusal(&policy, "127.0.0.1").is_some());
        // A host name allowed allows whatever it resolves to, always refused ranges too.
        for address in ["127.0.0.1", "169.254.169.254", "0.0.0.0"] {
            assert_eq!(
                policy.check_resolved("metadata.internal", ip(address)),
                Ok(())
            );
        }
        assert_eq!(
            policy
                .check_resolved("other.internal", ip("127.0.0.1"))
                .map_err(|r| r.to_string()),
            Err(format!(
                "`other.internal` resolves to 127.0.0.1, which is loopback: {PRIVATE}"
            ))
        );
        // With private allowed, only the always-refused ranges need an entry.
        let policy = allowing(false, &["169.254.0.0/16"]);
        assert_eq!(refusal(&policy, "169.254.169.254"), None);
        assert_eq!(refusal(&policy, "10.0.0.1"), None);
        assert!(refusal(&policy, "224.0.0.1").is_some());
    }

    #[test]
    fn allow_entries_that_do_not_parse_are_named_by_index() {
        let entries: Vec<String> = [
            "10.0.0.0/8",
            "example.com",
            "10.0.0.0/33",
            "10.0.0.1/8",
            "http://x",
            "fd00::/129",
            "",
            "a..b",
        ]
        .iter()
        .map(|e| (*e).to_owned())
        .collect();
        let problems = Policy::new(false, &entries).expect_err("bad entries");
        assert_eq!(
            problems,
            vec![
                (2, "`10.0.0.0/33`: the prefix length must be 0 to 32".to_owned()),
                (
                    3,
                    "`10.0.0.1/8` has bits set past the prefix; did you mean 10.0.0.0/8?"
                        .to_owned()
                ),
                (
                    4,
                    "`http://x` is neither a CIDR (10.0.0.0/8, fd00::/8), an address nor a host name"
                        .to_owned()
                ),
                (5, "`fd00::/129`: the prefix length must be 0 to 128".to_owned()),
                (
                    6,
                    "`` is neither a CIDR (10.0.0.0/8, fd00::/8), an address nor a host name"
                        .to_owned()
                ),
                (
                    7,
                    "`a..b` is neither a CIDR (10.0.0.0/8, fd00::/8), an address nor a host name"
                        .to_owned()
                ),
            ]
        );
        assert!(Policy::new(false, &["0.0.0.0/0".to_owned(), "::/0".to_owned()]).is_ok());
    }

    #[test]
    fn urls_are_checked_for_scheme_user_info_and_literal_hosts() {
        for policy in [open(), strict()] {
            assert_eq!(
                url_refusal(&policy, "http://169.254.169.254/latest/meta-data"),
                Some(format!(
                    "169.254.169.254 is link-local (cloud metadata): {ALWAYS}"
                ))
            );
            assert_eq!(
                url_refusal(&policy, "http://evil@127.0.0.1/"),
                Some("URLs with user info (`user@host`) are refused".to_owned())
            );
            assert_eq!(
                url_refusal(&policy, "https://u:p@example.com/"),
                Some("URLs with user info (`user@host`) are refused".to_owned())
            );
            assert_eq!(
                url_refusal(&policy, "ftp://example.com/x"),
                Some("only http and https URLs are allowed, not `ftp`".to_owned())
            );
            assert_eq!(
                url_refusal(&policy, "http://[::ffff:169.254.169.254]/"),
                Some(format!(
                    "::ffff:169.254.169.254 is the IPv4-mapped form of 169.254.169.254, \
                     which is link-local (cloud metadata): {ALWAYS}"
                ))
            );
            assert_eq!(
                policy.check_url("https://example.com:8443/x"),
                Ok(Host::Name("example.com".to_owned()))
            );
        }
        let open = open();
        let strict = strict();
        for url in [
            "http://127.0.0.1:9/x",
            "http://10.0.0.1/",
            "http://[::1]:8080/",
            "http://2130706433/",
            "http://0x7f000001/",
            "http://[fd00::1]/",
            "http://100.64.0.1/",
        ] {
            assert!(open.check_url(url).is_ok(), "{url} with private allowed");
            assert!(
                url_refusal(&strict, url).is_some_and(|r| r.ends_with(PRIVATE)),
                "{url} with private denied"
            );
        }
        assert_eq!(
            url_refusal(&strict, "http://[::1]:8080/"),
            Some(format!("::1 is loopback: {PRIVATE}"))
        );
        assert_eq!(
            url_refusal(&strict, "http://2130706433/"),
            Some(format!("127.0.0.1 is loopback: {PRIVATE}"))
        );
    }

    #[test]
    fn inet_aton_forms_are_read_as_getaddrinfo_reads_them() {
        let v4 = |s: &str| inet_aton(s).map(|a| a.to_string());
        assert_eq!(v4("2130706433").as_deref(), Some("127.0.0.1"));
        assert_eq!(v4("0x7f000001").as_deref(), Some("127.0.0.1"));
        assert_eq!(v4("0x7f.1").as_deref(), Some("127.0.0.1"));
        assert_eq!(v4("127.0.1").as_deref(), Some("127.0.0.1"));
        assert_eq!(
            v4("0251.0376.0251.0376").as_deref(),
            Some("169.254.169.254")
        );
        assert_eq!(v4("10.1").as_deref(), Some("10.0.0.1"));
        assert_eq!(v4("0").as_deref(), Some("0.0.0.0"));
        for not in [
            "",
            "example.com",
            "1.2.3.4.5",
            "256.1.1.1",
            "1.2.3.256",
            "08",
            "0x",
            "1e3",
        ] {
            assert_eq!(v4(not), None, "{not}");
        }
        assert_eq!(v4("4294967296"), None, "past 32 bits");
    }

    #[tokio::test]
    async fn host_names_are_judged_by_what_they_resolve_to() {
        let strict = strict();
        let err = strict.resolve("localhost").await.expect_err("loopback");
        let text = err.to_string();
        assert!(
            text.starts_with("`localhost` resolves to ") && text.ends_with(PRIVATE),
            "{text}"
        );
        assert!(matches!(err, ResolveError::Refused(_)));
        assert!(open().resolve("localhost").await.is_ok());
        let allowed = allowing(true, &["LOCALHOST"]);
        assert!(allowed.resolve("localhost").await.is_ok());
        // Registration: a name that resolves to a forbidden address is refused;
        // numeric forms are literals, refused without a lookup.
        let err = strict
            .check_url_resolving("http://localhost:9/x", Duration::from_secs(2))
            .await
            .expect_err("loopback");
        assert!(err.to_string().contains("is loopback"), "{err}");
        assert!(
            open()
                .check_url_resolving("http://localhost:9/x", Duration::from_secs(2))
                .await
                .is_ok()
        );
        let err = open()
            .check_url_resolving("http://0xa9fea9fe/", Duration::from_secs(2))
            .await
            .expect_err("metadata");
        assert_eq!(
            err.to_string(),
            format!("169.254.169.254 is link-local (cloud metadata): {ALWAYS}")
        );
    }

    #[test]
    fn a_refusal_is_found_in_an_error_chain() {
        #[derive(Debug, thiserror::Error)]
        #[error("connect failed")]
        struct Outer(#[source] Box<dyn std::error::Error + Send + Sync>);
        let inner = ResolveError::Refused(Refused("nope".to_owned()));
        let outer = Outer(Box::new(inner));
        assert_eq!(
            ResolveError::refusal_in(&outer).map(Refused::reason),
            Some("nope")
        );
        let other = Outer(Box::new(std::io::Error::other("x")));
        assert_eq!(ResolveError::refusal_in(&other), None);
    }
}
