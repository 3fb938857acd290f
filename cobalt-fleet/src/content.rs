//! What a simulated device serves: its resources in two profiles, plain RFC 9176
//! sensors or LwM2M 1.1 objects, and their representations (text/plain, link-format,
//! SenML-JSON and SenML-CBOR).
//!
//! - [`Profile::Rd`]: `/sensors/temp` (`rt="temperature"`) and `/sensors/hum`
//!   (`rt="humidity"`), both observable, in text/plain.
//! - [`Profile::Lwm2m`]: instance 0 of the Server object (1: Short Server ID, Lifetime,
//!   Notification Storing, Binding), the Device object (3: Manufacturer, Model and
//!   Serial Number, Firmware Version, Battery Level, Error Code, Supported Binding)
//!   and the Temperature object (3303: Min/Max Measured Value, Sensor Value, Units).
//!   A single resource reads as text/plain by default, anything larger as SenML-JSON
//!   (LwM2M 1.1 §7.4.4); SenML-CBOR on request (Accept 112). Everything is read-only;
//!   Reboot (`/3/0/4`) can be executed and does nothing.

use crate::sensor::{Quantity, Sensor};
use cobalt_proto::link_format::{self, Link};
use cobalt_proto::message::Code;

/// Content-Format numbers the devices use.
pub mod format {
    /// text/plain; charset=utf-8.
    pub const TEXT: u16 = 0;
    /// application/link-format.
    pub const LINK_FORMAT: u16 = 40;
    /// application/senml+json.
    pub const SENML_JSON: u16 = 110;
    /// application/senml+cbor.
    pub const SENML_CBOR: u16 = 112;
}

/// Which resources a device serves, and which registration it makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Profile {
    /// Sensors registered at an RFC 9176 resource directory.
    Rd,
    /// LwM2M 1.1 objects registered at an LwM2M server.
    Lwm2m,
}

/// What a device's representations are made of.
#[derive(Debug, Clone, Copy)]
pub struct View<'a> {
    /// The endpoint name (the Device object's Serial Number).
    pub ep: &'a str,
    /// The registration lifetime (the Server object's Lifetime).
    pub lifetime: u32,
    /// The sensors, by [`Quantity::index`].
    pub sensors: &'a [Sensor; 2],
}

/// A representation of a resource: its Content-Format and bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Representation {
    /// Content-Format.
    pub format: u16,
    /// The body.
    pub body: Vec<u8>,
}

/// One LwM2M resource value.
#[derive(Debug, Clone, PartialEq)]
enum Value {
    Text(String),
    Int(i64),
    Float(f64),
    Bool(bool),
}

impl Value {
    fn text(&self) -> String {
        match self {
            Value::Text(s) => s.clone(),
            Value::Int(i) => i.to_string(),
            Value::Float(f) => f.to_string(),
            Value::Bool(b) => u8::from(*b).to_string(),
        }
    }
}

/// A resource (or resource instance) of an object instance: its id, its instance id
/// for a multiple resource, and its value.
type Entry = (u16, Option<u16>, Value);

impl Profile {
    /// The links a device registers (and lists at `/.well-known/core`).
    pub fn links(self) -> Vec<Link> {
        match self {
            Profile::Rd => [("temp", "temperature"), ("hum", "humidity")]
                .into_iter()
                .map(|(name, rt)| {
                    Link::new(format!("/sensors/{name}"))
                        .with_rt(rt)
                        .with_if("core.s")
                        .with_ct(format::TEXT)
                        .with_obs()
                })
                .collect(),
            Profile::Lwm2m => ["/1/0", "/3/0", "/3303/0"]
                .into_iter()
                .map(Link::new)
                .collect(),
        }
    }

    /// `/.well-known/core`, filtered by the request's query items (RFC 6690 §4.1).
    pub fn well_known_core<'q>(self, query: impl Iterator<Item = &'q str>) -> String {
        let links = self.links();
        let picked: Vec<Link> = link_format::filter_by_query(&links, query)
            .into_iter()
            .cloned()
            .collect();
        link_format::encode(&picked)
    }

    /// Which sensor the resource at `path` shows, if any (so its observers are notified
    /// when that sensor changes).
    pub fn observable(self, path: &[&str]) -> Option<Quantity> {
        match (self, path) {
            (Profile::Rd, ["sensors", "temp"]) => Some(Quantity::Temperature),
            (Profile::Rd, ["sensors", "hum"]) => Some(Quantity::Humidity),
            (Profile::Lwm2m, ["3303", rest @ ..]) if rest.first().is_none_or(|i| *i == "0") => {
                Some(Quantity::Temperature)
            }
            _ => None,
        }
    }

    /// The answer to GET `path` with `accept`: the representation, or the error code.
    pub fn read(
        self,
        view: &View<'_>,
        path: &[&str],
        accept: Option<u16>,
    ) -> Result<Representation, Code> {
        match self {
            Profile::Rd => {
                let q = match path {
                    ["sensors", "temp"] => Quantity::Temperature,
                    ["sensors", "hum"] => Quantity::Humidity,
                    _ => return Err(Code::NOT_FOUND),
                };
                if accept.is_some_and(|a| a != format::TEXT) {
                    return Err(Code::NOT_ACCEPTABLE);
                }
                Ok(Representation {
                    format: format::TEXT,
                    body: rounded(view.sensors[q.index()].value())
                        .to_string()
                        .into_bytes(),
                })
            }
            Profile::Lwm2m => read_lwm2m(view, path, accept),
        }
    }

    /// The answer to POST `path` (LwM2M Execute): 2.04 for Reboot, which changes
    /// nothing here; 4.05 for anything else that exists; 4.04 otherwise.
    pub fn execute(self, view: &View<'_>, path: &[&str]) -> Code {
        match (self, path) {
            (Profile::Lwm2m, ["3", "0", "4"]) => Code::CHANGED,
            _ if self.read(view, path, None).is_ok() => Code::METHOD_NOT_ALLOWED,
            _ => Code::NOT_FOUND,
        }
    }
}

/// `v` as the shortest decimal that reads back as the hundredths it was rounded to.
fn rounded(v: f32) -> f64 {
    (f64::from(v) * 100.0).round() / 100.0
}

/// Instance 0 of `object`, if the device has that object.
fn object(view: &View<'_>, object: u16) -> Option<Vec<Entry>> {
    let temp = &view.sensors[Quantity::Temperature.index()];
    let text = |s: &str| Value::Text(s.to_string());
    Some(match object {
        1 => vec![
            (0, None, Value::Int(1)),
            (1, None, Value::Int(i64::from(view.lifetime))),
            (6, None, Value::Bool(false)),
            (7, None, text("U")),
        ],
        3 => vec![
            (0, None, text("Cobalt")),
            (1, None, text("cobalt-devices")),
            (2, None, text(view.ep)),
            (3, None, text(env!("CARGO_PKG_VERSION"))),
            (9, None, Value::Int(100)),
            (11, Some(0), Value::Int(0)),
            (16, None, text("U")),
        ],
        3303 => vec![
            (5601, None, Value::Float(rounded(temp.min()))),
            (5602, None, Value::Float(rounded(temp.max()))),
            (5700, None, Value::Float(rounded(temp.value()))),
            (5701, None, text("Cel")),
        ],
        _ => return None,
    })
}

fn read_lwm2m(view: &View<'_>, path: &[&str], accept: Option<u16>) -> Result<Representation, Code> {
    let ids: Vec<u16> = path
        .iter()
        .map(|s| s.parse::<u16>())
        .collect::<Result<_, _>>()
        .map_err(|_| Code::NOT_FOUND)?;
    let (obj, rest) = ids.split_first().ok_or(Code::NOT_FOUND)?;
    let entries = object(view, *obj).ok_or(Code::NOT_FOUND)?;
    let picked: Vec<Entry> = match rest {
        [] | [0] => entries,
        [0, res] => entries.into_iter().filter(|e| e.0 == *res).collect(),
        [0, res, inst] => entries
            .into_iter()
            .filter(|e| e.0 == *res && e.1 == Some(*inst))
            .collect(),
        _ => Vec::new(),
    };
    if picked.is_empty() {
        return Err(Code::NOT_FOUND);
    }
    let single =
        picked.len() == 1 && (rest.len() == 3 || (rest.len() == 2 && picked[0].1.is_none()));
    let format = accept.unwrap_or(if single {
        format::TEXT
    } else {
        format::SENML_JSON
    });
    let base = format!("/{obj}/0/");
    let body = match format {
        format::TEXT if single => picked[0].2.text().into_bytes(),
        format::SENML_JSON => senml_json(&base, &picked),
        format::SENML_CBOR => senml_cbor(&base, &picked),
        _ => return Err(Code::NOT_ACCEPTABLE),
    };
    Ok(Representation { format, body })
}

fn entry_name((res, inst, _): &Entry) -> String {
    match inst {
        Some(i) => format!("{res}/{i}"),
        None => res.to_string(),
    }
}

/// SenML-JSON (RFC 8428) as LwM2M 1.1 §7.4.4 uses it: the base name on the first record.
fn senml_json(base: &str, entries: &[Entry]) -> Vec<u8> {
    let records: Vec<serde_json::Value> = entries
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let mut r = serde_json::Map::new();
            if i == 0 {
                r.insert("bn".into(), base.into());
            }
            r.insert("n".into(), entry_name(e).into());
            let (key, value) = match &e.2 {
                Value::Text(s) => ("vs", serde_json::Value::from(s.as_str())),
                Value::Int(v) => ("v", (*v).into()),
                Value::Float(v) => ("v", (*v).into()),
                Value::Bool(b) => ("vb", (*b).into()),
            };
            r.insert(key.into(), value);
            serde_json::Value::Object(r)
        })
        .collect();
    serde_json::to_vec(&records).unwrap_or_default()
}

/// SenML-CBOR (RFC 8428 §6): the same records with the integer labels bn −2, n 0,
/// v 2, vs 3, vb 4.
fn senml_cbor(base: &str, entries: &[Entry]) -> Vec<u8> {
    use ciborium::value::Value as Cbor;
    let records: Vec<Cbor> = entries
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let mut r = Vec::new();
            if i == 0 {
                r.push((Cbor::from(-2), Cbor::from(base)));
            }
            r.push((Cbor::from(0), Cbor::from(entry_name(e))));
            r.push(match &e.2 {
                Value::Text(s) => (Cbor::from(3), Cbor::from(s.as_str())),
                Value::Int(v) => (Cbor::from(2), Cbor::from(*v)),
                Value::Float(v) => (Cbor::from(2), Cbor::from(*v)),
                Value::Bool(b) => (Cbor::from(4), Cbor::from(*b)),
            });
            Cbor::Map(r)
        })
        .collect();
    let mut out = Vec::new();
    match ciborium::into_writer(&Cbor::Array(records), &mut out) {
        Ok(()) => out,
        Err(_) => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(sensors: &[Sensor; 2]) -> View<'_> {
        View {
            ep: "dev-7",
            lifetime: 300,
            sensors,
        }
    }

    fn sensors() -> [Sensor; 2] {
        [
            Sensor::new(Quantity::Temperature, 7),
            Sensor::new(Quantity::Humidity, 7),
        ]
    }

    #[test]
    fn rd_profile_registers_observable_typed_sensors() {
        let doc = link_format::encode(&Profile::Rd.links());
        assert!(doc.contains("</sensors/temp>;rt=\"temperature\""), "{doc}");
        assert!(doc.contains(";obs"), "{doc}");
        let only_temp = Profile::Rd.well_known_core(["rt=temp*"].into_iter());
        assert!(only_temp.contains("/sensors/temp") && !only_temp.contains("/sensors/hum"));
        let s = sensors();
        let r = Profile::Rd
            .read(&view(&s), &["sensors", "temp"], None)
            .unwrap();
        assert_eq!(r.format, format::TEXT);
        let shown: f32 = std::str::from_utf8(&r.body).unwrap().parse().unwrap();
        assert_eq!(shown, s[0].value());
        assert_eq!(
            Profile::Rd.read(&view(&s), &["sensors", "temp"], Some(50)),
            Err(Code::NOT_ACCEPTABLE)
        );
        assert_eq!(
            Profile::Rd.read(&view(&s), &["x"], None),
            Err(Code::NOT_FOUND)
        );
    }

    #[test]
    fn lwm2m_reads_follow_the_content_formats() {
        let s = sensors();
        let v = view(&s);
        let single = Profile::Lwm2m
            .read(&v, &["3303", "0", "5700"], None)
            .unwrap();
        assert_eq!(single.format, format::TEXT);
        assert_eq!(
            String::from_utf8(single.body).unwrap(),
            rounded(s[0].value()).to_string()
        );
        let device = Profile::Lwm2m.read(&v, &["3", "0"], None).unwrap();
        assert_eq!(device.format, format::SENML_JSON);
        let json: serde_json::Value = serde_json::from_slice(&device.body).unwrap();
        assert_eq!(json[0]["bn"], "/3/0/");
        assert_eq!(json[0]["n"], "0");
        assert_eq!(json[0]["vs"], "Cobalt");
        assert!(json
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["n"] == "11/0" && r["v"] == 0));
        assert!(json
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["n"] == "2" && r["vs"] == "dev-7"));
        let cbor = Profile::Lwm2m
            .read(&v, &["3303", "0", "5700"], Some(format::SENML_CBOR))
            .unwrap();
        let value: ciborium::value::Value = ciborium::from_reader(&cbor.body[..]).unwrap();
        let rec = &value.as_array().unwrap()[0];
        let map = rec.as_map().unwrap();
        assert!(map
            .iter()
            .any(|(k, v)| k == &(-2).into() && v == &"/3303/0/".into()));
        assert_eq!(
            Profile::Lwm2m.read(&v, &["3", "0", "11"], Some(format::TEXT)),
            Err(Code::NOT_ACCEPTABLE),
            "a multiple resource has no text/plain form"
        );
        assert_eq!(
            Profile::Lwm2m.read(&v, &["3", "1"], None),
            Err(Code::NOT_FOUND)
        );
        assert_eq!(Profile::Lwm2m.read(&v, &["5"], None), Err(Code::NOT_FOUND));
        assert_eq!(
            Profile::Lwm2m.read(&v, &["3", "0", "11542"], None),
            Err(Code::NOT_FOUND)
        );
        assert_eq!(Profile::Lwm2m.execute(&v, &["3", "0", "4"]), Code::CHANGED);
        assert_eq!(
            Profile::Lwm2m.execute(&v, &["3", "0", "0"]),
            Code::METHOD_NOT_ALLOWED
        );
        assert_eq!(
            Profile::Lwm2m.observable(&["3303", "0", "5700"]),
            Some(Quantity::Temperature)
        );
        assert_eq!(Profile::Lwm2m.observable(&["3", "0"]), None);
    }
}
