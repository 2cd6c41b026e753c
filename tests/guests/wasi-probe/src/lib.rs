//! `wasi-probe`: a test factory built for `wasm32-wasip2`, so it imports WASI and uses std
//! as an ordinary program would. It reports what it observed — environment variables,
//! arguments, a listing of `/`, file reads and writes at the paths it is given, a TCP
//! connect, a DNS lookup, a UDP datagram, stdin — as JSON, and prints to stdout and stderr,
//! so `tests/sandbox.rs` can check that the host denies all of it by default and grants
//! exactly what `--allow-read` says.

use factory_sdk::prelude::*;
use std::io::Write;

#[derive(Deserialize, Default)]
#[serde(default)]
struct Args {
    /// Files to read (`std::fs::read_to_string`).
    read: Vec<String>,
    /// Files to create and write.
    write: Vec<String>,
    /// Directories to list (`/` is always listed).
    list: Vec<String>,
    /// Where to connect (default `127.0.0.1:9`).
    connect: Option<String>,
    /// Fail (after observing) unless this file can be read: lets a test end an attempt with
    /// an error and resume it once the file exists.
    require: Option<String>,
    /// A `host:port` to resolve (a DNS lookup).
    resolve: Option<String>,
    /// A `host:port` to send a UDP datagram to (after binding a UDP socket).
    udp: Option<String>,
    /// Read stdin to its end.
    stdin: bool,
}

/// `{"ok": value}` or `{"err": message}`.
fn outcome<T: Into<Value>>(result: std::io::Result<T>) -> Value {
    match result {
        Ok(value) => json!({ "ok": value.into() }),
        Err(e) => json!({ "err": e.to_string() }),
    }
}

fn list(dir: &str) -> std::io::Result<Vec<String>> {
    let mut names = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        names.push(entry?.file_name().to_string_lossy().into_owned());
    }
    names.sort();
    Ok(names)
}

fn resolve(addr: &str) -> std::io::Result<Vec<String>> {
    use std::net::ToSocketAddrs;
    Ok(addr.to_socket_addrs()?.map(|a| a.to_string()).collect())
}

fn udp(addr: &str) -> std::io::Result<usize> {
    let socket = std::net::UdpSocket::bind("0.0.0.0:0")?;
    socket.send_to(b"wasi-probe datagram", addr)
}

fn stdin() -> std::io::Result<String> {
    let mut text = String::new();
    std::io::Read::read_to_string(&mut std::io::stdin(), &mut text)?;
    Ok(text)
}

fn write(path: &str) -> std::io::Result<bool> {
    let mut file = std::fs::File::create(path)?;
    file.write_all(b"written by wasi-probe\n")?;
    Ok(true)
}

struct WasiProbe;

impl Factory for WasiProbe {
    type Output = Value;

    fn meta() -> Meta {
        Meta::new(
            "wasi-probe",
            "Reports what a WASI guest can see. args: { read?, write?, list?: string[], connect?, require?, resolve?, udp?: string, stdin?: bool }",
        )
        .phase("Probe")
    }

    async fn run(ctx: Ctx) -> Result<Value, Error> {
        let args: Args = ctx.args()?;
        ctx.phase("Probe");
        println!("wasi-probe: hello on stdout");
        eprintln!("wasi-probe: hello on stderr");
        let env: Vec<(String, String)> = std::env::vars().collect();
        let argv: Vec<String> = std::env::args().collect();
        let mut listed = factory_sdk::serde_json::Map::new();
        for dir in std::iter::once("/".to_string()).chain(args.list) {
            listed.insert(dir.clone(), outcome(list(&dir)));
        }
        let mut read = factory_sdk::serde_json::Map::new();
        for path in args.read {
            read.insert(path.clone(), outcome(std::fs::read_to_string(&path)));
        }
        let mut written = factory_sdk::serde_json::Map::new();
        for path in args.write {
            written.insert(path.clone(), outcome(write(&path)));
        }
        let addr = args.connect.unwrap_or_else(|| "127.0.0.1:9".to_string());
        let connect = outcome(std::net::TcpStream::connect(addr.as_str()).map(|_| true));
        let resolved = args.resolve.as_deref().map(|a| outcome(resolve(a)));
        let sent = args.udp.as_deref().map(|a| outcome(udp(a)));
        let read_stdin = args.stdin.then(|| outcome(stdin()));
        if let Some(path) = args.require {
            if let Err(e) = std::fs::read_to_string(&path) {
                return Err(Error::from(format!("required file `{path}` is not readable: {e}")));
            }
        }
        Ok(json!({
            "env": env,
            "args": argv,
            "list": listed,
            "read": read,
            "write": written,
            "connect": { "addr": addr, "outcome": connect },
            "resolve": resolved,
            "udp": sent,
            "stdin": read_stdin,
        }))
    }
}

factory_sdk::export!(WasiProbe);
