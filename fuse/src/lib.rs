//! One StableHLO module (`func.func @main`) per region of ops, with value scalars lifted into one
//! packed runtime argument per dtype, and the stable hashing the region's cache key is built from.

mod hash;
mod module;
mod remat;
mod scalars;
mod view_lowering;

pub use hash::{combine, StableHasher};
pub use module::{
    build_module, AppendOp, InputRef, InputView, Operand, PaddedOp, Region, RegionNode, RegionOp,
    WriteView,
};
pub use scalars::{pack_scalars, PackBytes, ScalarPack, ScalarPacks, ScalarSlot, ScalarSlots};
pub use view_lowering::{blend_update_slice, lower_chain, lower_read, lower_write};
