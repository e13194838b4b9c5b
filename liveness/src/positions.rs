//! Node id → position in the pending list, in constant time.

use std::collections::HashMap;

use crate::ids::NodeId;

/// Maps the ids of the pending nodes, pushed in capture order, to their positions.
///
/// Ids are usually contiguous (one sequence, and ordered materialization only ever removes a
/// prefix), so the common case is an offset; a gap switches to a hash map once.
#[derive(Debug)]
pub(crate) enum Positions {
    Contiguous { first: u64, len: usize },
    Sparse(HashMap<NodeId, usize>),
}

impl Positions {
    pub(crate) fn new() -> Self {
        Self::Contiguous { first: 0, len: 0 }
    }

    /// Records `id` at the next position; ids must arrive strictly increasing.
    pub(crate) fn push(&mut self, id: NodeId) {
        match self {
            Self::Contiguous { len: 0, .. } => {
                *self = Self::Contiguous {
                    first: id.seq(),
                    len: 1,
                };
            }
            Self::Contiguous { first, len } => {
                let expected = first.checked_add(*len as u64);
                if expected == Some(id.seq()) {
                    *len += 1;
                } else {
                    let mut map = HashMap::with_capacity(*len * 2);
                    for position in 0..*len {
                        map.insert(NodeId::new(*first + position as u64), position);
                    }
                    map.insert(id, *len);
                    *self = Self::Sparse(map);
                }
            }
            Self::Sparse(map) => {
                let position = map.len();
                map.insert(id, position);
            }
        }
    }

    pub(crate) fn get(&self, id: NodeId) -> Option<usize> {
        match self {
            Self::Contiguous { first, len } => {
                let offset = id.seq().checked_sub(*first)?;
                (offset < *len as u64).then_some(offset as usize)
            }
            Self::Sparse(map) => map.get(&id).copied(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contiguous_ids_map_to_offsets() {
        let mut positions = Positions::new();
        for seq in 10..15 {
            positions.push(NodeId::new(seq));
        }
        assert!(matches!(positions, Positions::Contiguous { .. }));
        assert_eq!(positions.get(NodeId::new(10)), Some(0));
        assert_eq!(positions.get(NodeId::new(14)), Some(4));
        assert_eq!(positions.get(NodeId::new(9)), None);
        assert_eq!(positions.get(NodeId::new(15)), None);
    }

    #[test]
    fn a_gap_switches_to_a_map_without_losing_earlier_ids() {
        let mut positions = Positions::new();
        for seq in [3, 4, 7, 8, 100] {
            positions.push(NodeId::new(seq));
        }
        assert!(matches!(positions, Positions::Sparse(_)));
        let found: Vec<_> = [3, 4, 5, 7, 8, 100]
            .map(|seq| positions.get(NodeId::new(seq)))
            .into();
        assert_eq!(found, [Some(0), Some(1), None, Some(2), Some(3), Some(4)]);
    }

    #[test]
    fn empty_finds_nothing() {
        assert_eq!(Positions::new().get(NodeId::new(0)), None);
    }
}
