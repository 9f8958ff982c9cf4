//! The log group reader against the kernel: in a private network namespace, a rule
//! `log prefix ... group N` on the input hook, packets of both families sent to the
//! namespace's own loopback addresses, and what the reader makes of them.

use std::net::{IpAddr, TcpStream, UdpSocket};
use std::time::{Duration, Instant};

use cni_firewall::nflog::{LogGroup, LoggedPacket, Received};

mod common;
use common::{feed, in_netns, privileged, sh};

/// Far from the groups people use by hand (0-10) and from the agent's default.
const GROUP: u16 = 31_337;

/// Prefix, source, destination, protocol, destination port.
type Summary = (
    String,
    Option<IpAddr>,
    Option<IpAddr>,
    Option<u8>,
    Option<u16>,
);

/// Reads until `want` packets came or a generous minute passed.
fn receive(log: &mut LogGroup, want: usize) -> Vec<LoggedPacket> {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut got = Vec::new();
    while got.len() < want && Instant::now() < deadline {
        match log.recv().expect("reading the log group") {
            Received::Packets(packets) => got.extend(packets),
            Received::Timeout => {}
            Received::Overflow => panic!("the kernel dropped log messages of a handful of packets"),
        }
    }
    got
}

#[test]
fn logged_packets_of_both_families_read_back() {
    if !privileged() {
        return;
    }
    in_netns(|| {
        sh("ip", &["link", "set", "lo", "up"]);
        feed(
            "nft",
            &["-f", "-"],
            &format!(
                "table inet nflog_test {{\n\
                 chain input {{ type filter hook input priority 0;\n\
                 udp dport 4242 log prefix \"x-udp\" group {GROUP}\n\
                 tcp dport 4243 ct state new log prefix \"x-tcp\" group {GROUP}\n\
                 }}\n}}\n"
            ),
        );
        let mut log = LogGroup::bind(GROUP, Some(Duration::from_millis(200))).expect("bind");
        assert_eq!(log.group(), GROUP);
        // A second reader of the same group is refused, and says why.
        let e = LogGroup::bind(GROUP, None).unwrap_err().to_string();
        assert!(e.contains("another socket reads this log group"), "{e}");

        let v4: IpAddr = "127.0.0.1".parse().unwrap();
        let v6: IpAddr = "::1".parse().unwrap();
        for to in [v4, v6] {
            let socket = UdpSocket::bind((to, 0)).unwrap();
            socket.send_to(b"hello", (to, 4242)).unwrap();
            // Nobody listens: the SYN is logged, the connection refused.
            let _ = TcpStream::connect_timeout(&(to, 4243).into(), Duration::from_secs(5));
        }
        let mut packets = receive(&mut log, 4);
        packets.sort_by_key(|p| (p.prefix.clone(), p.dst().map(|d| d.is_ipv6())));
        let summary: Vec<Summary> = packets
            .iter()
            .map(|p| (p.prefix.clone(), p.src(), p.dst(), p.protocol, p.dst_port))
            .collect();
        assert_eq!(
            summary,
            vec![
                ("x-tcp".into(), Some(v4), Some(v4), Some(6), Some(4243)),
                ("x-tcp".into(), Some(v6), Some(v6), Some(6), Some(4243)),
                ("x-udp".into(), Some(v4), Some(v4), Some(17), Some(4242)),
                ("x-udp".into(), Some(v6), Some(v6), Some(17), Some(4242)),
            ],
            "{packets:#?}"
        );
        // Input hook on loopback: in on lo (index 1), no output interface yet.
        for p in &packets {
            assert_eq!((p.in_ifindex, p.out_ifindex), (1, 0), "{p:?}");
        }
    });
}
