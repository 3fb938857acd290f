//! Reads the server's gauges from its Prometheus endpoint (`cobalt serve --metrics`).

use serde_json::{Map, Value};
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Every gauge of the server, summed over its labels (shards, transports); `null`
/// when the endpoint cannot be read.
pub async fn read(addr: SocketAddr) -> Value {
    match tokio::time::timeout(Duration::from_secs(3), fetch(addr)).await {
        Ok(Ok(text)) => Value::Object(parse(&text)),
        _ => Value::Null,
    }
}

async fn fetch(addr: SocketAddr) -> std::io::Result<String> {
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: metrics\r\n\r\n")
        .await?;
    let mut body = Vec::new();
    s.read_to_end(&mut body).await?;
    Ok(String::from_utf8_lossy(&body).into_owned())
}

/// Sums the samples of each metric declared `# TYPE name gauge`.
fn parse(text: &str) -> Map<String, Value> {
    let gauges: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.strip_suffix(" gauge"))
        .collect();
    let mut sums: std::collections::BTreeMap<&str, f64> = Default::default();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let name = series.split('{').next().unwrap_or(series);
        if let (true, Ok(v)) = (gauges.contains(&name), value.parse::<f64>()) {
            *sums.entry(name).or_default() += v;
        }
    }
    sums.into_iter()
        .map(|(k, v)| (k.to_string(), Value::from(v)))
        .collect()
}
