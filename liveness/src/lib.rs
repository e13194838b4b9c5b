//! Which pending ops a materialization runs, which values it must keep, and in what order.
//!
//! A materialization point (`.item()`, `.cpu()`, an explicit sync, a region-size cap) turns
//! part of the pending graph into one region. [`plan`] chooses it by ordered materialization:
//!
//! 1. the region is the pending prefix up to the newest op the requested values depend on
//!    (everything, for [`Request::All`]); later ops stay pending;
//! 2. its outputs are the requested values plus every region value still live outside it (held
//!    by a live storage, or read by an op that stays pending), in a deterministic order;
//! 3. region ops with no path to an output are dropped; side-effecting ops are always kept, in
//!    capture order.
//!
//! The crate knows nothing of ops: a node is anything implementing [`PendingNode`].
//!
//! ```
//! use liveness::{plan, ExternalId, NodeId, PendingNode, Request, ValueRef};
//!
//! struct Op { id: NodeId, inputs: Vec<ValueRef> }
//!
//! impl PendingNode for Op {
//!     fn id(&self) -> NodeId { self.id }
//!     fn inputs(&self) -> impl Iterator<Item = ValueRef> + '_ { self.inputs.iter().copied() }
//!     fn num_outputs(&self) -> u32 { 1 }
//!     fn is_side_effecting(&self) -> bool { false }
//! }
//!
//! let (a, b, c) = (NodeId::new(0), NodeId::new(1), NodeId::new(2));
//! let pending = [
//!     Op { id: a, inputs: vec![ExternalId(0).into()] },   // a = f(x)
//!     Op { id: b, inputs: vec![a.output(0).into()] },     // b = g(a)
//!     Op { id: c, inputs: vec![a.output(0).into()] },     // c = h(a), captured after b
//! ];
//! let requested = [b.output(0).into()];
//! let plan = plan(&pending, Request::Values(&requested), |_| false).unwrap();
//! assert_eq!(plan.kept, [a, b]);
//! assert_eq!(plan.still_pending, [c]);
//! // `c` still reads `a`, so `a` is materialized too rather than recomputed later.
//! let outputs: Vec<_> = plan.outputs.iter().map(|output| output.value).collect();
//! assert_eq!(outputs, [b.output(0), a.output(0)]);
//! ```

mod error;
mod ids;
mod node;
mod plan;
mod positions;

pub use error::PlanError;
pub use ids::{ExternalId, NodeId, NodeIdSequence, NodeOutput, ValueRef};
pub use node::PendingNode;
pub use plan::{plan, Output, Plan, Request};
