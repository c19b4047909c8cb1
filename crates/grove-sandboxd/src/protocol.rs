//! The wire protocol between a runtime (the host side) and the exec agent.
//!
//! One byte stream each way (the agent's stdin and stdout). Every message is a frame:
//! a 4-byte big-endian header length, a 4-byte big-endian payload length, the header
//! as JSON ([`Request`] or [`Event`]), then the payload as raw bytes (stdin data and
//! output chunks; empty for every other message). Raw payloads keep output out of
//! JSON escaping; JSON keeps the headers readable and extensible.
//!
//! Execs are multiplexed by a host-chosen `id`. The agent answers each `Exec` with
//! `Started` (the process exists) or directly with `Exit` (it could not be started),
//! then any number of `Output`, then exactly one `Exit`.

use std::io::{self, Read, Write};

use serde::{de::DeserializeOwned, Deserialize, Serialize};

/// Bumped on any incompatible change; the agent announces it in [`Event::Hello`].
pub const VERSION: u32 = 1;

/// Largest header accepted (argv and env of one exec live there).
pub const MAX_HEADER: u32 = 16 * 1024 * 1024;

/// Largest payload accepted in one frame; senders chunk below it.
pub const MAX_PAYLOAD: u32 = 16 * 1024 * 1024;

/// Host to agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "t", rename_all = "snake_case")]
pub enum Request {
    /// Start a process. `env` is its complete environment; `cwd` is a path as the
    /// sandbox sees it; `max_output` caps stdout and stderr together (the rest is
    /// read and dropped). With `stdin` the process reads what `Stdin` frames carry
    /// until `CloseStdin`; without, it reads `/dev/null`.
    Exec {
        id: u64,
        argv: Vec<String>,
        cwd: String,
        env: Vec<(String, String)>,
        stdin: bool,
        max_output: u64,
    },
    /// The payload is more stdin for exec `id`.
    Stdin { id: u64 },
    /// End of stdin for exec `id`.
    CloseStdin { id: u64 },
    /// Kill the process group of exec `id` (timeout, or nobody listens any more).
    Kill { id: u64 },
}

/// Which output stream a chunk came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stream {
    Stdout,
    Stderr,
}

/// Agent to host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "t", rename_all = "snake_case")]
pub enum Event {
    /// First frame the agent sends: it is up and speaks `version`.
    Hello { version: u32, pid: u32 },
    /// The process of exec `id` exists.
    Started { id: u64 },
    /// The payload is output of exec `id`.
    Output { id: u64, stream: Stream },
    /// Exec `id` is over: `code` as a shell reports it (the exit code, or 128 + the
    /// killing signal; 127/126 when the program could not be run). `truncated` when
    /// output past the cap was dropped.
    Exit { id: u64, code: i32, truncated: bool },
}

/// Writes one frame; the caller serializes access and flushes.
pub fn write_frame<W: Write, T: Serialize>(
    w: &mut W,
    header: &T,
    payload: &[u8],
) -> io::Result<()> {
    let header = serde_json::to_vec(header).map_err(io::Error::other)?;
    let (hl, pl) = (header.len() as u64, payload.len() as u64);
    if hl > MAX_HEADER as u64 || pl > MAX_PAYLOAD as u64 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "frame larger than the protocol allows",
        ));
    }
    let mut buf = Vec::with_capacity(8 + header.len() + payload.len());
    buf.extend_from_slice(&(hl as u32).to_be_bytes());
    buf.extend_from_slice(&(pl as u32).to_be_bytes());
    buf.extend_from_slice(&header);
    buf.extend_from_slice(payload);
    w.write_all(&buf)
}

/// Reads one frame; `Ok(None)` at a clean end of stream (between frames).
pub fn read_frame<R: Read, T: DeserializeOwned>(r: &mut R) -> io::Result<Option<(T, Vec<u8>)>> {
    let mut lens = [0u8; 8];
    let mut got = 0;
    while got < lens.len() {
        match r.read(&mut lens[got..]) {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    let hl = u32::from_be_bytes(lens[..4].try_into().expect("4 bytes"));
    let pl = u32::from_be_bytes(lens[4..].try_into().expect("4 bytes"));
    if hl > MAX_HEADER || pl > MAX_PAYLOAD {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "frame larger than the protocol allows",
        ));
    }
    let mut header = vec![0u8; hl as usize];
    r.read_exact(&mut header)?;
    let mut payload = vec![0u8; pl as usize];
    r.read_exact(&mut payload)?;
    let header = serde_json::from_slice(&header)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    Ok(Some((header, payload)))
}

/// Takes one whole frame off the front of `buf`, for a host that receives the
/// agent's stdout in arbitrary chunks (an engine's attached stream). `Ok(None)` when
/// `buf` holds no whole frame yet.
pub fn take_frame<T: DeserializeOwned>(buf: &mut Vec<u8>) -> io::Result<Option<(T, Vec<u8>)>> {
    if buf.len() < 8 {
        return Ok(None);
    }
    let hl = u32::from_be_bytes(buf[..4].try_into().expect("4 bytes"));
    let pl = u32::from_be_bytes(buf[4..8].try_into().expect("4 bytes"));
    if hl > MAX_HEADER || pl > MAX_PAYLOAD {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "frame larger than the protocol allows",
        ));
    }
    let end = 8 + hl as usize + pl as usize;
    if buf.len() < end {
        return Ok(None);
    }
    let header = serde_json::from_slice(&buf[8..8 + hl as usize])
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    let payload = buf[8 + hl as usize..end].to_vec();
    buf.drain(..end);
    Ok(Some((header, payload)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_with_their_payload() {
        let mut buf = Vec::new();
        let req = Request::Exec {
            id: 7,
            argv: vec!["echo".into(), "hi".into()],
            cwd: "/w".into(),
            env: vec![("A".into(), "b".into())],
            stdin: true,
            max_output: 10,
        };
        write_frame(&mut buf, &req, b"").unwrap();
        write_frame(&mut buf, &Request::Stdin { id: 7 }, b"\x00\xffdata").unwrap();
        let mut r = &buf[..];
        let (a, pa): (Request, _) = read_frame(&mut r).unwrap().unwrap();
        let (b, pb): (Request, _) = read_frame(&mut r).unwrap().unwrap();
        assert_eq!((a, pa), (req, vec![]));
        assert_eq!(
            (b, pb),
            (Request::Stdin { id: 7 }, b"\x00\xffdata".to_vec())
        );
        assert!(read_frame::<_, Request>(&mut r).unwrap().is_none());
    }

    #[test]
    fn a_cut_frame_or_an_oversized_length_is_an_error_not_a_clean_end() {
        let mut buf = Vec::new();
        write_frame(&mut buf, &Request::Kill { id: 1 }, b"").unwrap();
        let mut cut = &buf[..buf.len() - 1];
        assert!(read_frame::<_, Request>(&mut cut).is_err());
        let huge = [0xffu8; 8];
        assert!(read_frame::<_, Request>(&mut &huge[..]).is_err());
    }
    #[test]
    fn frames_are_taken_from_a_buffer_only_when_whole() {
        let mut wire = Vec::new();
        write_frame(&mut wire, &Event::Started { id: 3 }, b"").unwrap();
        write_frame(
            &mut wire,
            &Event::Output {
                id: 3,
                stream: Stream::Stderr,
            },
            b"err",
        )
        .unwrap();
        let mut buf = Vec::new();
        let mut got = Vec::new();
        // One byte at a time, as a stream may cut it.
        for b in &wire {
            buf.push(*b);
            while let Some(frame) = take_frame::<Event>(&mut buf).unwrap() {
                got.push(frame);
            }
        }
        assert!(buf.is_empty());
        assert_eq!(
            got,
            vec![
                (Event::Started { id: 3 }, vec![]),
                (
                    Event::Output {
                        id: 3,
                        stream: Stream::Stderr
                    },
                    b"err".to_vec()
                ),
            ]
        );
        let mut huge = vec![0xffu8; 8];
        assert!(take_frame::<Event>(&mut huge).is_err());
    }
}
