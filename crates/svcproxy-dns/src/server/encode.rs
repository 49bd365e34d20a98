//! A response in wire form: its sections borrowed ([`Parts`]), encoded by
//! hickory-proto, and cut to the bytes the transport allows (the answers that
//! fit, with TC set).
//!
//! Entry point: [`encode`].

use super::*;

/// A response's sections, borrowed.
#[derive(Clone, Copy)]
pub(super) struct Parts<'a> {
    pub(super) metadata: Metadata,
    pub(super) queries: &'a [Query],
    pub(super) answers: &'a [Record],
    pub(super) authorities: &'a [Record],
    pub(super) additionals: &'a [Record],
    pub(super) edns: Option<&'a Edns>,
}

impl<'a> Parts<'a> {
    /// A header and the question, nothing else.
    pub(super) fn new(metadata: Metadata, queries: &'a [Query]) -> Self {
        Parts {
            metadata,
            queries,
            answers: &[],
            authorities: &[],
            additionals: &[],
            edns: None,
        }
    }
}

fn emit(parts: &Parts<'_>) -> Result<Vec<u8>, hickory_proto::ProtoError> {
    let mut buffer = Vec::with_capacity(512);
    let mut encoder = BinEncoder::new(&mut buffer);
    emit_message_parts(
        &parts.metadata,
        &mut parts.queries.iter(),
        &mut parts.answers.iter(),
        &mut parts.authorities.iter(),
        &mut parts.additionals.iter(),
        parts.edns,
        None,
        &mut encoder,
    )?;
    Ok(buffer)
}

/// The response in wire form, at most `limit` bytes: when the whole does not fit,
/// as many answer records as do, with the TC bit set (the client asks again over
/// TCP), and no other section but the question and EDNS.
pub(super) fn encode(parts: Parts<'_>, limit: u16) -> Vec<u8> {
    let limit = usize::from(limit);
    if let Ok(whole) = emit(&parts) {
        if whole.len() <= limit {
            return whole;
        }
    }
    let mut cut = Parts {
        authorities: &[],
        additionals: &[],
        ..parts
    };
    cut.metadata.truncation = true;
    // The most answers that fit: a binary search over the count.
    let fits = |n: usize| {
        let cut = Parts {
            answers: &parts.answers[..n],
            ..cut
        };
        emit(&cut).ok().filter(|bytes| bytes.len() <= limit)
    };
    let mut best = fits(0);
    if best.is_some() {
        // `lo` fits; `hi` does not, or is past the last answer.
        let (mut lo, mut hi) = (0, parts.answers.len() + 1);
        while lo + 1 < hi {
            let mid = (lo + hi) / 2;
            match fits(mid) {
                Some(bytes) => (lo, best) = (mid, Some(bytes)),
                None => hi = mid,
            }
        }
    }
    best.unwrap_or_else(|| {
        // Not even the question fits (or encoding failed): SERVFAIL, header only.
        let mut metadata = parts.metadata;
        metadata.response_code = ResponseCode::ServFail;
        emit(&Parts::new(metadata, &[])).unwrap_or_default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_proto::rr::rdata::A;
    use hickory_proto::rr::{Name, RData};

    fn answers(n: usize) -> Vec<Record> {
        let name = Name::from_ascii("big.demo.svc.cluster.local.").unwrap();
        (0..n)
            .map(|i| {
                Record::from_rdata(
                    name.clone(),
                    5,
                    RData::A(A::new(10, 0, (i / 256) as u8, (i % 256) as u8)),
                )
            })
            .collect()
    }

    #[test]
    fn a_response_too_big_keeps_the_answers_that_fit_and_sets_tc() {
        let queries = [Query::query(
            Name::from_ascii("big.demo.svc.cluster.local.").unwrap(),
            hickory_proto::rr::RecordType::A,
        )];
        let records = answers(100);
        let parts = Parts {
            answers: &records,
            additionals: &records[..3],
            ..Parts::new(
                Metadata::new(7, MessageType::Response, OpCode::Query),
                &queries,
            )
        };
        let whole = encode(parts, u16::MAX);
        let m = Message::from_vec(&whole).unwrap();
        assert_eq!((m.answers.len(), m.additionals.len()), (100, 3));
        assert!(!m.metadata.truncation);
        for limit in [512u16, 700, 1000] {
            let bytes = encode(parts, limit);
            assert!(bytes.len() <= usize::from(limit));
            let m = Message::from_vec(&bytes).unwrap();
            assert!(m.metadata.truncation);
            assert!(m.additionals.is_empty());
            // One more record (16 bytes, compressed) would not have fitted.
            assert!(
                bytes.len() + 16 > usize::from(limit),
                "{limit}: {}",
                bytes.len()
            );
            assert_eq!(m.answers[..], records[..m.answers.len()]);
        }
        // Nothing fits but the header: SERVFAIL, header only.
        let m = Message::from_vec(&encode(parts, 20)).unwrap();
        assert_eq!(m.metadata.response_code, ResponseCode::ServFail);
    }
}
