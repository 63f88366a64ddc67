//! ZMQ message shapes: the live `[topic, seq, payload]` message and the
//! replay replies, checked before any payload is decoded.

use std::ops::Deref;

use super::error::WireError;

/// Sequence number that ends a replay: u64::MAX (the engines send -1 as 8 bytes).
pub const REPLAY_END_SEQ: u64 = u64::MAX;

fn seq_of(frame: &[u8], what: &str) -> Result<u64, WireError> {
    let bytes: [u8; 8] = frame.try_into().map_err(|_| {
        WireError::message(format!("{what}: sequence frame has {} bytes, expected 8 (u64 big-endian)", frame.len()))
    })?;
    Ok(u64::from_be_bytes(bytes))
}

/// Checks the 3-frame shape [topic, seq(8 bytes BE), payload]; returns (seq, payload).
/// `frames` may be owned bytes or ZMQ messages received in place.
pub fn split_frames<F: Deref<Target = [u8]>>(frames: &[F]) -> Result<(u64, &[u8]), WireError> {
    let [_topic, seq, payload] = frames else {
        return Err(WireError::message(format!(
            "live message has {} frames, expected 3 [topic, seq, payload]",
            frames.len()
        )));
    };
    Ok((seq_of(seq, "live message")?, payload))
}

/// One reply of an engine's replay ROUTER, as a DEALER receives it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplayReply<'a> {
    /// A buffered batch.
    Batch { seq: u64, payload: &'a [u8] },
    /// The end marker: no more replies for this request.
    End,
}

/// Parses a replay reply: `[b"", seq, payload]` (vLLM <= 0.25, SGLang <= 0.5.20)
/// or `[b"", topic, seq, payload]` (newer); the end marker has seq u64::MAX.
pub fn split_replay_frames<F: Deref<Target = [u8]>>(frames: &[F]) -> Result<ReplayReply<'_>, WireError> {
    let (delimiter, seq, payload) = match frames {
        [delimiter, seq, payload] => (delimiter, seq, payload),
        [delimiter, _topic, seq, payload] => (delimiter, seq, payload),
        _ => {
            return Err(WireError::message(format!(
                "replay reply has {} frames, expected [\"\", (topic,) seq, payload]",
                frames.len()
            )))
        }
    };
    if !delimiter.is_empty() {
        return Err(WireError::message("replay reply does not start with an empty delimiter frame"));
    }
    let seq = seq_of(seq, "replay reply")?;
    if seq == REPLAY_END_SEQ {
        return Ok(ReplayReply::End);
    }
    Ok(ReplayReply::Batch { seq, payload })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn live_message_shape() {
        let frames = vec![b"t".to_vec(), 5u64.to_be_bytes().to_vec(), vec![0x90]];
        assert_eq!(split_frames(&frames).unwrap(), (5, &[0x90][..]));
        let empty_topic = vec![vec![], u64::MAX.to_be_bytes().to_vec(), vec![]];
        assert_eq!(split_frames(&empty_topic).unwrap(), (u64::MAX, &[][..]));
    }

    #[test]
    fn wrong_live_shapes_fail() {
        let seq = 1u64.to_be_bytes().to_vec();
        for frames in [
            vec![],
            vec![seq.clone(), vec![1]],
            vec![vec![], seq.clone(), vec![1], vec![2]],
            vec![vec![], vec![0; 7], vec![1]],
            vec![vec![], vec![0; 9], vec![1]],
        ] {
            let err = split_frames(&frames).unwrap_err();
            assert!(err.to_string().contains("malformed"), "{err}");
        }
    }

    #[test]
    fn replay_shapes() {
        let seq = 9u64.to_be_bytes().to_vec();
        let three = vec![vec![], seq.clone(), vec![7]];
        let four = vec![vec![], b"topic".to_vec(), seq.clone(), vec![7]];
        for frames in [&three, &four] {
            assert_eq!(split_replay_frames(frames).unwrap(), ReplayReply::Batch { seq: 9, payload: &[7] });
        }
        let end3 = vec![vec![], vec![0xff; 8], vec![]];
        let end4 = vec![vec![], vec![], vec![0xff; 8], vec![]];
        assert_eq!(split_replay_frames(&end3).unwrap(), ReplayReply::End);
        assert_eq!(split_replay_frames(&end4).unwrap(), ReplayReply::End);
        assert!(split_replay_frames(&[vec![1], seq.clone(), vec![]]).is_err());
        assert!(split_replay_frames(&[vec![], vec![1, 2], vec![]]).is_err());
        assert!(split_replay_frames(&[vec![], seq]).is_err());
    }
}
