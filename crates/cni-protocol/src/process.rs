//! Running a child that reads stdin and writes stdout: the one way the suite does it
//! (delegating to an IPAM plugin, running the firewall tools).

use std::io::{self, Write};
use std::process::{Child, Output};

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
    use std::process::{Command, Stdio};

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
