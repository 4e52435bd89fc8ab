//! The one declarative table of exported driver symbols: for every base
//! name, the ABI symbol each requested version selects and its per-thread
//! default-stream variant. `cuGetProcAddress` answers from it, the stub
//! exports are generated from it, and every pointer in it is the exported
//! function itself (so it equals what `dlsym` returns).

use dilu_abi::cuda::{CUDA_ERROR_NOT_SUPPORTED, CUresult};
use std::collections::HashMap;
use std::sync::OnceLock;

pub(crate) struct Variant {
    pub since: i32,
    #[cfg_attr(not(test), allow(dead_code))]
    pub symbol: &'static str,
    pub ptr: usize,
    /// (since, symbol, pointer) of the `_ptsz`/`_ptds` variant.
    pub per_thread: Option<(i32, &'static str, usize)>,
}

pub(crate) struct Row {
    pub base: &'static str,
    pub variants: Vec<Variant>,
}

macro_rules! fn_addr {
    (imp $s:ident) => {
        crate::api::$s as *const () as usize
    };
    (stub $s:ident) => {
        self::generated::$s as *const () as usize
    };
}

macro_rules! stub_fn {
    (imp $s:ident) => {};
    (stub $s:ident) => {
        /// Not implemented by simgpu.
        #[unsafe(no_mangle)]
        pub extern "C" fn $s() -> CUresult {
            crate::guard(stringify!($s), || Err(CUDA_ERROR_NOT_SUPPORTED))
        }
    };
}

macro_rules! opt {
    () => {
        None
    };
    ($e:expr) => {
        Some($e)
    };
}

macro_rules! proc_table {
    ($( $base:ident : [ $( $since:literal $kind:ident $sym:ident
        $(/ $ptsince:literal $ptkind:ident $ptsym:ident)? ),* ] ; )*) => {
        #[allow(non_snake_case)]
        mod generated {
            use super::*;
            $( $( stub_fn!($kind $sym); $( stub_fn!($ptkind $ptsym); )? )* )*
        }

        fn build() -> Vec<Row> {
            vec![ $( Row {
                base: stringify!($base),
                variants: vec![ $( Variant {
                    since: $since,
                    symbol: stringify!($sym),
                    ptr: fn_addr!($kind $sym),
                    per_thread: opt!($( ($ptsince, stringify!($ptsym), fn_addr!($ptkind $ptsym)) )?),
                } ),* ],
            } ),* ]
        }
    };
}

include!("proc_table_data.rs");

fn table() -> &'static HashMap<&'static str, Row> {
    static T: OnceLock<HashMap<&'static str, Row>> = OnceLock::new();
    T.get_or_init(|| build().into_iter().map(|r| (r.base, r)).collect())
}

pub(crate) enum Lookup {
    Found(usize),
    NotFound,
    VersionNotSufficient,
}

/// The real driver's rule: the newest variant introduced at or before
/// `version`; with the per-thread flag, its `_ptsz`/`_ptds` variant when that
/// exists at `version`.
pub(crate) fn lookup(name: &str, version: i32, per_thread: bool) -> Lookup {
    let Some(row) = table().get(name) else {
        return Lookup::NotFound;
    };
    let Some(v) = row.variants.iter().rev().find(|v| v.since <= version) else {
        return Lookup::VersionNotSufficient;
    };
    if per_thread
        && let Some((since, _, p)) = v.per_thread
        && since <= version
    {
        return Lookup::Found(p);
    }
    Lookup::Found(v.ptr)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variants_are_ordered_and_named_after_their_base() {
        for row in table().values() {
            assert!(!row.variants.is_empty(), "{}", row.base);
            for w in row.variants.windows(2) {
                assert!(w[0].since < w[1].since, "{}", row.base);
            }
            for v in &row.variants {
                assert!(v.symbol.starts_with(row.base), "{}", v.symbol);
                assert_ne!(v.ptr, 0);
                if let Some((since, sym, p)) = v.per_thread {
                    assert!(since >= v.since);
                    assert!(sym.ends_with("_ptsz") || sym.ends_with("_ptds"), "{sym}");
                    assert_ne!(p, v.ptr);
                }
            }
        }
    }

    #[test]
    fn version_selection_follows_the_driver() {
        let sym = |n: &str, v: i32, pt: bool| -> Option<&'static str> {
            let row = table().get(n)?;
            let Lookup::Found(p) = lookup(n, v, pt) else {
                return None;
            };
            row.variants.iter().find_map(|x| {
                if x.ptr == p {
                    Some(x.symbol)
                } else {
                    x.per_thread.filter(|t| t.2 == p).map(|t| t.1)
                }
            })
        };
        assert_eq!(sym("cuMemAlloc", 3020, false), Some("cuMemAlloc_v2"));
        assert_eq!(sym("cuMemAlloc", 2000, false), Some("cuMemAlloc"));
        assert_eq!(
            sym("cuStreamBeginCapture", 10000, false),
            Some("cuStreamBeginCapture")
        );
        assert_eq!(
            sym("cuStreamBeginCapture", 10010, false),
            Some("cuStreamBeginCapture_v2")
        );
        assert_eq!(
            sym("cuStreamBeginCapture", 10010, true),
            Some("cuStreamBeginCapture_v2_ptsz")
        );
        assert_eq!(
            sym("cuEventElapsedTime", 12080, false),
            Some("cuEventElapsedTime_v2")
        );
        assert_eq!(
            sym("cuGetProcAddress", 12000, false),
            Some("cuGetProcAddress_v2")
        );
        assert_eq!(
            sym("cuMemcpyHtoD", 12000, true),
            Some("cuMemcpyHtoD_v2_ptds")
        );
        assert_eq!(sym("cuLaunchKernel", 4000, true), Some("cuLaunchKernel"));
        assert!(matches!(
            lookup("cuNoSuchThing", 12090, false),
            Lookup::NotFound
        ));
        assert!(matches!(
            lookup("cuMemAllocAsync", 11000, false),
            Lookup::VersionNotSufficient
        ));
    }
}
