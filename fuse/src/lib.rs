//! One StableHLO module (`func.func @main`) per region of ops, with value scalars lifted into one
//! packed runtime argument per dtype, and the stable hashing the region's cache key is built from.

mod hash;
mod module;
mod scalars;

pub use hash::{combine, StableHasher};
pub use module::{build_module, InputRef, Operand, Region, RegionNode};
pub use scalars::{pack_scalars, ScalarPack, ScalarSlot};
