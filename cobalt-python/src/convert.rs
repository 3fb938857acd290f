//! Cobalt's responses and errors as the plain Python values the package wraps.

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyTuple};
use std::io::ErrorKind;

/// `(code, payload, [(option number, value), ...])`: the response as it came, every
/// option in order, for `cobalt.Response`.
pub fn response_tuple<'py>(py: Python<'py>, r: &cobalt::Response) -> PyResult<Bound<'py, PyAny>> {
    let options = PyList::empty(py);
    for o in r.options.iter() {
        options.append((o.number, PyBytes::new(py, o.value)))?;
    }
    let tuple = PyTuple::new(
        py,
        [
            r.code.0.into_pyobject(py)?.into_any(),
            PyBytes::new(py, &r.payload).into_any(),
            options.into_any(),
        ],
    )?;
    Ok(tuple.into_any())
}

/// `(kind, message)`: which `cobalt` exception the error becomes, and Cobalt's message
/// (what happened and what to try).
pub fn error_tuple<'py>(py: Python<'py>, e: &cobalt::Error) -> PyResult<Bound<'py, PyAny>> {
    Ok((error_kind(e), e.to_string()).into_pyobject(py)?.into_any())
}

/// The name of the `cobalt` exception class for `e` (see `python/cobalt/_errors.py`).
pub fn error_kind(e: &cobalt::Error) -> &'static str {
    use cobalt::Error as E;
    match e {
        E::Timeout { .. } | E::Deadline(_) => "Timeout",
        E::Reset(_) => "Reset",
        E::Unreachable { .. } => "Unreachable",
        E::BadUri(_) | E::Resolve { .. } => "BadUri",
        E::BlockTransfer(_) => "BlockTransferError",
        E::Connection(_) => "ConnectionFailed",
        E::Dtls { .. } | E::Tls { .. } => "HandshakeFailed",
        E::Credentials(_) => "CredentialsError",
        E::ObservationLost { .. } => "ObservationLost",
        E::Unsupported(_) => "Unsupported",
        E::Io(io) => match io.kind() {
            ErrorKind::ConnectionRefused
            | ErrorKind::ConnectionReset
            | ErrorKind::ConnectionAborted
            | ErrorKind::NotConnected
            | ErrorKind::BrokenPipe => "ConnectionFailed",
            ErrorKind::TimedOut => "Timeout",
            _ => "CoapError",
        },
        _ => "CoapError",
    }
}
