//! Framing of postcard messages on a byte stream: a little-endian u32 length,
//! then a postcard-encoded [`Frame`] carrying the protocol version. Used for
//! both the node-manager protocol and the coordinator's control port.

use std::fmt;
use std::io::{self, Read, Write};

use dilu_abi::cluster_wire::{Frame, MAX_FRAME_BYTES, PROTOCOL_VERSION};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// Why a frame could not be read or written.
#[derive(Debug)]
pub enum WireError {
    Io(io::Error),
    TooLarge(u32),
    Decode(String),
    Version { theirs: u16 },
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WireError::Io(error) => write!(f, "connection error: {error}"),
            WireError::TooLarge(length) => {
                write!(
                    f,
                    "frame of {length} bytes exceeds the {MAX_FRAME_BYTES}-byte limit"
                )
            }
            WireError::Decode(error) => write!(f, "malformed message: {error}"),
            WireError::Version { theirs } => write!(
                f,
                "peer speaks protocol version {theirs}, this build speaks {PROTOCOL_VERSION}"
            ),
        }
    }
}

impl std::error::Error for WireError {}

impl From<io::Error> for WireError {
    fn from(error: io::Error) -> Self {
        WireError::Io(error)
    }
}

impl WireError {
    /// True when the read merely timed out with no bytes consumed.
    pub fn is_timeout(&self) -> bool {
        matches!(self, WireError::Io(error)
            if matches!(error.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut))
    }
}

/// Encodes `body` with the current protocol version and writes one frame.
pub fn write_frame<T: Serialize>(stream: &mut impl Write, body: &T) -> Result<(), WireError> {
    let frame = Frame {
        version: PROTOCOL_VERSION,
        body,
    };
    let bytes =
        postcard::to_stdvec(&frame).map_err(|error| WireError::Decode(error.to_string()))?;
    let length = u32::try_from(bytes.len()).map_err(|_| WireError::TooLarge(u32::MAX))?;
    if length > MAX_FRAME_BYTES {
        return Err(WireError::TooLarge(length));
    }
    let mut buffer = Vec::with_capacity(bytes.len() + 4);
    buffer.extend_from_slice(&length.to_le_bytes());
    buffer.extend_from_slice(&bytes);
    stream.write_all(&buffer)?;
    stream.flush()?;
    Ok(())
}

/// Reads one frame and decodes its body; refuses oversized frames and other
/// protocol versions.
pub fn read_frame<T: DeserializeOwned>(stream: &mut impl Read) -> Result<T, WireError> {
    let mut length_bytes = [0u8; 4];
    stream.read_exact(&mut length_bytes)?;
    let length = u32::from_le_bytes(length_bytes);
    if length > MAX_FRAME_BYTES {
        return Err(WireError::TooLarge(length));
    }
    let mut bytes = vec![0u8; length as usize];
    stream.read_exact(&mut bytes)?;
    // The version is the first field, so it decodes even when the body of a
    // newer protocol does not.
    let version: (u16, &[u8]) = postcard::take_from_bytes::<u16>(&bytes)
        .map_err(|error| WireError::Decode(error.to_string()))?;
    if version.0 != PROTOCOL_VERSION {
        return Err(WireError::Version { theirs: version.0 });
    }
    let frame: Frame<T> =
        postcard::from_bytes(&bytes).map_err(|error| WireError::Decode(error.to_string()))?;
    Ok(frame.body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use dilu_abi::cluster_wire::{CoordinatorMessage, NodeMessage};

    #[test]
    fn frames_round_trip() {
        let mut buffer = Vec::new();
        write_frame(&mut buffer, &CoordinatorMessage::Remove { instance_id: 9 }).unwrap();
        write_frame(&mut buffer, &CoordinatorMessage::Poll).unwrap();
        let mut reader = buffer.as_slice();
        let first: CoordinatorMessage = read_frame(&mut reader).unwrap();
        assert_eq!(first, CoordinatorMessage::Remove { instance_id: 9 });
        let second: CoordinatorMessage = read_frame(&mut reader).unwrap();
        assert_eq!(second, CoordinatorMessage::Poll);
    }

    #[test]
    fn garbage_lengths_versions_and_bodies_are_errors_not_panics() {
        let huge = u32::MAX.to_le_bytes();
        let error = read_frame::<NodeMessage>(&mut huge.as_slice()).unwrap_err();
        assert!(matches!(error, WireError::TooLarge(_)), "{error}");

        let mut other_version = Vec::new();
        let frame = postcard::to_stdvec(&Frame {
            version: 99u16,
            body: CoordinatorMessage::Poll,
        })
        .unwrap();
        other_version.extend_from_slice(&(frame.len() as u32).to_le_bytes());
        other_version.extend_from_slice(&frame);
        let error = read_frame::<CoordinatorMessage>(&mut other_version.as_slice()).unwrap_err();
        assert!(error.to_string().contains("version 99"), "{error}");

        let mut junk = 3u32.to_le_bytes().to_vec();
        // (A version below 128 is one postcard byte.)
        junk.extend_from_slice(&[PROTOCOL_VERSION as u8, 0, 0xff]);
        let error = read_frame::<CoordinatorMessage>(&mut junk.as_slice()).unwrap_err();
        assert!(matches!(error, WireError::Decode(_)), "{error}");

        let truncated = [5u8, 0, 0, 0, PROTOCOL_VERSION as u8];
        assert!(matches!(
            read_frame::<CoordinatorMessage>(&mut truncated.as_slice()),
            Err(WireError::Io(_))
        ));
    }
}
