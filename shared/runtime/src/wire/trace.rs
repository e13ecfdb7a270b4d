//! Spans on the wire: `steppe.v1.Span` and the store's `SpanRecord`.

use steppe_proto::v1;

use crate::trace::SpanRecord;

pub fn span_to_wire(s: &SpanRecord) -> v1::Span {
    let SpanRecord { trace_id, span_id, parent_id, name, start_ns, end_ns, attributes, error, process } = s;
    v1::Span {
        trace_id: trace_id.clone(),
        span_id: span_id.clone(),
        parent_id: parent_id.clone(),
        name: name.clone(),
        start_ns: *start_ns,
        end_ns: *end_ns,
        attributes: attributes.iter().map(|(key, value)| v1::Attribute { key: key.clone(), value: value.clone() }).collect(),
        error: error.clone(),
        process: process.clone(),
    }
}

pub fn span_from_wire(s: v1::Span) -> SpanRecord {
    let v1::Span { trace_id, span_id, parent_id, name, start_ns, end_ns, attributes, error, process } = s;
    SpanRecord { trace_id, span_id, parent_id, name, start_ns, end_ns, attributes: attributes.into_iter().map(|a| (a.key, a.value)).collect(), error, process }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_round_trip_whole() {
        let s = SpanRecord {
            trace_id: "4bf92f3577b34da6a3ce929d0e0e4736".into(),
            span_id: "00f067aa0ba902b7".into(),
            parent_id: "00f067aa0ba902b8".into(),
            name: "step build".into(),
            start_ns: 1,
            end_ns: u64::MAX,
            attributes: vec![("steppe.run".into(), "r-1".into()), ("tokens".into(), "12".into())],
            error: Some("exit status 3".into()),
            process: "worker w1".into(),
        };
        let bytes = prost::Message::encode_to_vec(&span_to_wire(&s));
        let back = span_from_wire(<v1::Span as prost::Message>::decode(bytes.as_slice()).unwrap());
        assert_eq!(back, s);
    }
}
