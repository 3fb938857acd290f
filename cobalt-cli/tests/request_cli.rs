//! The request commands as a curl, libcoap or aiocoap user expects them, through the
//! real binary against a Cobalt server in this process: FETCH/PATCH/iPATCH, `-O`,
//! ETag/If-Match/If-None-Match, IANA Content-Format names, `-i`, `-o`, `--pretty` for
//! JSON and CBOR, binary data kept off terminals, and `discover` keeping quoted values.

use cobalt::proto::message::{content_format, opt, Code};
use cobalt::server::{any, get, Request, Response};
use cobalt::Scheme;
use cobalt::Server;
use std::process::Output;

#[path = "common/binary.rs"]
mod binary;

use binary::cobalt;

/// A server on loopback, run by its own runtime for the test's duration.
struct Serving {
    _rt: tokio::runtime::Runtime,
    base: String,
}

fn serve() -> Serving {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let handle = rt
        .block_on(
            Server::new()
                // Answers with the method, the options it got and the payload.
                .route(
                    "/echo",
                    any(|req: Request| async move {
                        let mut text = format!("{}", req.method());
                        for o in req.options().iter() {
                            if o.number != opt::URI_PATH {
                                text.push_str(&format!(" {}={:02x?}", o.number, o.value));
                            }
                        }
                        text.push_str(&format!(" {}", req.text()));
                        Response::text(text)
                    }),
                )
                .route(
                    "/json",
                    get(|| async {
                        Response::new(Code::CONTENT)
                            .with_payload(br#"{"t":21.5,"on":true}"#.to_vec())
                            .with_content_format(content_format::JSON)
                    }),
                )
                .route(
                    "/cbor",
                    get(|| async {
                        // {"t": 21.5, "b": h'0102'}
                        Response::new(Code::CONTENT)
                            .with_payload(vec![
                                0xa2, 0x61, b't', 0xf9, 0x4d, 0x60, 0x61, b'b', 0x42, 1, 2,
                            ])
                            .with_content_format(content_format::CBOR)
                    }),
                )
                .route(
                    "/bin",
                    get(|| async {
                        Response::new(Code::CONTENT)
                            .with_payload(vec![0u8, 1, 2, 0xff, 0xfe])
                            .with_content_format(content_format::OCTET_STREAM)
                    }),
                )
                .route(
                    "/tagged",
                    get(|| async { Response::text("v").with_etag(&[0xab, 0xcd]).with_max_age(7) })
                        .rt("sensor temp")
                        .title("a, b; c"),
                )
                .bind("127.0.0.1:0"),
        )
        .unwrap();
    let base = format!("coap://{}", handle.local_addr(Scheme::Coap).unwrap());
    std::mem::forget(handle); // stops with the runtime
    Serving { _rt: rt, base }
}

fn run(args: &[&str]) -> Output {
    cobalt().args(args).output().unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn fetch_patch_ipatch_and_options_reach_the_server() {
    let s = serve();
    let echo = format!("{}/echo", s.base);
    for (cmd, method) in [("fetch", "FETCH"), ("patch", "PATCH"), ("ipatch", "iPATCH")] {
        let o = run(&[cmd, &echo, "-p", "{}", "-t", "json"]);
        assert!(o.status.success(), "{o:?}");
        let text = stdout(&o);
        assert!(text.starts_with(method), "{cmd}: {text}");
        // Content-Format 50 (option 12) and the body arrived.
        assert!(text.contains("12=[32]") && text.ends_with("{}"), "{text}");
    }
    // -O by number and name, ETag, If-Match, If-None-Match, Accept by IANA name.
    let o = run(&[
        "get",
        &echo,
        "-O",
        "2048,hi",
        "-O",
        "Max-Age,60",
        "--etag",
        "0x0102",
        "--if-match",
        "abcd",
        "--if-none-match",
        "-A",
        "senml+cbor",
    ]);
    assert!(o.status.success(), "{o:?}");
    let text = stdout(&o);
    for expect in [
        "1=[ab, cd]",
        "4=[01, 02]",
        "5=[]",
        "14=[3c]",
        "17=[70]",
        "2048=[68, 69]",
    ] {
        assert!(text.contains(expect), "{expect} in {text}");
    }
    // Out of range and unknown values are usage errors naming the flag.
    for bad in [
        &["-t", "65536"][..],
        &["-A", "nonsense"],
        &["-O", "70000,x"],
        &["--etag", "0xz"],
    ] {
        let o = run(&[&["get", &echo][..], bad].concat());
        assert_eq!(o.status.code(), Some(2), "{bad:?}: {o:?}");
    }
}

#[test]
fn include_output_file_pretty_and_binary() {
    let s = serve();
    // -i: code and options before the body.
    let o = run(&["get", "-i", &format!("{}/tagged", s.base)]);
    assert_eq!(
        stdout(&o),
        "2.05 Content\nETag: 0xabcd\nContent-Format: 0 (text/plain;charset=utf-8)\nMax-Age: 7\n\nv"
    );
    // --pretty: JSON and CBOR (diagnostic notation).
    let o = run(&["get", "--pretty", &format!("{}/json", s.base)]);
    assert_eq!(stdout(&o), "{\n  \"on\": true,\n  \"t\": 21.5\n}\n");
    let o = run(&["get", "--pretty", &format!("{}/cbor", s.base)]);
    assert_eq!(stdout(&o), "{\n  \"t\": 21.5,\n  \"b\": h'0102'\n}\n");
    // -o FILE: the payload byte-exact; a path that cannot be written fails first.
    let dir = std::env::temp_dir().join(format!("cobalt-request-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("bin.out");
    let o = run(&[
        "get",
        &format!("{}/bin", s.base),
        "-o",
        file.to_str().unwrap(),
    ]);
    assert!(o.status.success() && o.stdout.is_empty(), "{o:?}");
    assert_eq!(std::fs::read(&file).unwrap(), [0, 1, 2, 0xff, 0xfe]);
    let o = run(&[
        "get",
        &format!("{}/bin", s.base),
        "-o",
        "/nonexistent/dir/x",
    ]);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    assert!(String::from_utf8_lossy(&o.stderr).contains("cannot write /nonexistent/dir/x"));
    // Binary data to a pipe is written as is (only a terminal is protected).
    let o = run(&["get", &format!("{}/bin", s.base)]);
    assert_eq!(o.stdout, [0, 1, 2, 0xff, 0xfe]);
    std::fs::remove_dir_all(&dir).ok();
}

/// Binary data is not dumped on a terminal: run the command with its stdout on a
/// pseudo-terminal (`script`), where it must refuse with a hint and exit 1, and `-o -`
/// must print it anyway.
#[test]
fn binary_data_is_kept_off_a_terminal() {
    if std::process::Command::new("script")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("SKIPPED: `script` (util-linux) is not installed");
        return;
    }
    let s = serve();
    let bin = env!("CARGO_BIN_EXE_cobalt");
    let on_tty = |args: &str| {
        std::process::Command::new("script")
            .args(["-qec", &format!("{bin} {args}"), "/dev/null"])
            .env_remove("RUST_LOG")
            .output()
            .unwrap()
    };
    let o = on_tty(&format!("get {}/bin", s.base));
    let text = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(1), "{text}");
    assert!(
        text.contains("5 bytes of binary data") && text.contains("-o FILE"),
        "{text}"
    );
    assert!(
        !o.stdout.contains(&0xff),
        "nothing binary reached the terminal"
    );
    let o = on_tty(&format!("get {}/bin -o -", s.base));
    assert_eq!(o.status.code(), Some(0));
    // CBOR on a terminal is refused too, with --pretty suggested.
    let o = on_tty(&format!("get {}/cbor", s.base));
    assert!(String::from_utf8_lossy(&o.stdout).contains("--pretty"));
}

#[test]
fn discover_keeps_quoted_values_and_raw_prints_the_document() {
    let s = serve();
    let o = run(&["discover", &s.base]);
    assert!(o.status.success(), "{o:?}");
    let line = stdout(&o)
        .lines()
        .find(|l| l.starts_with("/tagged"))
        .map(str::to_string)
        .unwrap();
    assert!(
        line.contains("rt=\"sensor temp\"") && line.contains("title=\"a, b; c\""),
        "{line}"
    );
    let o = run(&["discover", "--raw", &s.base]);
    let doc = stdout(&o);
    assert!(
        doc.contains("</tagged>;") && doc.contains("</echo>"),
        "{doc}"
    );
    assert!(!doc.contains('\t'), "the document as sent: {doc}");
}

#[test]
fn coaps_without_credentials_names_the_flags() {
    let o = run(&["get", "coaps://127.0.0.1:9/x"]);
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("--psk-identity") && err.contains("--ca") && !err.contains("Client::"),
        "{err}"
    );
}
