//! The handle through which a process acts on one device's board.

use dilu_layout::colocation::DeviceBoard;

/// One device's board, as a primary or a filler acts on it. A copy is a
/// reference: any number may act on one board at once (its words are
/// atomics).
#[derive(Clone, Copy)]
pub struct Board<'a>(&'a DeviceBoard);

impl<'a> Board<'a> {
    pub fn new(device: &'a DeviceBoard) -> Self {
        Board(device)
    }
}

impl std::ops::Deref for Board<'_> {
    type Target = DeviceBoard;
    fn deref(&self) -> &DeviceBoard {
        self.0
    }
}
