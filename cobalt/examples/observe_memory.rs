//! What one client's observations cost in memory: opens N observations of one
//! observable resource from one [`cobalt::Client`], each read by a task of its own,
//! or with `--set` all members of one [`cobalt::ObservationSet`] read by one task (as
//! the mashup does), and reports the heap bytes and the RSS growth per observation
//! once every observation has had a few notifications.
//!
//! ```text
//! cargo run --release --example observe_memory -- 10000 [--set]
//! ```
//!
//! The server runs in a child process (this program with `--serve`), so only the
//! client's memory is counted; its resource changes every 200 ms.

use cobalt::server::{get, Observable};
use cobalt::{Client, EndpointConfig, Scheme, Server};
use std::alloc::{GlobalAlloc, Layout, System};
use std::io::BufRead;
use std::sync::atomic::{AtomicIsize, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The system allocator, counting the bytes live.
struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(
            new_size as isize - layout.size() as isize,
            Ordering::Relaxed,
        );
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn rss_bytes() -> i64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<i64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// The child: serves `/o`, changing every 200 ms, and prints its port.
async fn serve() -> cobalt::Result<()> {
    let changes = Observable::new();
    let count = Arc::new(AtomicU64::new(0));
    let c = count.clone();
    let limits = cobalt::server::ServerLimits {
        max_observers: 1_000_000,
        max_observers_per_ip: 1_000_000,
        ..Default::default()
    };
    let server = Server::new()
        .limits(limits)
        .route(
            "/o",
            get(move || {
                let n = c.load(Ordering::Relaxed);
                async move { format!("{n}") }
            })
            .observable(&changes),
        )
        .bind("127.0.0.1:0")
        .await?;
    println!("{}", server.local_addr(Scheme::Coap).unwrap().port());
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        count.fetch_add(1, Ordering::Relaxed);
        changes.changed();
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let arg = std::env::args().nth(1).unwrap_or_else(|| "10000".into());
    if arg == "--serve" {
        serve().await?;
        return Ok(());
    }
    let n: usize = arg.parse()?;
    let mut child = std::process::Command::new(std::env::current_exe()?)
        .arg("--serve")
        .stdout(std::process::Stdio::piped())
        .spawn()?;
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().expect("piped")).read_line(&mut line)?;
    let uri = format!("coap://127.0.0.1:{}/o", line.trim());

    let client = Client::with_config(EndpointConfig {
        max_client_exchanges: n + 100,
        ..EndpointConfig::default()
    })?;
    client.get(&uri).await?; // the driver and its socket exist before the baseline
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (heap0, rss0) = (LIVE.load(Ordering::Relaxed), rss_bytes());

    let notifications = Arc::new(AtomicU64::new(0));
    let first = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(n);
    if std::env::args().any(|a| a == "--set") {
        let mut set = cobalt::ObservationSet::new(&client);
        for i in 0..n {
            set.observe(i, &uri).await?;
        }
        let (notifications, first) = (notifications.clone(), first.clone());
        tasks.push(tokio::spawn(async move {
            let mut seen = vec![false; n];
            while let Some((i, Some(Ok(_)))) = set.next().await {
                if !std::mem::replace(&mut seen[i], true) {
                    first.fetch_add(1, Ordering::Relaxed);
                }
                notifications.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    for _ in 0..n * usize::from(tasks.is_empty()) {
        let (client, uri) = (client.clone(), uri.clone());
        let (notifications, first) = (notifications.clone(), first.clone());
        tasks.push(tokio::spawn(async move {
            let Ok(mut o) = client.observe(&uri).await else {
                return;
            };
            let mut seen = false;
            while let Some(Ok(_)) = o.next().await {
                if !seen {
                    seen = true;
                    first.fetch_add(1, Ordering::Relaxed);
                }
                notifications.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    while first.load(Ordering::Relaxed) < n as u64 {
        if started.elapsed() > Duration::from_secs(120) {
            eprintln!(
                "only {} of {n} observing after 120 s",
                first.load(Ordering::Relaxed)
            );
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let observing = started.elapsed();
    let before = notifications.load(Ordering::Relaxed);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = notifications.load(Ordering::Relaxed);
    let (heap1, rss1) = (LIVE.load(Ordering::Relaxed), rss_bytes());
    println!(
        "{n} observations (all observing after {:.1} s, {:.0} notifications/s): \
         heap {} bytes / observation, RSS {} bytes / observation",
        observing.as_secs_f64(),
        (after - before) as f64 / 3.0,
        (heap1 - heap0) / n as isize,
        (rss1 - rss0) / n as i64,
    );
    child.kill()?;
    for t in tasks {
        t.abort();
    }
    Ok(())
}
