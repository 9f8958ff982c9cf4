//! Running a child that reads stdin and writes stdout: the one way the suite does it
//! (delegating to an IPAM plugin, cnitool running a plugin, the firewall tools).

use nix::errno::Errno;
use std::io::{self, Write};
use std::process::{Child, Command, Output};
use std::time::Duration;

/// How often a spawn that fails with "text file busy" is retried, a second apart.
const TEXT_BUSY_RETRIES: u32 = 5;

/// Spawns `command`, retrying while its program file is still open for writing
/// (ETXTBSY: a plugin binary being installed or replaced).
pub fn spawn_retrying(command: &mut Command) -> io::Result<Child> {
    let mut attempt = 0;
    loop {
        match command.spawn() {
            Err(e)
                if e.raw_os_error() == Some(Errno::ETXTBSY as i32)
                    && attempt < TEXT_BUSY_RETRIES =>
            {
                attempt += 1;
                std::thread::sleep(Duration::from_secs(1));
            }
            other => return other,
        }
    }
}

/// Feeds `stdin` to `child` (if its stdin is piped) while collecting its output and
/// waiting for it. The input is written from a second thread: a child that writes a
/// lot before it has read everything would otherwise deadlock against us. Returns
/// the output, and how writing stdin went (a child may exit without reading it all,
/// so callers decide whether a broken pipe matters).
pub fn wait_feeding(mut child: Child, stdin: &[u8]) -> (io::Result<Output>, io::Result<()>) {
    std::thread::scope(|scope| {
        let writer = child
            .stdin
            .take()
            .map(|mut pipe| scope.spawn(move || pipe.write_all(stdin)));
        let output = child.wait_with_output();
        let written = writer.map_or(Ok(()), |w| w.join().unwrap_or(Ok(())));
        (output, written)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Stdio;

    #[test]
    fn a_child_that_answers_before_reading_everything_does_not_deadlock() {
        // Far more than a pipe buffer each way: `cat` writes before we finish writing.
        let input = vec![b'x'; 1 << 20];
        let child = Command::new("cat")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let (output, written) = wait_feeding(child, &input);
        written.unwrap();
        assert_eq!(output.unwrap().stdout.len(), input.len());
    }
}
