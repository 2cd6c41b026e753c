//! A real PostgreSQL 15 for the tests and the bench: Debian's `initdb` and `pg_ctl`
//! (`/usr/lib/postgresql/15/bin`) start a fresh cluster in a temporary directory, listening
//! on a free loopback port only (no Unix socket outside its directory, no network beyond
//! 127.0.0.1), trusting local connections. As root it runs as the `postgres` user through
//! `runuser` (PostgreSQL refuses root). Dropping the [`Postgres`] stops the server and
//! removes its directory, also when the test panics. A missing PostgreSQL fails the test
//! with the install hint: nothing is skipped.

use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Where Debian installs PostgreSQL 15's server programs.
pub const PG_BIN: &str = "/usr/lib/postgresql/15/bin";

/// The install hint a test fails with when PostgreSQL is missing.
pub const INSTALL_HINT: &str = "PostgreSQL 15 is needed (Debian: apt-get install -y postgresql; ./test installs it)";

/// A running PostgreSQL server of this test's own.
pub struct Postgres {
    /// The temporary directory (mode 0755) holding the cluster's data directory.
    dir: tempfile::TempDir,
    port: u16,
    /// Run the server programs as `postgres` (we are root).
    as_postgres: bool,
}

impl Postgres {
    /// Start a fresh cluster: `initdb --no-sync` in a temporary directory, then `pg_ctl
    /// start` on a free loopback port, waiting until it accepts connections. `fsync` is off
    /// (the tests crash clients, never the server); the bench uses [`Postgres::start_durable`].
    pub fn start() -> Postgres {
        Postgres::start_with(false)
    }

    /// [`Postgres::start`] with `fsync` on: commits wait for the disk, as in production.
    pub fn start_durable() -> Postgres {
        Postgres::start_with(true)
    }

    fn start_with(fsync: bool) -> Postgres {
        let initdb = Path::new(PG_BIN).join("initdb");
        assert!(
            initdb.is_file() && Path::new(PG_BIN).join("pg_ctl").is_file(),
            "{INSTALL_HINT}: {} not found",
            initdb.display()
        );
        let as_postgres = nix::unistd::geteuid().is_root();
        let dir = tempfile::Builder::new().prefix("factory-pg-").tempdir().expect("a temporary directory");
        // The postgres user must reach the data directory inside.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
            .expect("chmod 0755 the temporary directory");
        let data = dir.path().join("data");
        std::fs::create_dir(&data).expect("the data directory");
        if as_postgres {
            let user = nix::unistd::User::from_name("postgres")
                .ok()
                .flatten()
                .unwrap_or_else(|| panic!("{INSTALL_HINT}: no `postgres` user to run the server as"));
            nix::unistd::chown(&data, Some(user.uid), Some(user.gid)).expect("chown the data directory to postgres");
        }
        let mut server = Postgres { dir, port: 0, as_postgres };
        let init = server.run(
            "initdb",
            &[
                "--no-sync",
                "--auth=trust",
                "--username=postgres",
                "--encoding=UTF8",
                "--locale=C",
                "-D",
                &server.data_arg(),
            ],
        );
        assert!(
            init.status.success(),
            "initdb failed: {}{}",
            String::from_utf8_lossy(&init.stdout),
            String::from_utf8_lossy(&init.stderr)
        );
        // A free port can be taken by someone else before the server binds it: try again.
        let mut last = None;
        for _ in 0..5 {
            server.port = free_port();
            let options = format!(
                "-c listen_addresses=127.0.0.1 -p {} -k {} -c fsync={} -c max_connections=200",
                server.port,
                server.data_arg(),
                if fsync { "on" } else { "off" }
            );
            let log = format!("{}/server.log", server.data_arg());
            let started = server
                .run("pg_ctl", &["start", "-w", "-t", "60", "-D", &server.data_arg(), "-l", &log, "-o", &options]);
            if started.status.success() {
                return server;
            }
            let log = std::fs::read_to_string(&log).unwrap_or_default();
            last = Some(format!(
                "{}{}\n{log}",
                String::from_utf8_lossy(&started.stdout),
                String::from_utf8_lossy(&started.stderr)
            ));
        }
        panic!("PostgreSQL did not start: {}", last.unwrap_or_default());
    }

    fn data_arg(&self) -> String {
        self.dir.path().join("data").to_string_lossy().into_owned()
    }

    /// The data directory.
    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// The loopback port the server listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Run one of PostgreSQL's programs (as `postgres` when we are root).
    fn run(&self, program: &str, args: &[&str]) -> Output {
        let path = Path::new(PG_BIN).join(program);
        let mut cmd = if self.as_postgres {
            let mut cmd = Command::new("runuser");
            cmd.args(["-u", "postgres", "--"]).arg(&path);
            cmd
        } else {
            Command::new(&path)
        };
        cmd.args(args).current_dir(self.dir.path()).stdin(std::process::Stdio::null());
        cmd.output().unwrap_or_else(|e| panic!("{INSTALL_HINT}: cannot run {}: {e}", path.display()))
    }

    /// Stop the server (fast shutdown: clients are disconnected); it stays down.
    pub fn stop(&self) {
        let out = self.run("pg_ctl", &["stop", "-w", "-t", "60", "-m", "fast", "-D", &self.data_arg()]);
        assert!(
            out.status.success(),
            "pg_ctl stop failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Start the server again after [`Postgres::stop`], on the same port with the same data.
    pub fn start_again(&self) {
        let log = format!("{}/server.log", self.data_arg());
        let options = format!(
            "-c listen_addresses=127.0.0.1 -p {} -k {} -c fsync=off -c max_connections=200",
            self.port,
            self.data_arg()
        );
        let out = self.run("pg_ctl", &["start", "-w", "-t", "60", "-D", &self.data_arg(), "-l", &log, "-o", &options]);
        assert!(
            out.status.success(),
            "pg_ctl start failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Stop the server (fast shutdown: clients are disconnected) and start it again on the
    /// same port with the same data.
    pub fn restart(&self) {
        let log = format!("{}/server.log", self.data_arg());
        let out = self.run("pg_ctl", &["restart", "-w", "-t", "60", "-m", "fast", "-D", &self.data_arg(), "-l", &log]);
        assert!(
            out.status.success(),
            "pg_ctl restart failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The URL of database `db` as the `postgres` user.
    pub fn url(&self, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{db}", self.port)
    }

    /// Run SQL on database `db` with `psql`, returning its unaligned, tuples-only output.
    pub fn psql(&self, db: &str, sql: &str) -> String {
        let out = Command::new(Path::new(PG_BIN).join("psql"))
            .args([
                "-X",
                "-q",
                "-A",
                "-t",
                "-v",
                "ON_ERROR_STOP=1",
                "-h",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-U",
                "postgres",
                "-d",
                db,
                "-c",
                sql,
            ])
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("{INSTALL_HINT}: cannot run psql: {e}"));
        assert!(out.status.success(), "psql `{sql}` failed: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// Create a fresh database and return its URL.
    pub fn database(&self, name: &str) -> String {
        self.psql("postgres", &format!("CREATE DATABASE \"{name}\""));
        self.url(name)
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        // Stopped before the directory goes (TempDir removes it after this).
        let _ = self.run("pg_ctl", &["stop", "-w", "-t", "30", "-m", "immediate", "-D", &self.data_arg()]);
    }
}

fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("a loopback port");
    listener.local_addr().expect("its address").port()
}
