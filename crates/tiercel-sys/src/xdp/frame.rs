//! Ethernet frames carrying UDP over IPv4: a header template made once for a peer, and frames
//! read with every length checked. Nothing here is unsafe.

use std::net::{Ipv4Addr, SocketAddrV4};

/// Bytes of the Ethernet, IPv4 (without options) and UDP headers.
pub const HEADERS: usize = 14 + 20 + 8;

const ETHERTYPE_IPV4: [u8; 2] = [0x08, 0x00];
const UDP: u8 = 17;

/// A hardware address from its text (`fa:5c:87:fb:ee:c6`).
pub fn parse_mac(text: &str) -> Option<[u8; 6]> {
    let mut mac = [0u8; 6];
    let mut parts = text.split(':');
    for byte in &mut mac {
        let part = parts.next()?;
        if part.len() != 2 {
            return None;
        }
        *byte = u8::from_str_radix(part, 16).ok()?;
    }
    parts.next().is_none().then_some(mac)
}

/// The headers of the datagrams from one address to another: made once, then stamped with each
/// datagram's length.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    headers: [u8; HEADERS],
    /// The ones'-complement sum of the IPv4 header's words but its length (and checksum), unfolded:
    /// a datagram's checksum is this plus its length, folded.
    partial: u32,
}

impl Template {
    /// Headers from `from` (at hardware address `from_mac`) to `to` (at `to_mac`).
    pub fn new(from_mac: [u8; 6], from: SocketAddrV4, to_mac: [u8; 6], to: SocketAddrV4) -> Template {
        let mut h = [0u8; HEADERS];
        h[0..6].copy_from_slice(&to_mac);
        h[6..12].copy_from_slice(&from_mac);
        h[12..14].copy_from_slice(&ETHERTYPE_IPV4);
        h[14] = 0x45; // version 4, five words of header
        h[20] = 0x40; // don't fragment
        h[22] = 64; // time to live
        h[23] = UDP;
        h[26..30].copy_from_slice(&from.ip().octets());
        h[30..34].copy_from_slice(&to.ip().octets());
        h[34..36].copy_from_slice(&from.port().to_be_bytes());
        h[36..38].copy_from_slice(&to.port().to_be_bytes());
        Template { headers: h, partial: sum_words(&h[14..34]) }
    }

    /// The headers of a datagram of `payload_len` bytes, to send before its payload. `None` for a
    /// payload too long for one IPv4 packet.
    pub fn headers(&self, payload_len: usize) -> Option<[u8; HEADERS]> {
        let ip_len = u16::try_from(20 + 8 + payload_len).ok()?;
        let mut h = self.headers;
        h[16..18].copy_from_slice(&ip_len.to_be_bytes());
        let checksum = !fold(self.partial + u32::from(ip_len));
        h[24..26].copy_from_slice(&checksum.to_be_bytes());
        h[38..40].copy_from_slice(&(ip_len - 20).to_be_bytes());
        Some(h)
    }

    /// Writes the frame of a datagram of `payload` into `out` (cleared first). UDP's checksum is
    /// left zero (none, which IPv4 allows); IPv4's is computed. `None` for a payload too long for
    /// one IPv4 packet.
    pub fn frame(&self, payload: &[u8], out: &mut Vec<u8>) -> Option<()> {
        let headers = self.headers(payload.len())?;
        out.clear();
        out.extend_from_slice(&headers);
        out.extend_from_slice(payload);
        Some(())
    }
}

/// The Internet checksum of an IPv4 header whose checksum field is zero.
fn ipv4_checksum(header: &[u8]) -> u16 {
    !fold(sum_words(header))
}

/// The sum of the 16-bit words of `bytes` (an IPv4 header: ten of them), unfolded.
fn sum_words(bytes: &[u8]) -> u32 {
    bytes.chunks(2).map(|w| u32::from(u16::from_be_bytes([w[0], w[1]]))).sum()
}

/// A sum of 16-bit words folded into 16 bits, ones'-complement.
fn fold(mut sum: u32) -> u16 {
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum as u16
}

/// A UDP datagram over IPv4 read from a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Datagram<'a> {
    /// The sender's hardware address.
    pub from_mac: [u8; 6],
    /// The sender.
    pub from: SocketAddrV4,
    /// Where it was sent.
    pub to: SocketAddrV4,
    /// The UDP payload, as long as UDP's length says.
    pub payload: &'a [u8],
}

/// The UDP datagram in `frame`; `None` for anything else (another protocol, IPv4 options, a
/// fragment, a bad IPv4 checksum, lengths that do not agree with the frame's).
pub fn parse(frame: &[u8]) -> Option<Datagram<'_>> {
    if frame.len() < HEADERS || frame[12..14] != ETHERTYPE_IPV4 || frame[14] != 0x45 || frame[23] != UDP {
        return None;
    }
    let ip = &frame[14..34];
    if ip[6] & 0x3f != 0 || ip[7] != 0 || ipv4_checksum(ip) != 0 {
        return None;
    }
    let ip_len = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
    let udp_len = usize::from(u16::from_be_bytes([frame[38], frame[39]]));
    if ip_len < 28 || 14 + ip_len > frame.len() || udp_len != ip_len - 20 {
        return None;
    }
    let addr = |at: usize, port: usize| {
        let ip = Ipv4Addr::new(frame[at], frame[at + 1], frame[at + 2], frame[at + 3]);
        SocketAddrV4::new(ip, u16::from_be_bytes([frame[port], frame[port + 1]]))
    };
    let mut from_mac = [0u8; 6];
    from_mac.copy_from_slice(&frame[6..12]);
    Some(Datagram { from_mac, from: addr(26, 34), to: addr(30, 36), payload: &frame[HEADERS..14 + ip_len] })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_made_from_the_template_reads_back_and_any_change_to_its_ip_header_is_refused() {
        let (a, b) = ("10.0.0.1:5000".parse().unwrap(), "10.0.0.2:7000".parse().unwrap());
        let t = Template::new([1; 6], a, [2; 6], b);
        let mut f = Vec::new();
        t.frame(b"hello", &mut f).unwrap();
        assert_eq!(f.len(), HEADERS + 5);
        let d = parse(&f).unwrap();
        assert_eq!((d.from_mac, d.from, d.to, d.payload), ([1; 6], a, b, &b"hello"[..]));
        // Padding after the datagram (short frames are padded on the wire) is not payload.
        let mut padded = f.clone();
        padded.extend_from_slice(&[0; 20]);
        assert_eq!(parse(&padded).unwrap().payload, b"hello");
        for at in 14..34 {
            let mut bad = f.clone();
            bad[at] ^= 0x10;
            assert_eq!(parse(&bad), None, "byte {at} of the IPv4 header changed");
        }
        assert_eq!(parse(&f[..HEADERS + 4]), None, "cut short");
        assert_eq!(parse(&f[..HEADERS - 1]), None);
        assert!(t.frame(&vec![0; 70_000], &mut f).is_none());
        // The checksum made from the template's sum is the one the header's words give, at every
        // length (the carries folded).
        for len in [0, 1, 2, 255, 256, 1472, 3584, 65_507] {
            t.frame(&vec![0xff; len], &mut f).unwrap();
            assert_eq!(parse(&f).map(|d| d.payload.len()), Some(len), "payload of {len} bytes");
        }
        let far = Template::new([0xff; 6], "255.255.255.254:65535".parse().unwrap(), [0xff; 6], b);
        far.frame(b"x", &mut f).unwrap();
        assert!(parse(&f).is_some());
    }

    #[test]
    fn hardware_addresses_parse_only_whole() {
        assert_eq!(parse_mac("fa:5c:87:fb:ee:c6"), Some([0xfa, 0x5c, 0x87, 0xfb, 0xee, 0xc6]));
        for bad in ["fa:5c:87:fb:ee", "fa:5c:87:fb:ee:c6:00", "fa:5c:87:fb:ee:c", "zz:5c:87:fb:ee:c6", ""] {
            assert_eq!(parse_mac(bad), None, "{bad}");
        }
    }
}
