//! Identifiers of pending nodes and of the values they read and produce.

use std::fmt;

/// A pending node, named by its capture sequence number.
///
/// Ids are handed out in capture order and never reused, so comparing two ids compares when the
/// nodes were captured. Ids of the nodes pending at one moment need not be contiguous.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct NodeId(u64);

impl NodeId {
    /// The id with capture sequence number `seq`.
    pub const fn new(seq: u64) -> Self {
        Self(seq)
    }

    /// The capture sequence number.
    pub const fn seq(self) -> u64 {
        self.0
    }

    /// One output of this node.
    pub const fn output(self, index: u32) -> NodeOutput {
        NodeOutput { node: self, index }
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "n{}", self.0)
    }
}

/// Hands out [`NodeId`]s in capture order.
#[derive(Clone, Debug, Default)]
pub struct NodeIdSequence {
    next: u64,
}

impl NodeIdSequence {
    /// A sequence whose first id is `n0`.
    pub const fn new() -> Self {
        Self { next: 0 }
    }

    /// A sequence whose first id is `first`.
    pub const fn starting_at(first: NodeId) -> Self {
        Self { next: first.0 }
    }

    /// The id of the node being captured now; every later call returns a greater id.
    ///
    /// # Panics
    /// When all 2^64 ids have been handed out.
    pub fn next_id(&mut self) -> NodeId {
        let id = NodeId(self.next);
        self.next = self
            .next
            .checked_add(1)
            .expect("node id sequence exhausted");
        id
    }
}

/// One output of a pending node.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct NodeOutput {
    /// The node that produces the value.
    pub node: NodeId,
    /// Which of the node's outputs, counted from 0.
    pub index: u32,
}

impl fmt::Display for NodeOutput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.node, self.index)
    }
}

/// A value that is not produced by a pending node: a materialized buffer, a host scalar, …
///
/// The number means nothing here; the caller chooses it so it can recognise the value.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct ExternalId(pub u64);

impl fmt::Display for ExternalId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ext{}", self.0)
    }
}

/// A value a pending node reads, or a caller asks for.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub enum ValueRef {
    /// An output of a pending node.
    Pending(NodeOutput),
    /// A value that needs no pending work.
    External(ExternalId),
}

impl ValueRef {
    /// The producing pending node's output, if there is one.
    pub const fn pending(self) -> Option<NodeOutput> {
        match self {
            Self::Pending(output) => Some(output),
            Self::External(_) => None,
        }
    }
}

impl From<NodeOutput> for ValueRef {
    fn from(output: NodeOutput) -> Self {
        Self::Pending(output)
    }
}

impl From<ExternalId> for ValueRef {
    fn from(external: ExternalId) -> Self {
        Self::External(external)
    }
}

impl fmt::Display for ValueRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Pending(output) => output.fmt(f),
            Self::External(external) => external.fmt(f),
        }
    }
}
