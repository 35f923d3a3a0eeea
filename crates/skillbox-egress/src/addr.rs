//! The addresses the proxy never connects to: non-public ranges ([`forbidden`]), and
//! the addresses of this host's own interfaces ([`own_address`]), where a service bound
//! to 0.0.0.0 on the host would answer.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Why the proxy refuses to connect to `ip`, or `None` when it may. Whatever name
/// resolved to it: an allowed name that resolves to a private address is refused.
pub fn forbidden(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => forbidden_v4(v4),
        IpAddr::V6(v6) => forbidden_v6(v6),
    }
}

fn forbidden_v4(ip: Ipv4Addr) -> Option<&'static str> {
    let [a, b, c, _] = ip.octets();
    let why = match (a, b) {
        _ if ip.is_unspecified() || a == 0 => "an unspecified or 'this network' address",
        _ if ip.is_loopback() => "a loopback address",
        (10, _) | (172, 16..=31) | (192, 168) => "a private address",
        (169, 254) => "a link-local address (cloud metadata lives there)",
        (100, 64..=127) => "a carrier-grade NAT address",
        (198, 18..=19) => "a benchmarking network address",
        (192, 0) if c == 0 => "an IETF protocol assignment address",
        _ if ip.is_multicast() => "a multicast address",
        _ if ip.is_broadcast() || a >= 240 => "a reserved address",
        _ => return None,
    };
    Some(why)
}

fn forbidden_v6(ip: Ipv6Addr) -> Option<&'static str> {
    // An IPv4 address in IPv6 clothing is judged as the IPv4 address.
    if let Some(v4) = ip.to_ipv4_mapped() {
        return forbidden_v4(v4);
    }
    let s = ip.segments();
    let why = match s[0] {
        _ if ip.is_unspecified() => "an unspecified address",
        _ if ip.is_loopback() => "a loopback address",
        0xfc00..=0xfdff => "a unique local (private) address",
        0xfe80..=0xfebf => "a link-local address",
        0xfec0..=0xfeff => "a site-local address",
        0xff00..=0xffff => "a multicast address",
        // NAT64 (64:ff9b::/96): the IPv4 address it carries decides.
        0x0064 if s[1] == 0xff9b && s[2..6] == [0, 0, 0, 0] => {
            let v4 = Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8);
            return forbidden_v4(v4);
        }
        // Local-use NAT64 (64:ff9b:1::/48, RFC 8215): a translator of the host's own
        // network, whose prefix length (and so where the IPv4 address sits) is its own.
        0x0064 if s[1] == 0xff9b && s[2] == 1 => "a local-use NAT64 address",
        // 6to4 (2002::/16): the IPv4 address it carries decides.
        0x2002 => {
            let v4 = Ipv4Addr::new((s[1] >> 8) as u8, s[1] as u8, (s[2] >> 8) as u8, s[2] as u8);
            return forbidden_v4(v4);
        }
        // IPv4-compatible (::a.b.c.d, deprecated) and other addresses in ::/8.
        0x0000 => "a reserved address",
        _ => return None,
    };
    Some(why)
}

/// How long a read of the host's addresses is used before it is read again: an address
/// assigned since is refused from the next read on.
const HOST_ADDRESSES_FRESH: Duration = Duration::from_secs(1);

/// Why the proxy refuses to connect to `ip` because it is this host's own (one of its
/// interfaces' addresses, in whatever IPv6 clothing), or `None` when it is not. When the
/// host's addresses cannot be read, every address is refused: an address not judged is
/// never connected to.
pub fn own_address(ip: IpAddr) -> Option<String> {
    static CACHE: Mutex<Option<(Instant, Arc<[IpAddr]>)>> = Mutex::new(None);
    let read = || -> io::Result<Arc<[IpAddr]>> {
        let mut cache = CACHE.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((at, addresses)) = cache.as_ref()
            && at.elapsed() < HOST_ADDRESSES_FRESH
        {
            return Ok(addresses.clone());
        }
        let addresses: Arc<[IpAddr]> = host_addresses()?.into();
        *cache = Some((Instant::now(), addresses.clone()));
        Ok(addresses)
    };
    match read() {
        Ok(addresses) => is_own(ip, &addresses).then(|| "one of this host's own addresses".into()),
        Err(e) => Some(format!(
            "not judged: this host's own addresses cannot be read ({e})"
        )),
    }
}

/// Whether `ip` is one of `own` (each compared as the IPv4 address it carries, if any).
pub(crate) fn is_own(ip: IpAddr, own: &[IpAddr]) -> bool {
    let ip = canonical(ip);
    own.iter().any(|o| canonical(*o) == ip)
}

/// An IPv4-mapped, NAT64 (64:ff9b::/96) or 6to4 address as the IPv4 address it reaches.
fn canonical(ip: IpAddr) -> IpAddr {
    let IpAddr::V6(v6) = ip else {
        return ip;
    };
    if let Some(v4) = v6.to_ipv4_mapped() {
        return IpAddr::V4(v4);
    }
    let s = v6.segments();
    let v4 = |hi: u16, lo: u16| {
        IpAddr::V4(Ipv4Addr::new(
            (hi >> 8) as u8,
            hi as u8,
            (lo >> 8) as u8,
            lo as u8,
        ))
    };
    match s[0] {
        0x0064 if s[1] == 0xff9b && s[2..6] == [0, 0, 0, 0] => v4(s[6], s[7]),
        0x2002 => v4(s[1], s[2]),
        _ => ip,
    }
}

/// The addresses assigned to this host's interfaces now (getifaddrs: those of the
/// network namespace the proxy connects from).
fn host_addresses() -> io::Result<Vec<IpAddr>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `head` with a list that is freed below, once.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let mut addresses = Vec::new();
    let mut cursor = head;
    while !cursor.is_null() {
        // SAFETY: `cursor` is a node of the list getifaddrs made, not yet freed.
        let entry = unsafe { &*cursor };
        if !entry.ifa_addr.is_null() {
            // SAFETY: `ifa_addr` points at a sockaddr at least as long as its family.
            let family = i32::from(unsafe { (*entry.ifa_addr).sa_family });
            if family == libc::AF_INET {
                // SAFETY: an AF_INET address is a sockaddr_in.
                let v4 = unsafe { &*entry.ifa_addr.cast::<libc::sockaddr_in>() };
                addresses.push(IpAddr::V4(Ipv4Addr::from(u32::from_be(v4.sin_addr.s_addr))));
            } else if family == libc::AF_INET6 {
                // SAFETY: an AF_INET6 address is a sockaddr_in6.
                let v6 = unsafe { &*entry.ifa_addr.cast::<libc::sockaddr_in6>() };
                addresses.push(IpAddr::V6(Ipv6Addr::from(v6.sin6_addr.s6_addr)));
            }
        }
        cursor = entry.ifa_next;
    }
    // SAFETY: `head` came from getifaddrs and is freed once; no reference into it is
    // left.
    unsafe { libc::freeifaddrs(head) };
    Ok(addresses)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hosts_own_addresses_are_refused_in_every_form() {
        let own: Vec<IpAddr> = ["198.51.100.20", "2001:db8::20", "127.0.0.1"]
            .iter()
            .map(|a| a.parse().unwrap())
            .collect();
        for refused in [
            "198.51.100.20",
            "::ffff:198.51.100.20",
            "64:ff9b::c633:6414",
            "2002:c633:6414::1",
            "2001:db8::20",
        ] {
            assert!(is_own(refused.parse().unwrap(), &own), "{refused}");
        }
        for fine in [
            "198.51.100.21",
            "203.0.113.7",
            "2001:db8::21",
            "::ffff:203.0.113.7",
        ] {
            assert!(!is_own(fine.parse().unwrap(), &own), "{fine}");
        }
        assert!(!is_own("198.51.100.20".parse().unwrap(), &[]));
    }

    #[test]
    fn this_hosts_loopback_is_among_its_own_addresses() {
        // Every network namespace has lo: a read that finds nothing is a broken read.
        let read = host_addresses().unwrap();
        assert!(read.contains(&IpAddr::V4(Ipv4Addr::LOCALHOST)), "{read:?}");
        assert!(own_address(IpAddr::V4(Ipv4Addr::LOCALHOST)).is_some());
        assert!(own_address("192.0.2.123".parse().unwrap()).is_none());
    }

    #[test]
    fn what_is_refused_and_what_is_not() {
        for refused in [
            "127.0.0.1",
            "127.9.9.9",
            "0.0.0.0",
            "0.1.2.3",
            "10.1.2.3",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "100.127.255.255",
            "198.18.0.1",
            "192.0.0.1",
            "224.0.0.1",
            "255.255.255.255",
            "240.0.0.1",
            "::1",
            "::",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            "::ffff:169.254.169.254",
            "64:ff9b::a9fe:a9fe",
            "64:ff9b::7f00:1",
            "fd00::1",
            "fc00::1",
            "fe80::1",
            "fec0::1",
            "ff02::1",
            "::127.0.0.1",
            "64:ff9b:1::7f00:1",
            "64:ff9b:1:0:0:1:a00:1",
            "2002:7f00:1::",
            "2002:a9fe:a9fe::1",
            "2002:c0a8:101::",
        ] {
            let ip: IpAddr = refused.parse().unwrap_or_else(|e| panic!("{refused}: {e}"));
            assert!(forbidden(ip).is_some(), "{refused} should be refused");
        }
        for allowed in [
            "93.184.216.34",
            "1.1.1.1",
            "172.32.0.1",
            "172.15.255.255",
            "100.63.255.255",
            "100.128.0.1",
            "203.0.113.7",
            "2606:4700::1111",
            "64:ff9b::5db8:d822",
            "::ffff:93.184.216.34",
            "2002:5db8:d822::1",
        ] {
            let ip: IpAddr = allowed.parse().unwrap_or_else(|e| panic!("{allowed}: {e}"));
            assert_eq!(forbidden(ip), None, "{allowed} should be allowed");
        }
    }
}
