//! Why a materialization could not be planned.

use std::fmt;

use crate::ids::{NodeId, NodeOutput};

/// A request or a pending graph that does not describe a plannable materialization.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PlanError {
    /// A requested value names a node that is not pending.
    RequestedNotPending {
        /// The value asked for.
        requested: NodeOutput,
    },
    /// A requested value names an output its pending node does not have.
    RequestedOutputOutOfRange {
        /// The value asked for.
        requested: NodeOutput,
        /// How many outputs the node has.
        num_outputs: u32,
    },
    /// A pending node reads a node that is not pending before it.
    InputNotPending {
        /// The node whose input is wrong.
        consumer: NodeId,
        /// The value it reads.
        input: NodeOutput,
    },
    /// A pending node reads an output its producer does not have.
    InputOutputOutOfRange {
        /// The node whose input is wrong.
        consumer: NodeId,
        /// The value it reads.
        input: NodeOutput,
        /// How many outputs the producer has.
        num_outputs: u32,
    },
    /// The pending nodes were not given in capture order.
    NotInCaptureOrder {
        /// The node given before.
        previous: NodeId,
        /// The node given next, whose id should have been greater.
        got: NodeId,
    },
}

impl fmt::Display for PlanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::RequestedNotPending { requested } => write!(
                f,
                "cannot materialize {requested}: expected the output of a pending node or an \
                 external value, got an output of {}, which is not pending; refer to an already \
                 materialized value as external",
                requested.node
            ),
            Self::RequestedOutputOutOfRange {
                requested,
                num_outputs,
            } => write!(
                f,
                "cannot materialize {requested}: expected an output index below {num_outputs} \
                 (the outputs of {}), got {}",
                requested.node, requested.index
            ),
            Self::InputNotPending { consumer, input } => write!(
                f,
                "pending node {consumer} reads {input}: expected an output of a pending node \
                 captured before {consumer} or an external value, got an output of {}, which is \
                 not pending before it; rewrite inputs to external values when they are \
                 materialized",
                input.node
            ),
            Self::InputOutputOutOfRange {
                consumer,
                input,
                num_outputs,
            } => write!(
                f,
                "pending node {consumer} reads {input}: expected an output index below \
                 {num_outputs} (the outputs of {}), got {}",
                input.node, input.index
            ),
            Self::NotInCaptureOrder { previous, got } => write!(
                f,
                "pending nodes must be given in capture order: expected an id greater than \
                 {previous}, got {got}"
            ),
        }
    }
}

impl std::error::Error for PlanError {}
