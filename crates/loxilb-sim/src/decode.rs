//! JSON decoding with Go `encoding/json` semantics, on top of
//! `serde_json::Value` (docs/loxilb-api.md#encoding):
//! keys match case-insensitively (exact spelling preferred), unknown keys are
//! ignored, `null` leaves a field at its zero value, and a JSON type that does
//! not fit the Go field type (including out-of-range integers and non-integral
//! numbers) is a decoding error, i.e. a 400.

use serde_json::{Map, Value};

use crate::errors::ApiError;

/// Go integer types used by the generated loxilb models.
#[derive(Debug, Clone, Copy)]
pub(crate) enum GoInt {
    I64,
    I32,
    U32,
    U16,
}

impl GoInt {
    fn name(self) -> &'static str {
        match self {
            GoInt::I64 => "int64",
            GoInt::I32 => "int32",
            GoInt::U32 => "uint32",
            GoInt::U16 => "uint16",
        }
    }

    fn range(self) -> (i128, i128) {
        match self {
            GoInt::I64 => (i64::MIN.into(), i64::MAX.into()),
            GoInt::I32 => (i32::MIN.into(), i32::MAX.into()),
            GoInt::U32 => (0, u32::MAX.into()),
            GoInt::U16 => (0, u16::MAX.into()),
        }
    }
}

fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// A JSON object as seen by Go's decoder for one struct type.
pub(crate) struct GoObj<'a> {
    map: &'a Map<String, Value>,
    /// Go struct name used in error messages (not contractual).
    ty: &'static str,
}

impl<'a> GoObj<'a> {
    pub(crate) fn new(map: &'a Map<String, Value>, ty: &'static str) -> Self {
        GoObj { map, ty }
    }

    /// Exact key first, then ASCII case-insensitive, like Go's field matching.
    fn lookup(&self, key: &str) -> Option<&'a Value> {
        self.map.get(key).or_else(|| {
            self.map
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(key))
                .map(|(_, v)| v)
        })
    }

    fn type_error(&self, key: &str, v: &Value, go_type: &str) -> ApiError {
        ApiError::parse(format!(
            "json: cannot unmarshal {} into Go struct field {}.{} of type {}",
            json_kind(v),
            self.ty,
            key,
            go_type
        ))
    }

    /// Present and non-null value, if any.
    pub(crate) fn raw(&self, key: &str) -> Option<&'a Value> {
        self.lookup(key).filter(|v| !v.is_null())
    }

    pub(crate) fn string(&self, key: &str) -> Result<Option<String>, ApiError> {
        match self.raw(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(v) => Err(self.type_error(key, v, "string")),
        }
    }

    pub(crate) fn boolean(&self, key: &str) -> Result<Option<bool>, ApiError> {
        match self.raw(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(self.type_error(key, v, "bool")),
        }
    }

    pub(crate) fn int(&self, key: &str, ty: GoInt) -> Result<Option<i64>, ApiError> {
        let Some(v) = self.raw(key) else {
            return Ok(None);
        };
        // Go parses the literal with ParseInt/ParseUint: `1.0` and `1e2` fail.
        let n: Option<i128> = match v {
            Value::Number(n) => n
                .as_i64()
                .map(i128::from)
                .or_else(|| n.as_u64().map(i128::from)),
            _ => None,
        };
        let (lo, hi) = ty.range();
        match n {
            Some(n) if n >= lo && n <= hi => Ok(i64::try_from(n).ok()),
            _ => Err(self.type_error(key, v, ty.name())),
        }
    }

    pub(crate) fn object(
        &self,
        key: &str,
        ty: &'static str,
    ) -> Result<Option<GoObj<'a>>, ApiError> {
        match self.raw(key) {
            None => Ok(None),
            Some(Value::Object(m)) => Ok(Some(GoObj::new(m, ty))),
            Some(v) => Err(self.type_error(key, v, ty)),
        }
    }

    /// A map of strings (`map[string]string`); a `null` value decodes as `""`.
    pub(crate) fn string_map(
        &self,
        key: &str,
    ) -> Result<Option<std::collections::BTreeMap<String, String>>, ApiError> {
        let m = match self.raw(key) {
            None => return Ok(None),
            Some(Value::Object(m)) => m,
            Some(v) => return Err(self.type_error(key, v, "map[string]string")),
        };
        m.iter()
            .map(|(k, v)| match v {
                Value::Null => Ok((k.clone(), String::new())),
                Value::String(s) => Ok((k.clone(), s.clone())),
                v => Err(self.type_error(key, v, "string")),
            })
            .collect::<Result<_, _>>()
            .map(Some)
    }

    /// Array of strings (`[]string`); a `null` item decodes as `""`, like Go's decoder does.
    pub(crate) fn string_array(&self, key: &str) -> Result<Option<Vec<String>>, ApiError> {
        let items = match self.raw(key) {
            None => return Ok(None),
            Some(Value::Array(items)) => items,
            Some(v) => return Err(self.type_error(key, v, "[]string")),
        };
        items
            .iter()
            .map(|item| match item {
                Value::Null => Ok(String::new()),
                Value::String(s) => Ok(s.clone()),
                v => Err(self.type_error(key, v, "string")),
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    }

    /// Array of objects; `null` items are kept as `None` (nil pointers in Go).
    pub(crate) fn object_array(
        &self,
        key: &str,
        item_ty: &'static str,
    ) -> Result<Option<Vec<Option<GoObj<'a>>>>, ApiError> {
        let items = match self.raw(key) {
            None => return Ok(None),
            Some(Value::Array(items)) => items,
            Some(v) => return Err(self.type_error(key, v, "array")),
        };
        items
            .iter()
            .map(|item| match item {
                Value::Null => Ok(None),
                Value::Object(m) => Ok(Some(GoObj::new(m, item_ty))),
                v => Err(self.type_error(key, v, item_ty)),
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    }
}

/// Parses a request body. `Ok(None)` means "no body" (empty or whitespace),
/// which go-openapi reports as a missing required body parameter.
pub(crate) fn parse_body(bytes: &[u8]) -> Result<Option<Value>, ApiError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    serde_json::from_slice(bytes)
        .map(Some)
        .map_err(ApiError::parse)
}

/// Top-level body that must be a JSON object (or `null`, decoded as the zero
/// struct). Returns an empty map for `null`.
pub(crate) fn body_object(v: &Value, ty: &'static str) -> Result<Map<String, Value>, ApiError> {
    match v {
        Value::Null => Ok(Map::new()),
        Value::Object(m) => Ok(m.clone()),
        v => Err(ApiError::parse(format!(
            "json: cannot unmarshal {} into Go value of type models.{ty}",
            json_kind(v)
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn case_insensitive_and_types() {
        let v = json!({"ExternalIP": "1.1.1.1", "port": 80, "bad": "x", "f": 1.5, "big": 70000});
        let m = v.as_object().unwrap();
        let o = GoObj::new(m, "T");
        assert_eq!(o.string("externalIP").unwrap().as_deref(), Some("1.1.1.1"));
        assert_eq!(o.int("PORT", GoInt::I64).unwrap(), Some(80));
        assert!(o.int("bad", GoInt::I64).is_err());
        assert!(o.int("f", GoInt::I64).is_err());
        assert!(o.int("big", GoInt::U16).is_err());
        assert_eq!(o.int("missing", GoInt::I64).unwrap(), None);
    }
}
