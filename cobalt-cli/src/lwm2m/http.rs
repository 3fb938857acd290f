//! The HTTP/JSON view of `cobalt lwm2m` (axum):
//!
//! | request | does |
//! |---|---|
//! | `GET /clients` | the registered clients |
//! | `GET /clients/{ep}` | one client |
//! | `GET /clients/{ep}/{path}?format=json\|cbor\|tlv\|text` | Read (default json) |
//! | `GET /clients/{ep}/{path}/observe?format=..` | Observe, as Server-Sent Events |
//! | `PUT /clients/{ep}/{path}?format=..&mode=replace\|update` | Write the JSON body |
//! | `GET /clients/{ep}/{path}?format=link` | Discover (link-format) |
//! | `POST /clients/{ep}/{obj}/{inst}/{res}` | Execute, the body as arguments |
//! | `POST /clients/{ep}/{obj}?format=..` | Create an instance from the JSON body |
//! | `DELETE /clients/{ep}/{obj}/{inst}` | Delete an instance |
//!
//! A Write's body is a value (`"+02"`, `42`, `true`, typed by the object's model
//! where known), a typed value (`{"type":"integer","value":42}`), or a list of
//! `{"path":..,"type":..,"value":..}` for several resources of an instance.

use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use cobalt::Code;
use cobalt_lwm2m::{Entry, Format, Kind, LwPath, Lwm2mServer, ManageError, Value, WriteMode};
use serde::Deserialize;
use serde_json::json;
use tower::limit::ConcurrencyLimitLayer;

/// Largest request body accepted (a Write's values, an Execute's arguments).
const MAX_BODY: usize = 64 * 1024;

/// Most HTTP requests served at once, observation streams included; more wait.
const MAX_REQUESTS: usize = 256;

/// Serves the view on `listener` until the task is aborted.
pub async fn serve(listener: tokio::net::TcpListener, lwm2m: Lwm2mServer) {
    if let Err(e) = axum::serve(listener, router(lwm2m)).await {
        eprintln!("cobalt: the HTTP view stopped: {e}");
    }
}

fn router(lwm2m: Lwm2mServer) -> Router {
    Router::new()
        .route("/clients", get(list))
        .route("/clients/{ep}", get(one))
        .route(
            "/clients/{ep}/{*path}",
            get(read).put(write).post(execute).delete(delete),
        )
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .layer(ConcurrencyLimitLayer::new(MAX_REQUESTS))
        .with_state(lwm2m)
}

/// An HTTP error with a JSON body `{"error": "..."}`.
#[derive(Debug)]
struct HttpError(StatusCode, String);

impl IntoResponse for HttpError {
    fn into_response(self) -> Response {
        (self.0, Json(json!({ "error": self.1 }))).into_response()
    }
}

impl From<ManageError> for HttpError {
    fn from(e: ManageError) -> HttpError {
        let status = match &e {
            ManageError::NotRegistered(_) => StatusCode::NOT_FOUND,
            ManageError::BadPath(_) => StatusCode::BAD_REQUEST,
            ManageError::Unreachable(_) | ManageError::TooManyObservations(_) => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            ManageError::Request(
                cobalt::Error::Timeout { .. } | cobalt::Error::Deadline { .. },
            ) => StatusCode::GATEWAY_TIMEOUT,
            ManageError::Refused { code, .. } => match *code {
                Code::BAD_REQUEST => StatusCode::BAD_REQUEST,
                Code::UNAUTHORIZED => StatusCode::UNAUTHORIZED,
                Code::FORBIDDEN => StatusCode::FORBIDDEN,
                Code::NOT_FOUND => StatusCode::NOT_FOUND,
                Code::METHOD_NOT_ALLOWED => StatusCode::METHOD_NOT_ALLOWED,
                Code::NOT_ACCEPTABLE => StatusCode::NOT_ACCEPTABLE,
                Code::UNSUPPORTED_CONTENT_FORMAT => StatusCode::UNSUPPORTED_MEDIA_TYPE,
                _ => StatusCode::BAD_GATEWAY,
            },
            _ => StatusCode::BAD_GATEWAY,
        };
        HttpError(status, e.to_string())
    }
}

fn bad_request(message: impl Into<String>) -> HttpError {
    HttpError(StatusCode::BAD_REQUEST, message.into())
}

async fn list(State(lwm2m): State<Lwm2mServer>) -> Response {
    Json(lwm2m.clients().await).into_response()
}

async fn one(State(lwm2m): State<Lwm2mServer>, Path(ep): Path<String>) -> Response {
    match lwm2m.client(&ep).await {
        Some(info) => Json(info).into_response(),
        None => HttpError::from(ManageError::NotRegistered(ep)).into_response(),
    }
}

/// The `?format=` and `?mode=` of a request.
#[derive(Debug, Deserialize)]
struct Options {
    format: Option<String>,
    mode: Option<String>,
}

impl Options {
    fn format(&self, default: Format) -> Result<Format, HttpError> {
        match &self.format {
            None => Ok(default),
            Some(f) => f.parse().map_err(|e| bad_request(format!("{e}"))),
        }
    }
}

/// The path in the URL, and whether it ends in `/observe`.
fn lwm2m_path(rest: &str) -> Result<(LwPath, bool), HttpError> {
    let (rest, observe) = match rest.strip_suffix("/observe") {
        Some(p) => (p, true),
        None => (rest, false),
    };
    let path = rest.parse().map_err(|e| bad_request(format!("{e}")))?;
    Ok((path, observe))
}

async fn read(
    State(lwm2m): State<Lwm2mServer>,
    Path((ep, rest)): Path<(String, String)>,
    Query(options): Query<Options>,
) -> Result<Response, HttpError> {
    let (path, observe) = lwm2m_path(&rest)?;
    if options.format.as_deref() == Some("link") && !observe {
        let links = lwm2m.device(&ep).await?.discover(&path).await?;
        let body = cobalt::proto::link_format::encode(&links);
        return Ok(([("content-type", "application/link-format")], body).into_response());
    }
    let format = options.format(Format::SenmlJson)?;
    let device = lwm2m.device(&ep).await?;
    if !observe {
        let values = device.read(&path, format).await?;
        return Ok(Json(json!({ "endpoint": ep, "path": path, "values": values })).into_response());
    }
    let observation = device.observe(&path, format).await?;
    // Each notification is one event; the stream ends (and the observation is
    // dropped, which ends it at the device) when the HTTP client goes away.
    let events = futures_util::stream::unfold(Some(observation), |state| async move {
        let mut observation = state?;
        let event = match observation.next().await? {
            Ok(values) => Event::default()
                .event("values")
                .json_data(json!({ "path": observation.path(), "values": values })),
            Err(e) => Event::default()
                .event("error")
                .json_data(json!({ "error": e.to_string() })),
        };
        Some((event, Some(observation)))
    });
    Ok(Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response())
}

async fn write(
    State(lwm2m): State<Lwm2mServer>,
    Path((ep, rest)): Path<(String, String)>,
    Query(options): Query<Options>,
    body: String,
) -> Result<Response, HttpError> {
    let (path, _) = lwm2m_path(&rest)?;
    let entries = entries_from_json(&path, &json_body(&body)?)?;
    let single = matches!(entries.as_slice(), [e] if e.path == path);
    let default = match entries.first().map(|e| &e.value) {
        Some(Value::Opaque(_)) if single => Format::Opaque,
        _ if single => Format::Text,
        _ => Format::SenmlJson,
    };
    let mode = match options.mode.as_deref() {
        None | Some("replace") => WriteMode::Replace,
        Some("update") => WriteMode::Update,
        Some(other) => {
            return Err(bad_request(format!(
                "mode {other:?}: give replace or update"
            )))
        }
    };
    let device = lwm2m.device(&ep).await?;
    device
        .write(&path, &entries, options.format(default)?, mode)
        .await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// POST on a resource executes it (the body as arguments); on an object, creates an
/// instance from the JSON body (a list of `{"path":"/o/i/r",...}` values).
async fn execute(
    State(lwm2m): State<Lwm2mServer>,
    Path((ep, rest)): Path<(String, String)>,
    Query(options): Query<Options>,
    body: String,
) -> Result<Response, HttpError> {
    let (path, _) = lwm2m_path(&rest)?;
    let device = lwm2m.device(&ep).await?;
    if path.depth() == 1 {
        let entries = entries_from_json(&path, &json_body(&body)?)?;
        let format = options.format(Format::SenmlJson)?;
        device.create(path.object, &entries, format).await?;
        return Ok(StatusCode::CREATED.into_response());
    }
    device.execute(&path, Some(body.as_str())).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn delete(
    State(lwm2m): State<Lwm2mServer>,
    Path((ep, rest)): Path<(String, String)>,
) -> Result<Response, HttpError> {
    let (path, _) = lwm2m_path(&rest)?;
    lwm2m.device(&ep).await?.delete(&path).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// A request body as JSON, whatever its Content-Type says (`curl -d` sends form
/// encoding).
fn json_body(body: &str) -> Result<serde_json::Value, HttpError> {
    serde_json::from_str(body).map_err(|e| {
        bad_request(format!(
            "the body is not JSON ({e}): give a value such as \"+02\" or 42, or a list of {{\"path\":..,\"value\":..}}"
        ))
    })
}

/// The entries a Write's (or Create's) JSON body gives for `path`.
fn entries_from_json(path: &LwPath, body: &serde_json::Value) -> Result<Vec<Entry>, HttpError> {
    let items = match body {
        serde_json::Value::Array(items) => items.as_slice(),
        one => std::slice::from_ref(one),
    };
    items
        .iter()
        .map(|item| {
            let at = match item.get("path") {
                Some(p) => p
                    .as_str()
                    .ok_or_else(|| bad_request("`path` is text such as \"/3/0/14\""))?
                    .parse()
                    .map_err(|e| bad_request(format!("{e}")))?,
                None => *path,
            };
            let kind = cobalt_lwm2m::resource_kind(at.object, at.resource.unwrap_or(u16::MAX));
            let value = value_from_json(item, kind)
                .ok_or_else(|| bad_request(format!("{item} is not a value for {at}")))?;
            Ok(Entry::new(at, value))
        })
        .collect()
}

/// A value from JSON: `{"type":..,"value":..}`, or a bare value typed by `kind`.
fn value_from_json(item: &serde_json::Value, kind: Option<Kind>) -> Option<Value> {
    let (kind, raw) = match (item.get("type").and_then(|t| t.as_str()), item.get("value")) {
        (Some(t), Some(v)) => (Some(kind_named(t)?), v),
        (None, Some(v)) => (kind, v),
        _ => (kind, item),
    };
    use serde_json::Value as J;
    Some(match (raw, kind) {
        (J::String(s), Some(Kind::Opaque)) => Value::Opaque(super::hex_bytes(s)?),
        (J::String(s), Some(k)) => Value::from_text(s, k)?,
        (J::String(s), None) => Value::String(s.clone()),
        (J::Bool(b), Some(Kind::Boolean) | None) => Value::Boolean(*b),
        (J::Number(n), Some(k)) => Value::from_text(&n.to_string(), k)?,
        (J::Number(n), None) => match n.as_i64() {
            Some(i) => Value::Integer(i),
            None => Value::Float(n.as_f64()?),
        },
        _ => return None,
    })
}

fn kind_named(name: &str) -> Option<Kind> {
    Some(match name {
        "integer" => Kind::Integer,
        "unsigned" => Kind::Unsigned,
        "float" => Kind::Float,
        "boolean" => Kind::Boolean,
        "string" => Kind::String,
        "opaque" => Kind::Opaque,
        "time" => Kind::Time,
        "objlnk" => Kind::ObjectLink,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_bodies_become_typed_entries() {
        let offset = LwPath::resource(3, 0, 14);
        let e = entries_from_json(&offset, &json!("+02")).unwrap();
        assert_eq!(e, vec![Entry::new(offset, Value::String("+02".into()))]);
        let lifetime = LwPath::resource(1, 0, 1);
        let e = entries_from_json(&lifetime, &json!(300)).unwrap();
        assert_eq!(e[0].value, Value::Integer(300));
        let e = entries_from_json(&lifetime, &json!({"type": "unsigned", "value": 7})).unwrap();
        assert_eq!(e[0].value, Value::Unsigned(7));
        let sensor = LwPath::resource(3303, 0, 5700);
        let e = entries_from_json(&sensor, &json!(21.5)).unwrap();
        assert_eq!(e[0].value, Value::Float(21.5));
        let e = entries_from_json(&sensor, &json!({"type": "opaque", "value": "00ff"})).unwrap();
        assert_eq!(e[0].value, Value::Opaque(vec![0, 0xff]));
        let instance = LwPath::instance(3, 0);
        let e = entries_from_json(
            &instance,
            &json!([{"path": "/3/0/14", "value": "+01"}, {"path": "/3/0/15", "value": "UTC"}]),
        )
        .unwrap();
        assert_eq!(e.len(), 2);
        assert_eq!(e[1].path, LwPath::resource(3, 0, 15));
        for bad in [
            json!({"type": "integer", "value": "x"}),
            json!({"type": "nope", "value": 1}),
            json!({"type": "opaque", "value": "0"}),
            json!([{"path": 5, "value": 1}]),
            json!(null),
        ] {
            assert!(entries_from_json(&sensor, &bad).is_err(), "{bad}");
        }
        assert!(entries_from_json(&lifetime, &json!("soon")).is_err());
    }

    #[test]
    fn urls_name_lwm2m_paths_and_observe() {
        assert_eq!(
            lwm2m_path("3/0/13").unwrap(),
            (LwPath::resource(3, 0, 13), false)
        );
        assert_eq!(
            lwm2m_path("3/0/13/observe").unwrap(),
            (LwPath::resource(3, 0, 13), true)
        );
        assert!(lwm2m_path("3/x").is_err());
        assert!(lwm2m_path("observe").is_err());
    }
}
