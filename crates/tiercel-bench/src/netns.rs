//! Two network namespaces joined by a veth pair, created for a test or a soak and removed on drop.
//! Addresses come from TEST-NET-1 (192.0.2.0/24) and exist only inside the two namespaces.

use std::process::Command;

/// Address of the server's end.
pub const SERVER_IP: &str = "192.0.2.2";
/// Address of the client's end.
pub const CLIENT_IP: &str = "192.0.2.1";

fn run(program: &str, args: &[&str]) -> crate::Result<()> {
    let out = Command::new(program).args(args).output().map_err(|e| format!("{program}: {e}"))?;
    if !out.status.success() {
        return Err(format!("{program} {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()).into());
    }
    Ok(())
}

/// Client namespace `a`, server namespace `b`, and the ends of the veth pair in each.
pub struct Pair {
    pub a: String,
    pub b: String,
    pub va: String,
    pub vb: String,
}

impl Pair {
    /// Creates the pair; `loss_percent` of UDP packets to and from `port` in the server namespace are
    /// dropped at random by nftables.
    pub fn new(port: u16, loss_percent: f64) -> crate::Result<Pair> {
        let id = std::process::id();
        let (va, vb) = (format!("tsa{id}"), format!("tsb{id}"));
        let pair = Pair { a: format!("tcsA{id}"), b: format!("tcsB{id}"), va: va.clone(), vb: vb.clone() };
        run("ip", &["netns", "add", &pair.a])?;
        run("ip", &["netns", "add", &pair.b])?;
        run("ip", &["link", "add", &va, "type", "veth", "peer", "name", &vb])?;
        run("ip", &["link", "set", &va, "netns", &pair.a])?;
        run("ip", &["link", "set", &vb, "netns", &pair.b])?;
        for (ns, dev, ip) in [(&pair.a, &va, CLIENT_IP), (&pair.b, &vb, SERVER_IP)] {
            run("ip", &["-n", ns, "addr", "add", &format!("{ip}/24"), "dev", dev])?;
            run("ip", &["-n", ns, "link", "set", dev, "up"])?;
            run("ip", &["-n", ns, "link", "set", "lo", "up"])?;
        }
        if loss_percent > 0.0 {
            let per_mille = ((loss_percent * 10.0).round() as u32).min(1000).to_string();
            let port = port.to_string();
            let nft = |args: &[&str]| {
                let mut all = vec!["netns", "exec", &pair.b, "nft"];
                all.extend_from_slice(args);
                run("ip", &all)
            };
            nft(&["add", "table", "inet", "tiercel"])?;
            nft(&["add", "chain", "inet", "tiercel", "in", "{ type filter hook input priority 0; }"])?;
            nft(&["add", "chain", "inet", "tiercel", "out", "{ type filter hook output priority 0; }"])?;
            // Every packet when the rate is 100%; numgen compares only below its modulus.
            let chance: &[&str] =
                if per_mille == "1000" { &[] } else { &["numgen", "random", "mod", "1000", "<", &per_mille] };
            for (chain, direction) in [("in", "dport"), ("out", "sport")] {
                let mut rule = vec!["add", "rule", "inet", "tiercel", chain, "udp", direction, &port];
                rule.extend_from_slice(chance);
                rule.push("drop");
                nft(&rule)?;
            }
        }
        Ok(pair)
    }
}

/// Address of the server's end of a [`Pair`]'s second link ([`Pair::second_link`]).
pub const SECOND_SERVER_IP: &str = "198.51.100.2";
/// Address of the client's end of a [`Pair`]'s second link.
pub const SECOND_CLIENT_IP: &str = "198.51.100.1";

impl Pair {
    /// A second veth pair between the two namespaces (198.51.100.0/24, TEST-NET-2), for a path
    /// measured beside the first one's: the client's end and the server's.
    pub fn second_link(&self) -> crate::Result<(String, String)> {
        let id = std::process::id();
        let (vc, vd) = (format!("tsc{id}"), format!("tsd{id}"));
        run("ip", &["link", "add", &vc, "type", "veth", "peer", "name", &vd])?;
        run("ip", &["link", "set", &vc, "netns", &self.a])?;
        run("ip", &["link", "set", &vd, "netns", &self.b])?;
        for (ns, dev, ip) in [(&self.a, &vc, SECOND_CLIENT_IP), (&self.b, &vd, SECOND_SERVER_IP)] {
            run("ip", &["-n", ns, "addr", "add", &format!("{ip}/24"), "dev", dev])?;
            run("ip", &["-n", ns, "link", "set", dev, "up"])?;
        }
        Ok((vc, vd))
    }
}

impl Drop for Pair {
    fn drop(&mut self) {
        // Deleting a namespace deletes its end of the veth pair, the pair, and its nftables rules.
        let _ = Command::new("ip").args(["netns", "del", &self.a]).status();
        let _ = Command::new("ip").args(["netns", "del", &self.b]).status();
    }
}

/// A client namespace and `servers` server namespaces, each joined by a veth pair to a bridge in a
/// hub namespace of their own: one 192.0.2.0/24 segment, the client at 192.0.2.1 and server `i` at
/// 192.0.2.(11 + i). Removed on drop.
pub struct Hub {
    hub: String,
    /// The client's namespace.
    pub client: String,
    /// The servers' namespaces.
    pub servers: Vec<String>,
}

/// Address of the client's end of a [`Hub`].
pub const HUB_CLIENT_IP: &str = "192.0.2.1";

impl Hub {
    /// Server `i`'s address.
    pub fn server_ip(i: usize) -> String {
        format!("192.0.2.{}", 11 + i)
    }

    /// Creates the namespaces, the bridge and the links.
    pub fn new(servers: usize) -> crate::Result<Hub> {
        let id = std::process::id() % 100_000;
        let hub = Hub {
            hub: format!("tchH{id}"),
            client: format!("tchC{id}"),
            servers: (0..servers).map(|i| format!("tchS{i}_{id}")).collect(),
        };
        run("ip", &["netns", "add", &hub.hub])?;
        run("ip", &["-n", &hub.hub, "link", "add", "br0", "type", "bridge"])?;
        run("ip", &["-n", &hub.hub, "link", "set", "br0", "up"])?;
        let ends: Vec<(String, String)> = std::iter::once((hub.client.clone(), format!("{HUB_CLIENT_IP}/24")))
            .chain(hub.servers.iter().enumerate().map(|(i, ns)| (ns.clone(), format!("{}/24", Hub::server_ip(i)))))
            .collect();
        for (i, (ns, addr)) in ends.iter().enumerate() {
            run("ip", &["netns", "add", ns])?;
            // Interface names are at most 15 bytes.
            let (outer, inner) = (format!("th{id}h{i}"), format!("th{id}e{i}"));
            run("ip", &["link", "add", &outer, "type", "veth", "peer", "name", &inner])?;
            run("ip", &["link", "set", &outer, "netns", &hub.hub])?;
            run("ip", &["link", "set", &inner, "netns", ns])?;
            run("ip", &["-n", &hub.hub, "link", "set", &outer, "master", "br0"])?;
            run("ip", &["-n", &hub.hub, "link", "set", &outer, "up"])?;
            run("ip", &["-n", ns, "addr", "add", addr, "dev", &inner])?;
            run("ip", &["-n", ns, "link", "set", &inner, "up"])?;
            run("ip", &["-n", ns, "link", "set", "lo", "up"])?;
        }
        Ok(hub)
    }
}

impl Drop for Hub {
    fn drop(&mut self) {
        for ns in self.servers.iter().chain([&self.client, &self.hub]) {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}
