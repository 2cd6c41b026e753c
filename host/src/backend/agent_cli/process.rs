//! The agent CLI's process group: whether it is still alive, the kill ladder that ends it
//! (SIGTERM, a grace period, SIGKILL; run on a helper thread when a call is dropped), and
//! reading its output pipes within a cap.

use crate::backend::BackendError;
use nix::errno::Errno;
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::process::Child;

/// Whether any process of group `pgid` is still running (zombies waiting for a reaper do
/// not count: where PID 1 does not reap, they linger harmlessly).
pub fn group_alive(pgid: i32) -> bool {
    match killpg(Pid::from_raw(pgid), None) {
        Err(Errno::ESRCH) => false,
        Err(_) => true,
        Ok(()) => live_members(pgid).unwrap_or(true),
    }
}

/// Scan /proc for a non-zombie process in group `pgid` (`None` when /proc is unreadable).
fn live_members(pgid: i32) -> Option<bool> {
    let entries = std::fs::read_dir("/proc").ok()?;
    for entry in entries.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else { continue };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        // `pid (comm) state ppid pgrp ...`; comm may hold spaces and parentheses.
        let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else { continue };
        let mut fields = rest.split_whitespace();
        let state = fields.next();
        let pgrp = fields.nth(1).and_then(|p| p.parse::<i32>().ok());
        if pgrp == Some(pgid) && !matches!(state, Some("Z") | Some("X")) {
            return Some(true);
        }
    }
    Some(false)
}

fn signal_group(pgid: i32, signal: Signal) {
    // ESRCH (nothing left) is the good case; nothing else can be done about other errors.
    let _ = killpg(Pid::from_raw(pgid), signal);
}

/// Owns the child; unless disarmed, dropping it runs the kill ladder on a helper thread.
pub(super) struct GroupGuard {
    pub(super) child: Option<Child>,
    pub(super) pgid: i32,
    pub(super) grace: Duration,
}

impl GroupGuard {
    pub(super) fn child(&mut self) -> Result<&mut Child, BackendError> {
        self.child.as_mut().ok_or_else(|| BackendError::ordinary("agent CLI: the child is gone"))
    }

    /// The ladder, awaited: SIGTERM to the group, up to `grace` for it to go, then SIGKILL;
    /// the leader is reaped either way. Stdin must already be closed.
    pub(super) async fn ladder(&mut self) {
        let pgid = self.pgid;
        let Some(child) = self.child.as_mut() else { return };
        signal_group(pgid, Signal::SIGTERM);
        let deadline = Instant::now() + self.grace;
        loop {
            let leader_done = !matches!(child.try_wait(), Ok(None));
            if leader_done && !group_alive(pgid) {
                return;
            }
            if Instant::now() >= deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        signal_group(pgid, Signal::SIGKILL);
        let _ = child.wait().await;
    }

    /// After a normal exit: end whatever the agent left running in its group.
    pub(super) async fn sweep(&mut self) {
        if group_alive(self.pgid) {
            self.ladder().await;
        }
    }
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        let Some(mut child) = self.child.take() else { return };
        let (pgid, grace) = (self.pgid, self.grace);
        if matches!(child.try_wait(), Ok(Some(_))) && !group_alive(pgid) {
            return;
        }
        // Dropped mid-call (cancelled): stdin is already closed with the call's future.
        signal_group(pgid, Signal::SIGTERM);
        let ladder = move || {
            let deadline = Instant::now() + grace;
            while Instant::now() < deadline {
                if !matches!(child.try_wait(), Ok(None)) && !group_alive(pgid) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            signal_group(pgid, Signal::SIGKILL);
            // SIGKILL cannot be ignored: reap the leader so no zombie of ours is left.
            while matches!(child.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(10));
            }
        };
        if std::thread::Builder::new().name("agent-cli-reaper".into()).spawn(ladder).is_err() {
            signal_group(pgid, Signal::SIGKILL);
        }
    }
}

/// Read a pipe to its end, keeping the first `cap` bytes; whether more came.
pub(super) async fn read_capped(mut pipe: impl AsyncRead + Unpin, cap: usize) -> (Vec<u8>, bool) {
    let mut kept = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    let mut over = false;
    loop {
        match pipe.read(&mut buf).await {
            Ok(0) | Err(_) => return (kept, over),
            Ok(n) => {
                let room = cap.saturating_sub(kept.len());
                kept.extend_from_slice(&buf[..n.min(room)]);
                over |= n > room;
            }
        }
    }
}
