//! The addresses the proxy never connects to.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

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

#[cfg(test)]
mod tests {
    use super::*;

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
