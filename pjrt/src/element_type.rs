//! Element types of device buffers, numbered as `PJRT_Buffer_Type`.

/// The element types lazuli moves between host and device. Host data is dense, row-major,
/// little-endian; `Pred` is one byte per element (0 or 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ElementType {
    Pred,
    S8,
    S16,
    S32,
    S64,
    U8,
    U16,
    U32,
    U64,
    F16,
    F32,
    F64,
    BF16,
}

impl ElementType {
    pub const ALL: [ElementType; 13] = {
        use ElementType::*;
        [Pred, S8, S16, S32, S64, U8, U16, U32, U64, F16, F32, F64, BF16]
    };

    /// Bytes per element on the host.
    pub fn byte_size(self) -> usize {
        use ElementType::*;
        match self {
            Pred | S8 | U8 => 1,
            S16 | U16 | F16 | BF16 => 2,
            S32 | U32 | F32 => 4,
            S64 | U64 | F64 => 8,
        }
    }

    /// The StableHLO spelling (`f32`, `i1`, `ui8`, …), handy for error messages and program text.
    pub fn mlir_name(self) -> &'static str {
        use ElementType::*;
        match self {
            Pred => "i1",
            S8 => "i8",
            S16 => "i16",
            S32 => "i32",
            S64 => "i64",
            U8 => "ui8",
            U16 => "ui16",
            U32 => "ui32",
            U64 => "ui64",
            F16 => "f16",
            F32 => "f32",
            F64 => "f64",
            BF16 => "bf16",
        }
    }

    /// `PJRT_Buffer_Type` value.
    pub(crate) fn to_raw(self) -> i32 {
        use ElementType::*;
        match self {
            Pred => 1,
            S8 => 2,
            S16 => 3,
            S32 => 4,
            S64 => 5,
            U8 => 6,
            U16 => 7,
            U32 => 8,
            U64 => 9,
            F16 => 10,
            F32 => 11,
            F64 => 12,
            BF16 => 13,
        }
    }

    /// From `PJRT_Buffer_Type`; `None` for types lazuli does not handle (complex, fp8, int4, token, …).
    pub(crate) fn from_raw(raw: i32) -> Option<ElementType> {
        ElementType::ALL.into_iter().find(|t| t.to_raw() == raw)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_round_trip() {
        for t in ElementType::ALL {
            assert_eq!(ElementType::from_raw(t.to_raw()), Some(t));
        }
        assert_eq!(ElementType::from_raw(0), None);
        assert_eq!(ElementType::from_raw(14), None); // C64
    }
}
