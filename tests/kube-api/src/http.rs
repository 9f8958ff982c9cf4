//! The HTTP side: one thread per connection, HTTP/1.1 with keep-alive, Node list with
//! pagination, Node watch as a chunked stream of JSON lines (bookmarks, 410 Gone as the
//! API server sends it), single get, and event creation.

use std::io::{self, BufRead, BufReader, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::Shared;

/// A request line and what matters of its headers and body.
struct Request {
    method: String,
    path: String,
    query: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Request {
    fn param(&self, key: &str) -> Option<&str> {
        self.query
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// Serves one connection until the client closes it or the server stops.
pub fn serve(stream: TcpStream, shared: &Arc<Shared>) {
    let Ok(read_half) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(read_half);
    let mut out = stream;
    loop {
        let request = match read_request(&mut reader) {
            Ok(Some(r)) => r,
            Ok(None) | Err(_) => return,
        };
        if !shared.running.load(Ordering::SeqCst) {
            return;
        }
        let keep = match handle(&request, &mut out, shared) {
            Ok(keep) => keep,
            Err(_) => return,
        };
        if !keep {
            return;
        }
    }
}

fn read_request(reader: &mut impl BufRead) -> io::Result<Option<Request>> {
    let mut line = String::new();
    if reader.read_line(&mut line)? == 0 {
        return Ok(None);
    }
    let mut words = line.split_whitespace();
    let (Some(method), Some(target)) = (words.next(), words.next()) else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "bad request line",
        ));
    };
    let (method, target) = (method.to_owned(), target.to_owned());
    let mut length = 0usize;
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header)? == 0 {
            return Ok(None);
        }
        let header = header.trim_end();
        if header.is_empty() {
            break;
        }
        if let Some((name, value)) = header.split_once(':')
            && name.eq_ignore_ascii_case("content-length")
        {
            length = value
                .trim()
                .parse()
                .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "bad content-length"))?;
        }
    }
    if length > 16 << 20 {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "body too big"));
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body)?;
    let (path, query) = match target.split_once('?') {
        Some((p, q)) => (p.to_owned(), q),
        None => (target.clone(), ""),
    };
    let query = query
        .split('&')
        .filter(|kv| !kv.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (decode(k), decode(v))
        })
        .collect();
    Ok(Some(Request {
        method,
        path,
        query,
        body,
    }))
}

/// Percent-decoding of a query component (`+` is a space).
fn decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("");
                match u8::from_str_radix(hex, 16) {
                    Ok(b) => {
                        out.push(b);
                        i += 3;
                        continue;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            b'+' => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "message": message, "reason": reason, "code": code,
    })
}

fn respond(out: &mut impl Write, code: u16, body: &[u8]) -> io::Result<bool> {
    let reason = match code {
        200 => "OK",
        201 => "Created",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        410 => "Gone",
        _ => "Error",
    };
    let head = format!(
        "HTTP/1.1 {code} {reason}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    out.write_all(head.as_bytes())?;
    out.write_all(body)?;
    out.flush()?;
    Ok(true)
}

fn respond_json(out: &mut impl Write, code: u16, value: &Value) -> io::Result<bool> {
    respond(out, code, &serde_json::to_vec(value).unwrap_or_default())
}

fn handle(req: &Request, out: &mut TcpStream, shared: &Arc<Shared>) -> io::Result<bool> {
    let segments: Vec<&str> = req.path.trim_matches('/').split('/').collect();
    match (req.method.as_str(), segments.as_slice()) {
        ("GET", ["api", "v1", "nodes"]) => {
            let watching = matches!(req.param("watch"), Some("true" | "1"));
            if watching {
                watch(req, out, shared)
            } else {
                list(req, out, shared)
            }
        }
        ("GET", ["api", "v1", "nodes", name]) => {
            let found = shared.lock().nodes.get(*name).cloned();
            match found {
                Some(bytes) => respond(out, 200, &bytes),
                None => respond_json(
                    out,
                    404,
                    &status(404, "NotFound", &format!("nodes \"{name}\" not found")),
                ),
            }
        }
        ("POST", ["api", "v1", "namespaces", _, "events"])
        | ("POST", ["apis", "events.k8s.io", "v1", "namespaces", _, "events"]) => {
            match serde_json::from_slice::<Value>(&req.body) {
                Ok(event) => {
                    shared.lock_events().push(event.clone());
                    respond_json(out, 201, &event)
                }
                Err(e) => respond_json(out, 400, &status(400, "BadRequest", &e.to_string())),
            }
        }
        ("GET", ["version"]) => respond_json(
            out,
            200,
            &json!({"major": "1", "minor": "34", "gitVersion": "v1.34.0-cni-kube-api"}),
        ),
        _ => respond_json(
            out,
            404,
            &status(
                404,
                "NotFound",
                &format!("{} {} is not served", req.method, req.path),
            ),
        ),
    }
}

fn number(req: &Request, key: &str) -> Result<Option<u64>, String> {
    match req.param(key) {
        None | Some("") => Ok(None),
        Some(text) => text
            .parse()
            .map(Some)
            .map_err(|_| format!("{key}={text:?} is not a number")),
    }
}

fn list(req: &Request, out: &mut TcpStream, shared: &Arc<Shared>) -> io::Result<bool> {
    shared.lists.fetch_add(1, Ordering::SeqCst);
    let limit = match number(req, "limit") {
        Ok(limit) => limit.filter(|l| *l > 0),
        Err(e) => return respond_json(out, 400, &status(400, "BadRequest", &e)),
    };
    // A continue token is "<rv>:<last name>": the list snapshot's version, and where
    // the previous page ended.
    let (snapshot, after) = match req.param("continue").filter(|c| !c.is_empty()) {
        Some(token) => match token
            .split_once(':')
            .and_then(|(rv, name)| Some((rv.parse::<u64>().ok()?, name)))
        {
            Some((rv, name)) => (Some(rv), Some(name.to_owned())),
            None => {
                return respond_json(
                    out,
                    400,
                    &status(400, "BadRequest", "malformed continue token"),
                );
            }
        },
        None => (None, None),
    };
    let mut body = Vec::new();
    {
        let store = shared.lock();
        if let Some(rv) = snapshot
            && !store.serves(rv)
        {
            shared.expired.fetch_add(1, Ordering::SeqCst);
            let token = format!("{}:{}", store.rv, after.unwrap_or_default());
            let mut s = status(
                410,
                "Expired",
                "The provided continue parameter is too old to display a consistent list result.",
            );
            s["metadata"] = json!({"continue": token});
            drop(store);
            return respond_json(out, 410, &s);
        }
        let rv = snapshot.unwrap_or(store.rv);
        let mut items = store
            .nodes
            .range::<String, _>((
                after
                    .as_ref()
                    .map_or(std::ops::Bound::Unbounded, std::ops::Bound::Excluded),
                std::ops::Bound::Unbounded,
            ))
            .peekable();
        body.extend_from_slice(b"{\"kind\":\"NodeList\",\"apiVersion\":\"v1\",\"items\":[");
        let page = limit.map_or(usize::MAX, |l| usize::try_from(l).unwrap_or(usize::MAX));
        let mut last = None;
        for (name, bytes) in items.by_ref().take(page) {
            if last.is_some() {
                body.push(b',');
            }
            body.extend_from_slice(bytes);
            last = Some(name.clone());
        }
        let more = items.peek().is_some();
        let mut meta = json!({"resourceVersion": rv.to_string()});
        if more && let Some(last) = last {
            meta["continue"] = json!(format!("{rv}:{last}"));
            meta["remainingItemCount"] = json!(store.nodes.len() as u64);
        }
        body.extend_from_slice(b"],\"metadata\":");
        body.extend_from_slice(&serde_json::to_vec(&meta).unwrap_or_default());
        body.push(b'}');
    }
    respond(out, 200, &body)
}

fn chunk(out: &mut impl Write, data: &[u8]) -> io::Result<()> {
    out.write_all(format!("{:x}\r\n", data.len()).as_bytes())?;
    out.write_all(data)?;
    out.write_all(b"\r\n")?;
    out.flush()
}

fn event_line(kind: &str, object: &[u8]) -> Vec<u8> {
    let mut line = Vec::with_capacity(object.len() + 32);
    line.extend_from_slice(b"{\"type\":\"");
    line.extend_from_slice(kind.as_bytes());
    line.extend_from_slice(b"\",\"object\":");
    line.extend_from_slice(object);
    line.extend_from_slice(b"}\n");
    line
}

fn watch(req: &Request, out: &mut TcpStream, shared: &Arc<Shared>) -> io::Result<bool> {
    shared.watches.fetch_add(1, Ordering::SeqCst);
    let (from, timeout) = match (
        number(req, "resourceVersion"),
        number(req, "timeoutSeconds"),
    ) {
        (Ok(from), Ok(timeout)) => (from, timeout),
        (Err(e), _) | (_, Err(e)) => return respond_json(out, 400, &status(400, "BadRequest", &e)),
    };
    let bookmarks = req.param("allowWatchBookmarks") == Some("true");
    let deadline = Instant::now() + Duration::from_secs(timeout.unwrap_or(1800).min(3600));
    let sent = {
        let store = shared.lock();
        // No version (or 0): start from now, with the current objects as ADDED.
        match from.filter(|rv| *rv > 0) {
            Some(rv) if !store.serves(rv) => {
                shared.expired.fetch_add(1, Ordering::SeqCst);
                let message = format!("too old resource version: {rv} ({})", store.oldest);
                drop(store);
                if shared.gone_as_http.load(Ordering::SeqCst) {
                    return respond_json(out, 410, &status(410, "Expired", &message));
                }
                out.write_all(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n",
                )?;
                let mut line = serde_json::to_vec(
                    &json!({"type": "ERROR", "object": status(410, "Expired", &message)}),
                )
                .unwrap_or_default();
                line.push(b'\n');
                chunk(out, &line)?;
                out.write_all(b"0\r\n\r\n")?;
                out.flush()?;
                return Ok(true);
            }
            Some(rv) => rv,
            None => {
                let snapshot: Vec<Vec<u8>> = store
                    .nodes
                    .values()
                    .map(|b| event_line("ADDED", b))
                    .collect();
                let rv = store.rv;
                drop(store);
                out.write_all(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n",
                )?;
                for line in snapshot {
                    chunk(out, &line)?;
                }
                return stream_changes(out, shared, rv, bookmarks, deadline, true);
            }
        }
    };
    out.write_all(
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n",
    )?;
    out.flush()?;
    stream_changes(out, shared, sent, bookmarks, deadline, true)
}

/// Sends every change after `sent` as it happens, bookmarks while idle, until the
/// deadline (then a clean end of stream) or until the server stops (then the
/// connection just breaks, as when an API server goes away).
fn stream_changes(
    out: &mut TcpStream,
    shared: &Arc<Shared>,
    mut sent: u64,
    bookmarks: bool,
    deadline: Instant,
    keep_alive: bool,
) -> io::Result<bool> {
    let generation = shared.generation.load(Ordering::SeqCst);
    let mut last_bookmark = Instant::now();
    loop {
        if !shared.running.load(Ordering::SeqCst)
            || shared.generation.load(Ordering::SeqCst) != generation
        {
            return Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "server stopped",
            ));
        }
        let (lines, expired) = {
            let mut store = shared.lock();
            if !store.serves(sent) {
                (Vec::new(), true)
            } else {
                let lines: Vec<(u64, Vec<u8>)> = store
                    .changes_after(sent)
                    .map(|c| (c.rv, event_line(c.kind, &c.object)))
                    .collect();
                if lines.is_empty() {
                    let wait = shared
                        .bookmark_interval()
                        .min(deadline.saturating_duration_since(Instant::now()))
                        .min(Duration::from_millis(100));
                    store = shared.wait_changed(store, wait);
                    drop(store);
                }
                (lines, false)
            }
        };
        if expired {
            let message = format!("too old resource version: {sent}");
            shared.expired.fetch_add(1, Ordering::SeqCst);
            let mut line = serde_json::to_vec(
                &json!({"type": "ERROR", "object": status(410, "Expired", &message)}),
            )
            .unwrap_or_default();
            line.push(b'\n');
            chunk(out, &line)?;
            out.write_all(b"0\r\n\r\n")?;
            out.flush()?;
            return Ok(keep_alive);
        }
        for (rv, line) in lines {
            chunk(out, &line)?;
            sent = rv;
        }
        if bookmarks && last_bookmark.elapsed() >= shared.bookmark_interval() {
            // Only a version whose changes were all sent: a change that came in since
            // the lines above were taken goes out first, on the next turn.
            let rv = {
                let store = shared.lock();
                if store.changes_after(sent).next().is_some() {
                    continue;
                }
                store.rv.max(sent)
            };
            let line = event_line(
                "BOOKMARK",
                format!(
                    "{{\"kind\":\"Node\",\"apiVersion\":\"v1\",\"metadata\":{{\"resourceVersion\":\"{rv}\"}}}}"
                )
                .as_bytes(),
            );
            chunk(out, &line)?;
            shared.bookmarks.fetch_add(1, Ordering::SeqCst);
            sent = rv;
            last_bookmark = Instant::now();
        }
        if Instant::now() >= deadline {
            out.write_all(b"0\r\n\r\n")?;
            out.flush()?;
            return Ok(keep_alive);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_components_are_percent_decoded() {
        assert_eq!(decode("12%3Anode-1"), "12:node-1");
        assert_eq!(decode("a+b%2"), "a b%2");
        assert_eq!(decode("%zz"), "%zz");
        assert_eq!(decode("%"), "%");
    }

    #[test]
    fn a_request_with_a_body_is_read_whole() {
        let text = b"POST /x?a=1&b=%41 HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}GET /";
        let mut reader = BufReader::new(&text[..]);
        let req = read_request(&mut reader).unwrap().unwrap();
        assert_eq!((req.method.as_str(), req.path.as_str()), ("POST", "/x"));
        assert_eq!(req.param("b"), Some("A"));
        assert_eq!(req.body, b"{}");
        assert!(read_request(&mut reader).is_err() || read_request(&mut reader).unwrap().is_none());
    }
}
