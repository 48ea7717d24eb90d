//! Host element types: the typed boundary between Rust values and the graph's runtime `DType`.

use half::{bf16, f16};
use lazuli_hlo::DType;

/// A Rust type that can cross the host/device boundary as elements of a tensor of dtype [`Element::DTYPE`].
pub trait Element: Copy + Send + Sync + std::fmt::Debug + std::fmt::Display + 'static {
    /// The dtype of a tensor of this element type.
    const DTYPE: DType;
    /// Append the little-endian bytes of `self` (PJRT's dense host layout on x86-64 and aarch64).
    fn put(self, out: &mut Vec<u8>);
    /// Read one element from exactly `DTYPE.byte_size()` bytes.
    fn get(bytes: &[u8]) -> Self;
    /// Append the bytes of every element (one copy for plain numbers on a little-endian host).
    fn put_all(data: &[Self], out: &mut Vec<u8>) {
        data.iter().for_each(|&x| x.put(out));
    }
    /// Read every element of dense bytes.
    fn get_all(bytes: &[u8]) -> Vec<Self> {
        bytes.chunks_exact(Self::DTYPE.byte_size()).map(Self::get).collect()
    }
    /// The value as f64 (`as`-cast; a bool is 0 or 1).
    fn to_f64(self) -> f64;
    /// `x` in this type (`as`-cast; for a bool, `x != 0`).
    fn from_f64(x: f64) -> Self;
}

/// Plain numbers are stored as their little-endian bytes: on a little-endian host a slice of them is those bytes.
macro_rules! bulk_le {
    () => {
        #[cfg(target_endian = "little")]
        fn put_all(data: &[Self], out: &mut Vec<u8>) {
            out.extend_from_slice(bytemuck::cast_slice(data));
        }
        #[cfg(target_endian = "little")]
        fn get_all(bytes: &[u8]) -> Vec<Self> {
            bytemuck::pod_collect_to_vec(bytes)
        }
    };
}

macro_rules! numeric {
    ($t:ty, $dt:expr, $n:expr) => {
        impl Element for $t {
            const DTYPE: DType = $dt;
            fn put(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
            bulk_le!();
            fn get(bytes: &[u8]) -> Self {
                let mut b = [0u8; $n];
                b.copy_from_slice(bytes);
                <$t>::from_le_bytes(b)
            }
            fn to_f64(self) -> f64 {
                self as f64
            }
            fn from_f64(x: f64) -> Self {
                x as $t
            }
        }
    };
}

numeric!(f32, DType::F32, 4);
numeric!(f64, DType::F64, 8);
numeric!(i32, DType::I32, 4);
numeric!(i64, DType::I64, 8);
numeric!(u8, DType::U8, 1);
numeric!(u32, DType::U32, 4);
numeric!(u64, DType::U64, 8);

macro_rules! half_float {
    ($t:ty, $dt:expr) => {
        impl Element for $t {
            const DTYPE: DType = $dt;
            fn put(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
            bulk_le!();
            fn get(bytes: &[u8]) -> Self {
                <$t>::from_le_bytes([bytes[0], bytes[1]])
            }
            fn to_f64(self) -> f64 {
                <$t>::to_f64(self)
            }
            fn from_f64(x: f64) -> Self {
                <$t>::from_f64(x)
            }
        }
    };
}

half_float!(f16, DType::F16);
half_float!(bf16, DType::BF16);

impl Element for bool {
    const DTYPE: DType = DType::Bool;
    fn put(self, out: &mut Vec<u8>) {
        out.push(self as u8);
    }
    fn get(bytes: &[u8]) -> Self {
        bytes[0] != 0
    }
    fn to_f64(self) -> f64 {
        self as u8 as f64
    }
    fn from_f64(x: f64) -> Self {
        x != 0.0
    }
}

/// Encode a slice as dense little-endian bytes.
pub fn to_bytes<T: Element>(data: &[T]) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.len() * T::DTYPE.byte_size());
    T::put_all(data, &mut out);
    out
}

/// Decode dense little-endian bytes.
pub fn from_bytes<T: Element>(bytes: &[u8]) -> Vec<T> {
    T::get_all(bytes)
}

/// A scalar of any dtype, encoded from an f64 (rounded the way a conversion would).
pub fn scalar_bytes(dtype: DType, x: f64) -> Vec<u8> {
    let mut out = Vec::with_capacity(dtype.byte_size());
    put_scalar(dtype, x, &mut out);
    out
}

/// Append `x` rounded to `dtype` (no allocation per element when filling a large tensor).
pub fn put_scalar(dtype: DType, x: f64, out: &mut Vec<u8>) {
    match dtype {
        DType::F32 => (x as f32).put(out),
        DType::F64 => x.put(out),
        DType::F16 => f16::from_f64(x).put(out),
        DType::BF16 => bf16::from_f64(x).put(out),
        DType::I32 => (x as i32).put(out),
        DType::I64 => (x as i64).put(out),
        DType::U8 => (x as u8).put(out),
        DType::U32 => (x as u32).put(out),
        DType::U64 => (x as u64).put(out),
        DType::Bool => (x != 0.0).put(out),
    }
}

/// Decode any dtype's bytes to f64 (for display and references).
pub fn bytes_to_f64(dtype: DType, bytes: &[u8]) -> Vec<f64> {
    match dtype {
        DType::F32 => from_bytes::<f32>(bytes).into_iter().map(Element::to_f64).collect(),
        DType::F64 => from_bytes::<f64>(bytes),
        DType::F16 => from_bytes::<f16>(bytes).into_iter().map(Element::to_f64).collect(),
        DType::BF16 => from_bytes::<bf16>(bytes).into_iter().map(Element::to_f64).collect(),
        DType::I32 => from_bytes::<i32>(bytes).into_iter().map(Element::to_f64).collect(),
        DType::I64 => from_bytes::<i64>(bytes).into_iter().map(Element::to_f64).collect(),
        DType::U8 => from_bytes::<u8>(bytes).into_iter().map(Element::to_f64).collect(),
        DType::U32 => from_bytes::<u32>(bytes).into_iter().map(Element::to_f64).collect(),
        DType::U64 => from_bytes::<u64>(bytes).into_iter().map(Element::to_f64).collect(),
        DType::Bool => from_bytes::<bool>(bytes).into_iter().map(Element::to_f64).collect(),
    }
}
