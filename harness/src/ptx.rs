//! PTX shared by the workloads.
//!
//! `busy(float* data, u32 iters)`: every thread runs `iters` dependent FMAs
//! and stores the result at its global index, so on a real GPU the kernel's
//! length follows `iters` and the grid size; on simgpu it follows the grid
//! size (see simgpu's cost model). `data` must hold grid × block floats.

pub const BUSY_KERNEL: &str = "busy";

pub const PTX: &str = r#"
.version 7.0
.target sm_50
.address_size 64

.visible .entry busy(
    .param .u64 busy_param_0,
    .param .u32 busy_param_1
)
{
    .reg .pred %p<2>;
    .reg .f32 %f<4>;
    .reg .b32 %r<8>;
    .reg .b64 %rd<5>;

    ld.param.u64 %rd1, [busy_param_0];
    ld.param.u32 %r1, [busy_param_1];
    cvta.to.global.u64 %rd2, %rd1;
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %ntid.x;
    mov.u32 %r4, %tid.x;
    mad.lo.s32 %r5, %r2, %r3, %r4;
    mul.wide.u32 %rd3, %r5, 4;
    add.s64 %rd4, %rd2, %rd3;
    ld.global.f32 %f1, [%rd4];
    mov.f32 %f2, 0f3F800000;
    mov.u32 %r6, 0;
BUSY_LOOP:
    setp.ge.u32 %p1, %r6, %r1;
    @%p1 bra BUSY_DONE;
    fma.rn.f32 %f1, %f1, 0f3F7FFF58, %f2;
    add.u32 %r6, %r6, 1;
    bra BUSY_LOOP;
BUSY_DONE:
    st.global.f32 [%rd4], %f1;
    ret;
}
"#;

/// Threads per block used by every workload launch of `busy`.
pub const BLOCK_THREADS: u32 = 128;
