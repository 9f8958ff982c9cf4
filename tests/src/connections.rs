//! Short TCP connections between two namespaces, timed one by one: what a new
//! connection costs on a path (the NetworkPolicy benchmark compares a node without
//! policies with one holding a thousand).
//!
//! The server accepts and closes at once; the client connects and reads until the
//! server's close arrives. One connection is timed from the client's `connect` to
//! that end of file: the handshake (SYN, SYN-ACK, ACK), the server's accept, and its
//! FIN. Each connection is a new conntrack entry, so each SYN goes through every
//! hook's rules as a new connection would.

use std::io::Read as _;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::time::{Duration, Instant};

use crate::hostport::in_netns;

/// Listens on `addr` in the namespace at `netns` and closes every connection as soon
/// as it is accepted, for as long as the process runs.
pub fn serve_and_close(netns: &Path, addr: SocketAddr) {
    let listener = in_netns(netns, move || {
        TcpListener::bind(addr).unwrap_or_else(|e| panic!("bind {addr}: {e}"))
    });
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            drop(stream);
        }
    });
}

/// `count` connections, one after the other, from the namespace at `netns` to `to`;
/// each one's time, or the first failure.
pub fn time_connections(
    netns: &Path,
    to: SocketAddr,
    count: usize,
) -> Result<Vec<Duration>, String> {
    in_netns(netns, move || {
        let mut times = Vec::with_capacity(count);
        let mut buf = [0u8; 16];
        for i in 0..count {
            let start = Instant::now();
            let mut stream = TcpStream::connect_timeout(&to, Duration::from_secs(2))
                .map_err(|e| format!("connection {i} to {to}: {e}"))?;
            stream
                .set_read_timeout(Some(Duration::from_secs(2)))
                .map_err(|e| e.to_string())?;
            match stream.read(&mut buf) {
                Ok(0) => {}
                Ok(n) => return Err(format!("connection {i} to {to}: {n} bytes, not a close")),
                Err(e) => return Err(format!("connection {i} to {to}: read: {e}")),
            }
            times.push(start.elapsed());
        }
        Ok(times)
    })
}

/// Whether a connection from `netns` to `to` is established within `within`: `Err`
/// tells refused (something answered) from timed out (dropped on the way).
pub fn try_connect(netns: &Path, to: SocketAddr, within: Duration) -> Result<(), String> {
    in_netns(netns, move || {
        TcpStream::connect_timeout(&to, within)
            .map(drop)
            .map_err(|e| format!("{:?}", e.kind()))
    })
}
