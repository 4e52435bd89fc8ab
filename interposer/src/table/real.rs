//! [`RealFn`]: one slot of the real-driver table (`driver_api.rs`), an
//! address that is read back as the function type it was declared with.

use core::marker::PhantomData;
use core::sync::atomic::{AtomicUsize, Ordering};

/// The real address of one C function whose type is `F`, which must be an
/// `unsafe extern "C" fn` type (see [`RealFn::get`]), 0 until resolved or
/// when absent.
///
/// Only [`RealFn::set`] writes it, and its caller promises the address is a
/// function of type `F`; so reading it back as `F` ([`RealFn::get`]) is the
/// one place a symbol address becomes a typed pointer.
pub struct RealFn<F> {
    address: AtomicUsize,
    function: PhantomData<F>,
}

impl<F: Copy> RealFn<F> {
    pub const fn new() -> Self {
        Self {
            address: AtomicUsize::new(0),
            function: PhantomData,
        }
    }

    /// Records `address` (0: absent); returns whether it is non-zero.
    ///
    /// # Safety
    /// A non-zero `address` is a function with exactly the C signature `F`
    /// describes, alive for the rest of the process.
    pub unsafe fn set(&self, address: usize) -> bool {
        self.address.store(address, Ordering::Release);
        address != 0
    }

    /// The function, once resolved: one load, no branch (the caller's test
    /// of the `Option` is the only one).
    #[inline(always)]
    pub fn get(&self) -> Option<F> {
        const { assert!(size_of::<Option<F>>() == size_of::<usize>()) };
        let address = self.address.load(Ordering::Acquire);
        // SAFETY: `F` is a function pointer type (the only kind of type a
        // slot is declared with), so `Option<F>` is an address with `None`
        // as 0 (the size is asserted above). 0 is `None`; any other address
        // was stored by `set`, whose caller promised it is a live function
        // of type `F`. `transmute` is the only way from an address to a
        // function pointer.
        unsafe { core::mem::transmute_copy::<usize, Option<F>>(&address) }
    }

    /// The raw address (0 when unresolved or absent), for comparing with
    /// addresses the driver hands out.
    #[inline]
    pub fn address(&self) -> usize {
        self.address.load(Ordering::Acquire)
    }

    /// Compiles only when `function` has exactly this slot's C signature
    /// (a fn item coerces to `F` only then): how each exported wrapper
    /// proves it has the signature of the header's typedef.
    #[inline(always)]
    pub fn same_signature(&self, function: F) {
        let _ = function;
    }
}
