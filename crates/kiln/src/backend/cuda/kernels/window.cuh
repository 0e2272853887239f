// Shared by the window sources (window.cu, conv_mma.cu).

// Mirrors `WindowArgs` in window.rs: the input [n, c, h, w], the output plane [oh, ow], the
// window, and the strides of the operand read through a layout (4 for an NCHW operand, the
// first 2 for the unfolded matrix).
struct Win {
    u64 n, c, h, w, oh, ow;
    i64 kh, kw, sh, sw, ph, pw, dh, dw;
    u64 s[4];
    u64 offset;
};

#define GRID_LOOP(t, total) \
    for (u64 t = (u64)blockIdx.x * blockDim.x + threadIdx.x; t < (total); t += (u64)blockDim.x * gridDim.x)
