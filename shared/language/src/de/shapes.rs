//! Field shapes the model decodes with: lists that drop a broken element,
//! keys written as a scalar or a mapping (or a list or a mapping), and the
//! field list serde gives a struct.

use super::*;

/// A list whose broken elements are dropped (their problems are recorded).
pub fn lenient_vec<'de, D, T>(d: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    let items: Vec<Lenient<T>> = Vec::deserialize(d)?;
    Ok(items.into_iter().filter_map(|l| l.0).collect())
}

pub fn lenient_opt_vec<'de, D, T>(d: D) -> Result<Option<Vec<T>>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    let items: Option<Vec<Lenient<T>>> = Option::deserialize(d)?;
    Ok(items.map(|v| v.into_iter().filter_map(|l| l.0).collect()))
}

struct Lenient<T>(Option<T>);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Lenient<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(Lenient(T::deserialize(d).ok()))
    }
}

/// The field names a derived struct declares (what serde passes to `deserialize_struct`).
pub fn fields_of<T: for<'de> Deserialize<'de>>() -> &'static [&'static str] {
    struct Capture<'c>(&'c mut &'static [&'static str]);
    impl<'de, 'c> Deserializer<'de> for Capture<'c> {
        type Error = de::value::Error;
        fn deserialize_any<V: Visitor<'de>>(self, _v: V) -> Result<V::Value, Self::Error> {
            Err(de::Error::custom("not a struct"))
        }
        fn deserialize_struct<V: Visitor<'de>>(
            self,
            _name: &'static str,
            fields: &'static [&'static str],
            _v: V,
        ) -> Result<V::Value, Self::Error> {
            *self.0 = fields;
            Err(de::Error::custom("captured"))
        }
        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
            bytes byte_buf option unit unit_struct newtype_struct seq tuple
            tuple_struct map enum identifier ignored_any
        }
    }
    let mut fields: &'static [&'static str] = &[];
    let _ = T::deserialize(Capture(&mut fields));
    fields
}

/// Decodes a value that is written either as a scalar or as a mapping `M`.
pub fn scalar_or_map<'de, D, M, T>(
    d: D,
    expecting: &'static str,
    from_scalar: fn(String) -> T,
    from_map: fn(M) -> T,
) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    M: for<'x> Deserialize<'x>,
{
    struct V<M, T> {
        expecting: &'static str,
        from_scalar: fn(String) -> T,
        from_map: fn(M) -> T,
    }
    impl<'de, M: for<'x> Deserialize<'x>, T> Visitor<'de> for V<M, T> {
        type Value = T;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(self.expecting)
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<T, E> {
            Ok((self.from_scalar)(v.to_string()))
        }
        fn visit_bool<E: de::Error>(self, v: bool) -> Result<T, E> {
            Ok((self.from_scalar)(v.to_string()))
        }
        fn visit_i64<E: de::Error>(self, v: i64) -> Result<T, E> {
            Ok((self.from_scalar)(v.to_string()))
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<T, E> {
            Ok((self.from_scalar)(v.to_string()))
        }
        fn visit_f64<E: de::Error>(self, v: f64) -> Result<T, E> {
            Ok((self.from_scalar)(v.to_string()))
        }
        fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
            let m = M::deserialize(MapAccessDeserializer::new(map))
                .map_err(|e: A::Error| e)?;
            Ok((self.from_map)(m))
        }
    }
    d.deserialize_struct(
        "",
        fields_of::<M>(),
        V {
            expecting,
            from_scalar,
            from_map,
        },
    )
}

/// Decodes a value that is written either as a list of `E` or as a mapping `M`.
pub fn seq_or_map<'de, D, E, M, T>(
    d: D,
    expecting: &'static str,
    from_seq: fn(Vec<E>) -> T,
    from_map: fn(M) -> T,
) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    E: for<'x> Deserialize<'x>,
    M: for<'x> Deserialize<'x>,
{
    struct V<E, M, T> {
        expecting: &'static str,
        from_seq: fn(Vec<E>) -> T,
        from_map: fn(M) -> T,
    }
    impl<'de, E: for<'x> Deserialize<'x>, M: for<'x> Deserialize<'x>, T> Visitor<'de> for V<E, M, T> {
        type Value = T;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(self.expecting)
        }
        fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<T, A::Error> {
            let items: Vec<Lenient<E>> = Vec::deserialize(SeqAccessDeserializer::new(seq))?;
            Ok((self.from_seq)(items.into_iter().filter_map(|l| l.0).collect()))
        }
        fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
            Ok((self.from_map)(M::deserialize(MapAccessDeserializer::new(map))?))
        }
    }
    d.deserialize_struct(
        "",
        fields_of::<M>(),
        V {
            expecting,
            from_seq,
            from_map,
        },
    )
}
