//! The HTTP side: one thread per connection, HTTP/1.1 with keep-alive; for every kind,
//! list with pagination at one snapshot, watch as a chunked stream of JSON lines
//! (bookmarks, streaming lists, 410 Gone as the API server sends it), both with label and
//! field selectors, single get and merge patch; discovery documents; event creation. A custom kind
//! whose CRD is not installed is not there at all: 404 for its paths and group.

use std::io::{self, BufRead, BufReader, Write};
use std::net::TcpStream;
use std::ops::Bound;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::Shared;
use crate::kind::Kind;
use crate::selector::{FieldSelector, Filter, LabelSelector};
use crate::store::{Change, Event};

/// A request line and what matters of its headers and body.
struct Request {
    method: String,
    /// The path and query as sent.
    target: String,
    path: String,
    query: Vec<(String, String)>,
    /// The `Content-Type` header, lower case, without parameters.
    content_type: String,
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
        shared
            .lock_requests()
            .push(format!("{} {}", request.method, request.target));
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
    let mut content_type = String::new();
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
            && name.eq_ignore_ascii_case("content-type")
        {
            content_type = value
                .split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase();
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
        target,
        path,
        query,
        content_type,
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

/// What a path names among the served kinds.
#[derive(Debug, PartialEq, Eq)]
enum Resource<'a> {
    /// A collection: every namespace's, or one namespace's.
    Collection(Kind, Option<&'a str>),
    /// One object (namespace `""` for a cluster-scoped kind).
    Item(Kind, &'a str, &'a str),
}

/// `/api/v1/...` or `/apis/{group}/{version}/...`, then `{plural}`, `{plural}/{name}`
/// (cluster-scoped), `namespaces/{ns}/{plural}` or `namespaces/{ns}/{plural}/{name}`
/// (namespaced).
fn resource<'a>(segments: &[&'a str]) -> Option<Resource<'a>> {
    let (api_version, rest) = match segments {
        ["api", "v1", rest @ ..] => ("v1".to_owned(), rest),
        ["apis", group, version, rest @ ..] => (format!("{group}/{version}"), rest),
        _ => return None,
    };
    let kind = |plural: &str, namespaced: bool| {
        Kind::from_resource(&api_version, plural).filter(|k| k.namespaced() == namespaced)
    };
    match *rest {
        [plural] => Some(Resource::Collection(
            Kind::from_resource(&api_version, plural)?,
            None,
        )),
        [plural, name] => Some(Resource::Item(kind(plural, false)?, "", name)),
        ["namespaces", ns, plural] => Some(Resource::Collection(kind(plural, true)?, Some(ns))),
        ["namespaces", ns, plural, name] => Some(Resource::Item(kind(plural, true)?, ns, name)),
        _ => None,
    }
}

fn handle(req: &Request, out: &mut TcpStream, shared: &Arc<Shared>) -> io::Result<bool> {
    let segments: Vec<&str> = req.path.trim_matches('/').split('/').collect();
    if req.method == "GET" {
        let served = |r: &Resource<'_>| match r {
            Resource::Collection(kind, _) | Resource::Item(kind, _, _) => shared.serves_kind(*kind),
        };
        if let Some(found) = resource(&segments).filter(served) {
            return match found {
                Resource::Collection(kind, namespace) => {
                    let filter = match filter(req, kind, namespace) {
                        Ok(filter) => filter,
                        Err(e) => {
                            return respond_json(out, 400, &status(400, "BadRequest", &e));
                        }
                    };
                    if matches!(req.param("watch"), Some("true" | "1")) {
                        watch(req, out, shared, kind, &filter)
                    } else {
                        list(req, out, shared, kind, &filter)
                    }
                }
                Resource::Item(kind, namespace, name) => {
                    let found = shared
                        .lock()
                        .get(kind, namespace, name)
                        .map(|o| o.json.clone());
                    match found {
                        Some(bytes) => respond(out, 200, &bytes),
                        None => respond_json(
                            out,
                            404,
                            &status(
                                404,
                                "NotFound",
                                &format!("{} \"{name}\" not found", kind.plural()),
                            ),
                        ),
                    }
                }
            };
        }
        if let Some(answer) = discovery(&segments, out, &|kind| shared.serves_kind(kind)) {
            return respond_json(out, 200, &answer);
        }
    }
    if req.method == "PATCH"
        && let Some(Resource::Item(kind, namespace, name)) = resource(&segments).filter(|r| match r
        {
            Resource::Collection(kind, _) | Resource::Item(kind, _, _) => shared.serves_kind(*kind),
        })
    {
        return patch(req, out, shared, kind, namespace, name);
    }
    match (req.method.as_str(), segments.as_slice()) {
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

/// PATCH of one object: a JSON merge patch (RFC 7386), and a strategic merge patch
/// taken as one (the same for maps such as annotations and labels; a list is replaced
/// whole, where the API server would merge some lists by key). The patched object is
/// stored as a change (a watch sees `MODIFIED`) and returned. A JSON patch or an apply
/// patch is 415, as the server answers a type it does not take.
fn patch(
    req: &Request,
    out: &mut TcpStream,
    shared: &Arc<Shared>,
    kind: Kind,
    namespace: &str,
    name: &str,
) -> io::Result<bool> {
    if !matches!(
        req.content_type.as_str(),
        "application/merge-patch+json" | "application/strategic-merge-patch+json"
    ) {
        return respond_json(
            out,
            415,
            &status(
                415,
                "UnsupportedMediaType",
                &format!(
                    "the body of the request was in an unknown format - accepted media types include: application/merge-patch+json, application/strategic-merge-patch+json (got {:?})",
                    req.content_type
                ),
            ),
        );
    }
    let body: Value = match serde_json::from_slice(&req.body) {
        Ok(v) => v,
        Err(e) => return respond_json(out, 400, &status(400, "BadRequest", &e.to_string())),
    };
    let patched = {
        let mut store = shared.lock();
        let Some(current) = store
            .get(kind, namespace, name)
            .and_then(|o| serde_json::from_slice::<Value>(&o.json).ok())
        else {
            drop(store);
            return respond_json(
                out,
                404,
                &status(
                    404,
                    "NotFound",
                    &format!("{} \"{name}\" not found", kind.plural()),
                ),
            );
        };
        let mut merged = current;
        merge_patch(&mut merged, &body);
        store
            .apply(kind, merged)
            .map(|_| store.get(kind, namespace, name).map(|o| o.json.clone()))
    };
    shared.changed.notify_all();
    match patched {
        Ok(Some(bytes)) => respond(out, 200, &bytes),
        Ok(None) => respond_json(out, 500, &status(500, "InternalError", "lost the object")),
        Err(e) => respond_json(out, 422, &status(422, "Invalid", &e)),
    }
}

/// RFC 7386: an object merges key by key, `null` removes a key, anything else
/// replaces.
fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(patch) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(serde_json::Map::new());
    }
    let Value::Object(map) = target else {
        return;
    };
    for (key, value) in patch {
        if value.is_null() {
            map.remove(key);
        } else {
            merge_patch(map.entry(key.clone()).or_insert(Value::Null), value);
        }
    }
}

/// The group versions, with the resources each serves: the served kinds' and the
/// events clients may post (create only).
fn groups(served: &dyn Fn(Kind) -> bool) -> Vec<(&'static str, Vec<Value>)> {
    let mut groups: Vec<(&'static str, Vec<Value>)> = Vec::new();
    for kind in Kind::ALL.into_iter().filter(|k| served(*k)) {
        let resource = json!({
            "name": kind.plural(), "singularName": kind.singular(),
            "namespaced": kind.namespaced(), "kind": kind.name(),
            "verbs": ["get", "list", "watch"], "shortNames": kind.short_names(),
        });
        match groups.iter_mut().find(|(v, _)| *v == kind.api_version()) {
            Some((_, resources)) => resources.push(resource),
            None => groups.push((kind.api_version(), vec![resource])),
        }
    }
    let events = json!({
        "name": "events", "singularName": "event", "namespaced": true,
        "kind": "Event", "verbs": ["create"],
    });
    for api_version in ["v1", "events.k8s.io/v1"] {
        match groups.iter_mut().find(|(v, _)| *v == api_version) {
            Some((_, resources)) => resources.push(events.clone()),
            None => groups.push((api_version, vec![events.clone()])),
        }
    }
    groups
}

/// The discovery documents: `/api`, `/api/v1`, `/apis`, `/apis/{group}` and
/// `/apis/{group}/{version}` (not the aggregated form), of the served kinds.
fn discovery(segments: &[&str], out: &TcpStream, served: &dyn Fn(Kind) -> bool) -> Option<Value> {
    let groups = groups(served);
    let group_of = |api_version: &str| {
        let (group, version) = api_version.split_once('/')?;
        let gv = json!({"groupVersion": api_version, "version": version});
        Some(json!({"name": group, "versions": [gv], "preferredVersion": gv}))
    };
    let resources = |api_version: &str| {
        groups.iter().find(|(v, _)| *v == api_version).map(|(_, r)| {
            json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": api_version, "resources": r})
        })
    };
    match segments {
        ["api"] => {
            let address = out.local_addr().map(|a| a.to_string()).unwrap_or_default();
            Some(json!({
                "kind": "APIVersions", "versions": ["v1"],
                "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": address}],
            }))
        }
        ["api", "v1"] => resources("v1"),
        ["apis"] => Some(json!({
            "kind": "APIGroupList", "apiVersion": "v1",
            "groups": groups.iter().filter_map(|(v, _)| group_of(v)).collect::<Vec<_>>(),
        })),
        ["apis", group] => groups
            .iter()
            .filter_map(|(v, _)| group_of(v))
            .find(|g| g["name"] == *group)
            .map(|mut g| {
                g["kind"] = json!("APIGroup");
                g["apiVersion"] = json!("v1");
                g
            }),
        ["apis", group, version] => resources(&format!("{group}/{version}")),
        _ => None,
    }
}

/// The request's selectors and its path's namespace.
fn filter(req: &Request, kind: Kind, namespace: Option<&str>) -> Result<Filter, String> {
    Ok(Filter {
        namespace: namespace.map(str::to_owned),
        labels: LabelSelector::parse(req.param("labelSelector").unwrap_or_default())?,
        fields: FieldSelector::parse(req.param("fieldSelector").unwrap_or_default(), kind)?,
    })
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

fn list(
    req: &Request,
    out: &mut TcpStream,
    shared: &Arc<Shared>,
    kind: Kind,
    filter: &Filter,
) -> io::Result<bool> {
    shared.lists.fetch_add(1, Ordering::SeqCst);
    let (limit, exact) = match (number(req, "limit"), number(req, "resourceVersion")) {
        (Ok(limit), Ok(rv)) => (
            limit.filter(|l| *l > 0),
            rv.filter(|_| req.param("resourceVersionMatch") == Some("Exact")),
        ),
        (Err(e), _) | (_, Err(e)) => {
            return respond_json(out, 400, &status(400, "BadRequest", &e));
        }
    };
    // A continue token is "<rv>:<last key>": the list snapshot's version, and where
    // the previous page ended. Every page is read at that version, as from etcd.
    let (snapshot, after) = match req.param("continue").filter(|c| !c.is_empty()) {
        Some(token) => match token
            .split_once(':')
            .and_then(|(rv, key)| Some((rv.parse::<u64>().ok()?, key)))
        {
            Some((rv, key)) => (Some(rv), Some(key.to_owned())),
            None => {
                return respond_json(
                    out,
                    400,
                    &status(400, "BadRequest", "malformed continue token"),
                );
            }
        },
        None => (exact, None),
    };
    let mut body = Vec::new();
    {
        let store = shared.lock();
        if let Some(rv) = snapshot
            && !store.serves(rv)
        {
            shared.expired.fetch_add(1, Ordering::SeqCst);
            let s = match &after {
                Some(after) => {
                    let mut s = status(
                        410,
                        "Expired",
                        "The provided continue parameter is too old to display a consistent list result.",
                    );
                    s["metadata"] = json!({"continue": format!("{}:{after}", store.rv)});
                    s
                }
                None => status(
                    410,
                    "Expired",
                    &format!("too old resource version: {rv} ({})", store.oldest),
                ),
            };
            drop(store);
            return respond_json(out, 410, &s);
        }
        let rv = snapshot.unwrap_or(store.rv);
        let objects = store.objects_at(kind, rv);
        let prefix = filter.namespace.as_ref().map(|ns| format!("{ns}/"));
        let lower = match (&after, &prefix) {
            (Some(after), _) => Bound::Excluded(after.clone()),
            (None, Some(prefix)) => Bound::Included(prefix.clone()),
            (None, None) => Bound::Unbounded,
        };
        let mut matching = objects
            .range::<String, _>((lower, Bound::Unbounded))
            .take_while(|(key, _)| prefix.as_ref().is_none_or(|p| key.starts_with(p)))
            .filter(|(_, o)| filter.matches(o))
            .peekable();
        let page = limit.map_or(usize::MAX, |l| usize::try_from(l).unwrap_or(usize::MAX));
        let mut items = Vec::new();
        let mut last = None;
        for (key, object) in matching.by_ref().take(page) {
            if last.is_some() {
                items.push(b',');
            }
            items.extend_from_slice(&object.json);
            last = Some(key.clone());
        }
        let mut meta = json!({"resourceVersion": rv.to_string()});
        if matching.peek().is_some()
            && let Some(last) = last
        {
            meta["continue"] = json!(format!("{rv}:{last}"));
            // The API server counts only when no selector narrows the list.
            if !filter.has_selectors() {
                meta["remainingItemCount"] = json!(matching.count() as u64);
            }
        }
        body.reserve(items.len() + 256);
        body.extend_from_slice(
            format!(
                "{{\"kind\":\"{}\",\"apiVersion\":\"{}\",\"metadata\":",
                kind.list_name(),
                kind.api_version()
            )
            .as_bytes(),
        );
        body.extend_from_slice(&serde_json::to_vec(&meta).unwrap_or_default());
        body.extend_from_slice(b",\"items\":[");
        body.extend_from_slice(&items);
        body.extend_from_slice(b"]}");
    }
    respond(out, 200, &body)
}

/// Writes `lines` as chunks, flushing about every megabyte and at the end.
fn chunks(out: &mut impl Write, lines: &[Vec<u8>]) -> io::Result<()> {
    let mut buffer = Vec::new();
    for line in lines {
        buffer.extend_from_slice(format!("{:x}\r\n", line.len()).as_bytes());
        buffer.extend_from_slice(line);
        buffer.extend_from_slice(b"\r\n");
        if buffer.len() >= 1 << 20 {
            out.write_all(&buffer)?;
            buffer.clear();
        }
    }
    out.write_all(&buffer)?;
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

/// What a watch with `filter` sees of `change`, as the API server's watch cache decides
/// it: an object that starts matching is ADDED, one that stops matching is DELETED (its
/// last matching version, at the change's resourceVersion).
fn watch_event(change: &Change, filter: &Filter) -> Option<Vec<u8>> {
    let now = change.event != Event::Deleted && filter.matches(&change.object);
    let before = change.previous.as_ref().is_some_and(|p| filter.matches(p));
    match (now, before) {
        (true, false) => Some(event_line("ADDED", &change.object.json)),
        (true, true) => Some(event_line("MODIFIED", &change.object.json)),
        (false, true) if change.event == Event::Deleted => {
            Some(event_line("DELETED", &change.object.json))
        }
        (false, true) => change
            .previous
            .as_ref()
            .map(|p| event_line("DELETED", &p.json_at(change.rv))),
        (false, false) => None,
    }
}

fn bookmark_line(kind: Kind, rv: u64, initial_events_end: bool) -> Vec<u8> {
    let annotations = if initial_events_end {
        ",\"annotations\":{\"k8s.io/initial-events-end\":\"true\"}"
    } else {
        ""
    };
    event_line(
        "BOOKMARK",
        format!(
            "{{\"kind\":\"{}\",\"apiVersion\":\"{}\",\"metadata\":{{\"resourceVersion\":\"{rv}\"{annotations}}}}}",
            kind.name(),
            kind.api_version()
        )
        .as_bytes(),
    )
}

const STREAM_HEAD: &[u8] =
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n";

fn watch(
    req: &Request,
    out: &mut TcpStream,
    shared: &Arc<Shared>,
    kind: Kind,
    filter: &Filter,
) -> io::Result<bool> {
    shared.watches.fetch_add(1, Ordering::SeqCst);
    let (from, timeout) = match (
        number(req, "resourceVersion"),
        number(req, "timeoutSeconds"),
    ) {
        (Ok(from), Ok(timeout)) => (from, timeout),
        (Err(e), _) | (_, Err(e)) => return respond_json(out, 400, &status(400, "BadRequest", &e)),
    };
    let bookmarks = req.param("allowWatchBookmarks") == Some("true");
    // A streaming list: the current objects, then a bookmark that says they are all
    // there, whatever the version asked for (NotOlderThan it, which now is).
    let initial_events = req.param("sendInitialEvents") == Some("true");
    let deadline = Instant::now() + Duration::from_secs(timeout.unwrap_or(1800).min(3600));
    let store = shared.lock();
    // No version (or 0): start from now, with the current objects as ADDED.
    let from = match from.filter(|rv| *rv > 0 && !initial_events) {
        Some(rv) if !store.serves(rv) => {
            shared.expired.fetch_add(1, Ordering::SeqCst);
            let message = format!("too old resource version: {rv} ({})", store.oldest);
            drop(store);
            if shared.gone_as_http.load(Ordering::SeqCst) {
                return respond_json(out, 410, &status(410, "Expired", &message));
            }
            out.write_all(STREAM_HEAD)?;
            let mut line = serde_json::to_vec(
                &json!({"type": "ERROR", "object": status(410, "Expired", &message)}),
            )
            .unwrap_or_default();
            line.push(b'\n');
            chunks(out, &[line])?;
            out.write_all(b"0\r\n\r\n")?;
            out.flush()?;
            return Ok(true);
        }
        Some(rv) => {
            drop(store);
            out.write_all(STREAM_HEAD)?;
            out.flush()?;
            rv
        }
        None => {
            let mut lines: Vec<Vec<u8>> = store
                .objects(kind)
                .values()
                .filter(|o| filter.matches(o))
                .map(|o| event_line("ADDED", &o.json))
                .collect();
            let rv = store.rv;
            drop(store);
            if initial_events {
                lines.push(bookmark_line(kind, rv, true));
                shared.bookmarks.fetch_add(1, Ordering::SeqCst);
            }
            out.write_all(STREAM_HEAD)?;
            chunks(out, &lines)?;
            rv
        }
    };
    stream_changes(out, shared, kind, filter, from, bookmarks, deadline)
}

/// Sends every change after `sent` that the watch sees as it happens, bookmarks while
/// idle, until the deadline (then a clean end of stream) or until the server stops
/// (then the connection just breaks, as when an API server goes away).
fn stream_changes(
    out: &mut TcpStream,
    shared: &Arc<Shared>,
    kind: Kind,
    filter: &Filter,
    mut sent: u64,
    bookmarks: bool,
    deadline: Instant,
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

        let (lines, seen, expired, served) = {
            let mut store = shared.lock();
            // Read under the store's lock: a CRD's removal deletes its objects and
            // unserves the kind in one step, so the deletions are all in `lines`.
            let served = shared.serves_kind(kind);
            if !store.serves(sent) {
                (Vec::new(), sent, true, served)
            } else {
                let mut seen = sent;
                let mut lines = Vec::new();
                for change in store.changes_after(sent) {
                    seen = change.rv;
                    if change.object.kind == kind {
                        lines.extend(watch_event(change, filter));
                    }
                }
                let wait = shared
                    .bookmark_interval()
                    .min(deadline.saturating_duration_since(Instant::now()))
                    .min(Duration::from_millis(100));
                if seen == sent && served {
                    store = shared.wait_changed(store, wait);
                    drop(store);
                }
                (lines, seen, false, served)
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
            chunks(out, &[line])?;
            out.write_all(b"0\r\n\r\n")?;
            out.flush()?;
            return Ok(true);
        }
        if !lines.is_empty() {
            chunks(out, &lines)?;
        }
        sent = seen;
        if !served {
            // Its CRD went away: the API server ends the watches of its resources.
            out.write_all(b"0\r\n\r\n")?;
            out.flush()?;
            return Ok(true);
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
            chunks(out, &[bookmark_line(kind, rv, false)])?;
            shared.bookmarks.fetch_add(1, Ordering::SeqCst);
            sent = rv;
            last_bookmark = Instant::now();
        }
        if Instant::now() >= deadline {
            out.write_all(b"0\r\n\r\n")?;
            out.flush()?;
            return Ok(true);
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
    fn paths_name_kinds_and_namespaces() {
        let path = |p: &str| {
            let segments: Vec<&str> = p.trim_matches('/').split('/').collect();
            resource(&segments).map(|r| format!("{r:?}"))
        };
        let some = |r: Resource<'_>| Some(format!("{r:?}"));
        assert_eq!(
            path("/api/v1/nodes"),
            some(Resource::Collection(Kind::Node, None))
        );
        assert_eq!(
            path("/api/v1/nodes/n"),
            some(Resource::Item(Kind::Node, "", "n"))
        );
        assert_eq!(
            path("/api/v1/namespaces"),
            some(Resource::Collection(Kind::Namespace, None))
        );
        assert_eq!(
            path("/api/v1/namespaces/x"),
            some(Resource::Item(Kind::Namespace, "", "x"))
        );
        assert_eq!(
            path("/api/v1/pods"),
            some(Resource::Collection(Kind::Pod, None))
        );
        assert_eq!(
            path("/api/v1/namespaces/x/pods"),
            some(Resource::Collection(Kind::Pod, Some("x")))
        );
        assert_eq!(
            path("/api/v1/namespaces/x/pods/p"),
            some(Resource::Item(Kind::Pod, "x", "p"))
        );
        assert_eq!(
            path("/apis/networking.k8s.io/v1/namespaces/x/networkpolicies"),
            some(Resource::Collection(Kind::NetworkPolicy, Some("x")))
        );
        assert_eq!(
            path("/apis/policy.networking.k8s.io/v1alpha2/clusternetworkpolicies"),
            some(Resource::Collection(Kind::ClusterNetworkPolicy, None))
        );
        assert_eq!(
            path("/apis/policy.networking.k8s.io/v1alpha2/clusternetworkpolicies/deny-all"),
            some(Resource::Item(Kind::ClusterNetworkPolicy, "", "deny-all"))
        );
        for unserved in [
            "/api/v1/pods/p",
            "/api/v1/namespaces/x/nodes",
            "/api/v1/networkpolicies",
            "/apis/networking.k8s.io/v1/pods",
            "/apis/networking.k8s.io/v2/networkpolicies",
            "/apis/policy.networking.k8s.io/v1alpha2/namespaces/x/clusternetworkpolicies",
            "/apis/policy.networking.k8s.io/v1alpha1/clusternetworkpolicies",
            "/api/v1/namespaces/x/pods/p/status",
            "/api/v1",
        ] {
            assert_eq!(path(unserved), None, "{unserved}");
        }
    }

    #[test]
    fn a_merge_patch_merges_maps_removes_nulls_and_replaces_the_rest() {
        let mut node = json!({"metadata": {"name": "n1", "annotations": {"a": "1", "b": "2"}},
            "spec": {"podCIDRs": ["10.0.0.0/24"]}});
        merge_patch(
            &mut node,
            &json!({"metadata": {"annotations": {"a": null, "c": "3"}}, "spec": {"podCIDRs": []}}),
        );
        assert_eq!(
            node,
            json!({"metadata": {"name": "n1", "annotations": {"b": "2", "c": "3"}},
                "spec": {"podCIDRs": []}})
        );
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
