//! The little a planner needs to know about a pending node.

use crate::ids::{NodeId, ValueRef};

/// A deferred op waiting to be materialized, seen only through its edges.
///
/// A node may read only values produced by nodes captured before it, or external values.
pub trait PendingNode {
    /// The node's id; ids grow in capture order.
    fn id(&self) -> NodeId;

    /// The values the node reads, in operand order. Repeats are allowed.
    fn inputs(&self) -> impl Iterator<Item = ValueRef> + '_;

    /// How many values the node produces (0 is fine for a pure side effect).
    fn num_outputs(&self) -> u32;

    /// Whether the node must run even when nothing reads its outputs (RNG state updates,
    /// collectives, host callbacks, …). Side-effecting nodes keep their capture order.
    fn is_side_effecting(&self) -> bool;
}

impl<N: PendingNode + ?Sized> PendingNode for &N {
    fn id(&self) -> NodeId {
        (**self).id()
    }

    fn inputs(&self) -> impl Iterator<Item = ValueRef> + '_ {
        (**self).inputs()
    }

    fn num_outputs(&self) -> u32 {
        (**self).num_outputs()
    }

    fn is_side_effecting(&self) -> bool {
        (**self).is_side_effecting()
    }
}
