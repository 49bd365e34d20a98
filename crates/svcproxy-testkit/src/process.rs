//! Processes a test starts: [`die_with_test`] ties a child's life to the test's, so
//! that a test binary killed outright (SIGKILL, a closed pipe) leaves no child of
//! its running; its destructors, which kill children otherwise, never run then.

use std::process::Command;

/// Makes the process `cmd` starts receive SIGKILL when the thread that starts it
/// ends (the kernel's parent-death signal follows the spawning thread): the test's
/// own thread, whose end kills the child in any case.
pub fn die_with_test(cmd: &mut Command) -> &mut Command {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure runs in the child between fork and exec and only makes
    // one system call (prctl PR_SET_PDEATHSIG), which is async-signal-safe.
    #[allow(unsafe_code)]
    unsafe {
        cmd.pre_exec(|| {
            rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))
                .map_err(std::io::Error::from)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn a_child_dies_with_the_thread_that_started_it() {
        let child = std::thread::spawn(|| {
            die_with_test(&mut Command::new("sleep"))
                .arg("30")
                .spawn()
                .expect("spawn sleep")
        })
        .join()
        .unwrap();
        let mut child = child;
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                assert!(!status.success(), "{status}");
                return;
            }
            assert!(Instant::now() < deadline, "the child outlived its thread");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}
