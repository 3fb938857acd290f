use super::*;
use std::time::Duration;

fn env(vars: &[(&str, &str)]) -> Vec<(String, String)> {
    vars.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn defaults_are_the_library_defaults() {
    let c = Config::default();
    c.validate().unwrap();
    assert_eq!(c.endpoint, EndpointConfig::default());
    assert_eq!(c.limits, ServerLimits::default());
    assert_eq!(c.connections, TcpServerLimits::default());
    assert_eq!(c.dtls, DtlsConfig::default());
    assert_eq!(c.server.socket_addr(), "[::]:5683".parse().unwrap());
    assert_eq!(c.server.metrics_addr, None);
    assert_eq!(c.runtime.shards, 0);
    assert_eq!(c.runtime.recv_batch, DEFAULT_RECV_BATCH);
    assert_eq!(c.log.level, "info");
    assert_eq!(Config::loader().build().unwrap(), c);
    assert_eq!(Config::from_toml("").unwrap(), c);
}

#[test]
fn default_toml_parses_back_to_the_defaults() {
    let text = Config::default_toml();
    assert_eq!(Config::from_toml(&text).unwrap(), Config::default());
    assert!(text.contains("[endpoint]"), "{text}");
    assert!(
        text.contains("# default: \"2s\"; allowed: 1ms to 600s\nack_timeout = \"2s\""),
        "{text}"
    );
    assert!(text.contains("metrics_addr = \"\""), "{text}");
    assert!(text.contains("response_timeout = \"auto\""), "{text}");
}

#[test]
fn every_key_is_documented_and_every_documented_key_exists() {
    let c = Config::default();
    let table = c.to_table();
    let sections = c.sections();
    assert_eq!(
        table.keys().collect::<Vec<_>>(),
        {
            let mut names: Vec<_> = sections.iter().map(|(s, _, _)| s.to_string()).collect();
            names.sort();
            names
        }
        .iter()
        .collect::<Vec<_>>()
    );
    for (section, _, params) in sections {
        let mut serialized: Vec<&String> = table[section].as_table().unwrap().keys().collect();
        let mut documented: Vec<&str> = params.iter().map(|p| p.key).collect();
        serialized.sort();
        documented.sort();
        assert_eq!(serialized, documented, "[{section}]");
        for p in params {
            assert!(p.ok, "{section}.{} default is allowed", p.key);
        }
    }
}

#[test]
fn every_key_can_be_set_from_the_environment_and_the_command_line() {
    // The key list and each key's type come from the sections' serde, so every key
    // takes its own default written as text.
    let table = Config::default().to_table();
    let mut vars = Vec::new();
    for (section, keys) in &table {
        for (key, value) in keys.as_table().unwrap() {
            let text = match value {
                toml::Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            Config::loader()
                .set(&format!("{section}.{key}"), &text, "--set")
                .unwrap();
            vars.push((
                format!("COBALT_{}_{}", section, key).to_ascii_uppercase(),
                text,
            ));
        }
    }
    assert_eq!(vars.len(), 73);
    let c = Config::loader().env(vars).unwrap().build().unwrap();
    assert_eq!(c, Config::default());
}

#[test]
fn the_settings_types_own_the_ranges() {
    // A value refused by a settings type's own `validate` is refused by the file with
    // the same allowed range, named by section.
    let endpoint = EndpointConfig {
        ack_timeout: Duration::ZERO,
        ..EndpointConfig::default()
    };
    let e = endpoint.validate().unwrap_err();
    assert_eq!((e.key, e.allowed), ("ack_timeout", "1ms to 600s"));
    let c = Config {
        endpoint,
        ..Config::default()
    };
    assert_eq!(
        c.validate().unwrap_err().to_string(),
        "invalid value for `endpoint.ack_timeout`: \"0s\"; allowed 1ms to 600s"
    );
    let mut connections = TcpServerLimits::default();
    connections.connection.keepalive = Some(Duration::from_secs(2 * 86_400));
    assert_eq!(connections.validate().unwrap_err().key, "keepalive");
    let dtls = DtlsConfig {
        max_sessions: 0,
        ..DtlsConfig::default()
    };
    assert_eq!(dtls.validate().unwrap_err().key, "max_sessions");
    let limits = ServerLimits {
        block_szx: 7,
        ..ServerLimits::default()
    };
    assert_eq!(limits.validate().unwrap_err().key, "block_szx");
}

#[test]
fn a_changed_config_renders_and_parses_back() {
    let mut c = Config::default();
    c.endpoint.ack_timeout = Duration::from_millis(1500);
    c.endpoint.ack_random_factor = 1.25;
    c.endpoint.response_timeout = Some(Duration::from_secs(90));
    c.endpoint.dedup_rerun_safe = false;
    c.limits.block_szx = 2;
    c.runtime.shards = 3;
    c.server.bind = "127.0.0.1".parse().unwrap();
    c.server.metrics_addr = Some("[::1]:9100".parse().unwrap());
    c.log.level = "debug".into();
    let text = c.to_toml();
    assert!(text.contains("ack_timeout = \"1500ms\""), "{text}");
    assert!(text.contains("response_timeout = \"90s\""), "{text}");
    assert_eq!(Config::from_toml(&text).unwrap(), c);
}

#[test]
fn file_overrides_defaults_key_by_key() {
    let c = Config::from_toml(
        r#"
        [endpoint]
        ack_timeout = "3s"
        max_retransmit = 2
        ack_random_factor = 2
        [runtime]
        shards = 4
        [server]
        port = 5684
        metrics_addr = "127.0.0.1:9100"
        [log]
        level = "debug"
        "#,
    )
    .unwrap();
    assert_eq!(c.endpoint.ack_timeout, Duration::from_secs(3));
    assert_eq!(c.endpoint.max_retransmit, 2);
    assert_eq!(c.endpoint.ack_random_factor, 2.0);
    assert_eq!(c.endpoint.nstart, 1, "untouched keys keep their default");
    assert_eq!(c.runtime.shards, 4);
    assert_eq!(c.server.port, 5684);
    assert_eq!(c.server.bind, Config::default().server.bind);
    assert_eq!(
        c.server.metrics_addr,
        Some("127.0.0.1:9100".parse().unwrap())
    );
    assert_eq!(c.log.level, "debug");
}

#[test]
fn file_is_read_from_disk() {
    let path = std::env::temp_dir().join(format!("cobalt-config-test-{}.toml", std::process::id()));
    std::fs::write(&path, "[server]\nport = 6000\n").unwrap();
    let c = Config::loader().file(&path).unwrap().build().unwrap();
    std::fs::remove_file(&path).unwrap();
    assert_eq!(c.server.port, 6000);
    let e = Config::loader().file(&path).unwrap_err();
    assert!(matches!(e, ConfigError::Read { .. }), "{e}");
    assert!(e.to_string().contains("cobalt-config-test"), "{e}");
}

#[test]
fn env_overrides_file_and_set_overrides_env() {
    let c = Config::loader()
        .toml("[endpoint]\nack_timeout = \"3s\"\nnstart = 2\n", "f.toml")
        .unwrap()
        .env(env(&[
            ("COBALT_ENDPOINT_ACK_TIMEOUT", "4s"),
            ("COBALT_SERVER_PORT", "6001"),
            ("COBALT_SERVER_BIND", "127.0.0.1"),
            ("COBALT_LOG_LEVEL", "warn"),
            ("COBALT_ENDPOINT_DEDUP_RERUN_SAFE", "false"),
            ("COBALT_REQUIRE_PEERS", "1"),
            ("COBALT_CONFIG", "elsewhere.toml"),
            ("PATH", "/bin"),
        ]))
        .unwrap()
        .set("server.port", "6002", "--port")
        .unwrap()
        .set_arg("endpoint.response_timeout=30s", "--set")
        .unwrap()
        .build()
        .unwrap();
    assert_eq!(c.endpoint.ack_timeout, Duration::from_secs(4));
    assert_eq!(c.endpoint.nstart, 2);
    assert!(!c.endpoint.dedup_rerun_safe);
    assert_eq!(c.endpoint.response_timeout, Some(Duration::from_secs(30)));
    assert_eq!(c.server.port, 6002);
    assert_eq!(c.server.bind, "127.0.0.1".parse::<IpAddr>().unwrap());
    assert_eq!(c.log.level, "warn");
}

#[test]
fn unknown_keys_are_refused_naming_the_key() {
    let e = Config::from_toml("[endpoint]\nack_timout = \"2s\"\n").unwrap_err();
    assert!(matches!(e, ConfigError::Parse { .. }));
    assert!(e.to_string().contains("ack_timout"), "{e}");
    let e = Config::from_toml("[endpont]\nack_timeout = \"2s\"\n").unwrap_err();
    assert!(e.to_string().contains("endpont"), "{e}");
    let e = Config::from_toml("port = 5683\n").unwrap_err();
    assert!(e.to_string().contains("port"), "{e}");

    let e = Config::loader()
        .env(env(&[("COBALT_ENDPOINT_ACK_TIMOUT", "3s")]))
        .unwrap_err();
    assert_eq!(
        e,
        ConfigError::UnknownKey {
            key: "endpoint.ack_timout".into(),
            origin: "COBALT_ENDPOINT_ACK_TIMOUT".into()
        }
    );
    let e = Config::loader()
        .set_arg("server.prot=1", "--set")
        .unwrap_err();
    assert!(e.to_string().contains("server.prot"), "{e}");
    let e = Config::loader().set_arg("port=1", "--set").unwrap_err();
    assert!(e.to_string().contains("`port`"), "{e}");
}

#[test]
fn values_out_of_range_name_the_key_and_the_range() {
    let cases = [
        ("[endpoint]\nnstart = 0", "endpoint.nstart", "1 to 1024"),
        (
            "[endpoint]\nack_timeout = \"0s\"",
            "endpoint.ack_timeout",
            "1ms to 600s",
        ),
        (
            "[endpoint]\nack_random_factor = 0.5",
            "endpoint.ack_random_factor",
            "1.0 to 10.0",
        ),
        ("[endpoint]\ntoken_len = 9", "endpoint.token_len", "1 to 8"),
        (
            "[endpoint]\nmax_latency = \"2h\"",
            "endpoint.max_latency",
            "0s to 3600s",
        ),
        (
            "[limits]\nblock_szx = 7",
            "limits.block_szx",
            "0 to 6 (16 to 1024 bytes)",
        ),
        (
            "[limits]\nobserve_con_every = 0",
            "limits.observe_con_every",
            "1 to 1000000",
        ),
        (
            "[runtime]\nrecv_batch = 0",
            "runtime.recv_batch",
            "1 to 4096",
        ),
        ("[runtime]\nshards = 5000", "runtime.shards", "0 to 1024"),
        (
            "[log]\nlevel = \"loud\"",
            "log.level",
            "off, error, warn, info, debug, trace",
        ),
    ];
    for (text, key, range) in cases {
        let e = Config::from_toml(text).unwrap_err();
        match &e {
            ConfigError::OutOfRange {
                key: k, allowed, ..
            } => {
                assert_eq!((k.as_str(), allowed.as_str()), (key, range), "{text}")
            }
            other => panic!("{text}: {other:?}"),
        }
        let message = e.to_string();
        assert!(
            message.contains(key) && message.contains(range),
            "{message}"
        );
    }
    let e = Config::loader()
        .env(env(&[("COBALT_ENDPOINT_NSTART", "0")]))
        .unwrap()
        .build()
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "invalid value for `endpoint.nstart`: 0; allowed 1 to 1024"
    );
}

#[test]
fn values_of_the_wrong_type_name_the_key() {
    let e = Config::loader()
        .set("server.port", "abc", "--set")
        .unwrap_err();
    assert!(matches!(e, ConfigError::BadValue { .. }), "{e:?}");
    assert!(e.to_string().contains("server.port"), "{e}");
    let e = Config::loader()
        .set("server.port", "70000", "COBALT_SERVER_PORT")
        .unwrap_err();
    assert!(
        e.to_string().contains("server.port") && e.to_string().contains("COBALT_SERVER_PORT"),
        "{e}"
    );
    let e = Config::loader()
        .set("endpoint.ack_timeout", "soon", "--set")
        .unwrap_err();
    assert!(e.to_string().contains("endpoint.ack_timeout"), "{e}");
    let e = Config::loader()
        .set("server.bind", "localhost", "--set")
        .unwrap_err();
    assert!(e.to_string().contains("server.bind"), "{e}");
    let e = Config::from_toml("[server]\nport = \"x\"").unwrap_err();
    assert!(e.to_string().contains("port"), "{e}");
    let e = Config::from_toml("[endpoint]\nack_timeout = \"2 parsecs\"").unwrap_err();
    assert!(e.to_string().contains("parsecs"), "{e}");
}

#[test]
fn durations_in_a_file_take_units_or_seconds() {
    let c = Config::from_toml(
        "[endpoint]\nack_timeout = 3\nseparate_ack_delay = 0.5\nmax_latency = \"1m30s\"",
    )
    .unwrap();
    assert_eq!(c.endpoint.ack_timeout, Duration::from_secs(3));
    assert_eq!(c.endpoint.separate_ack_delay, Duration::from_millis(500));
    assert_eq!(c.endpoint.max_latency, Duration::from_secs(90));
    assert_eq!(format_duration(c.endpoint.max_latency), "90s");
    assert_eq!(parse_duration("1500ms"), Ok(Duration::from_millis(1500)));
}

#[test]
fn connection_settings_reach_the_listeners() {
    let c = Config::loader()
        .toml(
            "[connections]\nmax_connections = 10\nidle_timeout = 0\nkeepalive = \"5s\"\nbert = false\n",
            "test.toml",
        )
        .unwrap()
        .set("connections.handshake_timeout", "2s", "--set")
        .unwrap()
        .build()
        .unwrap();
    let l = &c.connections;
    assert_eq!(l.max_connections, 10);
    assert_eq!(l.connection.idle_timeout, None, "0 means never");
    assert_eq!(l.connection.keepalive, Some(Duration::from_secs(5)));
    assert!(!l.connection.block_wise_transfer);
    assert_eq!(l.handshake_timeout, Duration::from_secs(2));
    let e = Config::from_toml("[connections]\nbert = true\nkeepalve = \"5s\"\n").unwrap_err();
    assert!(
        matches!(e, ConfigError::Parse { .. }) && e.to_string().contains("keepalve"),
        "{e}"
    );
    let e = Config::loader()
        .set("connections.block_wise_transfer", "true", "--set")
        .unwrap_err();
    assert!(matches!(e, ConfigError::UnknownKey { .. }), "{e}");
    for bad in [
        "connections.max_connections=0",
        "connections.max_message_size=100",
        "connections.csm_timeout=0",
        "connections.keepalive=2d",
    ] {
        let (key, value) = bad.split_once('=').unwrap();
        let e = Config::loader()
            .set(key, value, "--set")
            .unwrap()
            .build()
            .unwrap_err();
        assert!(e.to_string().contains(key), "{bad}: {e}");
    }
}

#[test]
fn congestion_control_is_set_by_name_from_every_source() {
    use cobalt_proto::congestion::Algorithm;
    let c = Config::from_toml("[endpoint]\ncongestion_control = \"cocoa\"\n").unwrap();
    assert_eq!(c.endpoint.congestion_control, Algorithm::Cocoa);
    let c = Config::loader()
        .env(env(&[(
            "COBALT_ENDPOINT_CONGESTION_CONTROL",
            "cocoa-strong",
        )]))
        .unwrap()
        .set("endpoint.congestion_control", "fasor", "--set")
        .unwrap()
        .build()
        .unwrap();
    assert_eq!(c.endpoint.congestion_control, Algorithm::Fasor);
    assert!(Config::default_toml().contains("congestion_control = \"fasor\""));
    let e = Config::loader()
        .set("endpoint.congestion_control", "reno", "--set")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("endpoint.congestion_control") && e.contains("cocoa-strong"),
        "{e}"
    );
    let e = Config::from_toml("[endpoint]\nmax_congestion_peers = 0\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("endpoint.max_congestion_peers"), "{e}");
}

#[test]
fn observe_and_upload_budgets_reach_the_server_limits() {
    let c = Config::loader()
        .toml(
            "[limits]\nmax_observers_per_ip = 7\nobserve_min_interval = \"250ms\"\nobserve_batch = 64\n",
            "test.toml",
        )
        .unwrap()
        .env(env(&[
            ("COBALT_LIMITS_MAX_UPLOADS_PER_IP", "9"),
            ("COBALT_LIMITS_UPLOAD_IDLE_TIMEOUT", "90s"),
        ]))
        .unwrap()
        .set("limits.max_uploads_per_peer", "3", "--set")
        .unwrap()
        .set_arg("limits.max_upload_memory_per_ip=2097152", "--set")
        .unwrap()
        .set("limits.refusal_max_age", "30", "--set")
        .unwrap()
        .build()
        .unwrap();
    let l = &c.limits;
    assert_eq!(l.max_observers_per_ip, 7);
    assert_eq!(l.observe_min_interval, Duration::from_millis(250));
    assert_eq!(l.observe_batch, 64);
    let u = &l.uploads;
    assert_eq!((u.max_uploads_per_ip, u.max_uploads_per_peer), (9, 3));
    assert_eq!(u.max_upload_memory_per_ip, 2 << 20);
    assert_eq!(u.upload_idle_timeout, Duration::from_secs(90));
    assert_eq!(u.refusal_max_age, 30);
    for (bad, allowed) in [
        ("limits.max_observers_per_ip=0", "1 to 100000000"),
        ("limits.observe_batch=0", "1 to 65536"),
        ("limits.observe_min_interval=2h", "0s to 1h"),
        ("limits.max_uploads_per_ip=0", "1 to 1000000"),
        ("limits.max_uploads_per_peer=100", "1 to max_uploads_per_ip"),
        (
            "limits.max_upload_memory_per_ip=1000",
            "max_body to max_upload_memory",
        ),
        ("limits.upload_idle_timeout=0", "1s to 1h"),
        ("limits.refusal_max_age=100000", "0 to 86400"),
    ] {
        let e = Config::loader()
            .set_arg(bad, "--set")
            .unwrap()
            .build()
            .unwrap_err();
        let key = bad.split_once('=').unwrap().0;
        assert!(
            e.to_string().contains(key) && e.to_string().contains(allowed),
            "{bad}: {e}"
        );
    }
}

#[test]
fn the_file_becomes_the_server_settings() {
    let c = Config::loader()
        .toml(
            "[runtime]\nshards = 3\nsocket_recv_buffer = 0\n[endpoint]\nipv6_budget_prefix = 56\n",
            "t.toml",
        )
        .unwrap()
        .set("dtls.max_handshakes_per_ip", "7", "--set")
        .unwrap()
        .build()
        .unwrap();
    let s = c.server_settings();
    assert_eq!(s.endpoint.ipv6_budget_prefix.bits(), 56);
    assert_eq!(s.shards, Some(3));
    assert_eq!(s.recv_batch, Some(DEFAULT_RECV_BATCH));
    assert_eq!(s.socket_buffers.recv, 0);
    assert_eq!(s.socket_buffers.send, DEFAULT_SOCKET_BUFFER);
    assert_eq!(s.dtls.max_handshakes_per_ip, 7);
    assert_eq!(s.limits, c.limits);
    assert_eq!(s.connections, c.connections);
    assert_eq!(
        Config::default().server_settings().shards,
        None,
        "0: one per core"
    );
    let refused = Config::loader().set("endpoint.ipv6_budget_prefix", "129", "--set");
    let err = refused.and_then(|l| l.build()).unwrap_err().to_string();
    assert!(err.contains("ipv6_budget_prefix"), "{err}");
}
