//! Why operands do not fit an op, by kind: the recording layer turns each kind into the matching user-facing error
//! (shape mismatch, dtype, axis, attribute) with the operands and the user's line.

/// An op's shape rule refusing its operands or attributes. Displays as its message, which names the op.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum InferError {
    /// The operands' shapes do not fit the op or each other (or their number is wrong).
    Shape(String),
    /// An operand's element type does not fit the op, or the operands' element types differ.
    DType(String),
    /// An axis is out of range for an operand of this rank.
    Axis { axis: i64, rank: usize, message: String },
    /// The op's own attributes (dimension numbers, windows, permutations, a kernel's signature) are inconsistent.
    Attribute(String),
}

impl InferError {
    /// The same kind with `op: ` before the message (an expression's step, reported as the expression's).
    pub fn prefixed(self, op: &str) -> InferError {
        let with = |m: String| format!("{op}: {m}");
        match self {
            InferError::Shape(m) => InferError::Shape(with(m)),
            InferError::DType(m) => InferError::DType(with(m)),
            InferError::Attribute(m) => InferError::Attribute(with(m)),
            InferError::Axis { axis, rank, message } => InferError::Axis { axis, rank, message: with(message) },
        }
    }

    /// The message, naming the op.
    pub fn message(&self) -> &str {
        match self {
            InferError::Shape(m) | InferError::DType(m) | InferError::Attribute(m) => m,
            InferError::Axis { message, .. } => message,
        }
    }
}

impl std::fmt::Display for InferError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.message())
    }
}

impl std::error::Error for InferError {}

impl From<InferError> for String {
    fn from(e: InferError) -> String {
        e.message().to_string()
    }
}
