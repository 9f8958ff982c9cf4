//! Turning the libraries' errors into CNI errors, and collecting the failures of
//! best-effort work (DEL, GC, rollback).

use cni_protocol::CniError;

/// Failures collected by best-effort work (DEL, GC, rollback), reported together.
#[derive(Debug, Default)]
pub(crate) struct Errors(Vec<CniError>);

impl Errors {
    pub(crate) fn note(&mut self, result: Result<(), CniError>) {
        if let Err(e) = result {
            self.0.push(e);
        }
    }

    pub(crate) fn into_result(self) -> Result<(), CniError> {
        match self.0.len() {
            0 => Ok(()),
            // A single error keeps its code (a delegate's error passes through unchanged).
            1 => Err(self.0.into_iter().next().expect("one error")),
            _ => {
                let text: Vec<String> = self.0.iter().map(ToString::to_string).collect();
                Err(CniError::internal(text.join("; ")))
            }
        }
    }
}

pub(crate) fn linux_error(e: cni_linux::Error) -> CniError {
    CniError::internal(chain(&e))
}

/// `e` followed by its causes, `: `-separated. cni-linux keeps the kernel's answer
/// (`File exists`, `Operation not supported`, ...) as the error's source, so printing
/// only the top level would tell the user what failed but never why.
pub(crate) fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}

pub(crate) fn firewall_error(e: cni_firewall::Error) -> CniError {
    CniError::internal(e.to_string())
}
