"""8-bit weights for the embedded engine on a CPU: llama.cpp's Q8_0 format, decoded by an AVX2 kernel.

A small model's decode step on a CPU streams every weight once per token, so its speed is the memory
bandwidth over the weights' bytes: fp32 weights cap SmolLM2-135M at about 17 tokens/s on one AMD EPYC core.
``quantize_q8(model)`` replaces each ``nn.Linear`` (the vocabulary projection included) by a
:class:`Q8Linear`: int8 weights with one fp32 scale per block of 32 (Q8_0, what llama.cpp's ``Q8_0`` GGUF
holds), a quarter of the bytes. A decode step's few rows go through :func:`kernel`'s ``q8_linear``, which
quantizes the activations per block of 32 too and takes integer dot products (VNNI's ``dpbusd`` where the CPU
has it, else ``maddubs`` as ggml's ``vec_dot_q8_0_q8_0`` does), four weight rows at a time with the rows 16 KiB
ahead prefetched (one Sapphire Rapids core streamed the weights at 6 GB/s without, 8 GB/s with; 8 KiB measured
the same); a prefill's many rows dequantize the weights a slice at a time and use the BLAS matmul. The output
is close to, not equal to, the model's own: the tier that uses it says so.
:class:`FusedLayers` goes further for Llama/Qwen2 models: a layer's whole decode step in two kernel calls.

The kernels are about 150 lines of C, compiled once per machine with the system's C compiler (about a second;
cached under ``~/.cache/posttrain``) and called through ``ctypes``, which lets go of the GIL while it runs. It
needs an x86-64 CPU with AVX2 and FMA and a C compiler; :func:`kernel` says which is missing.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn

from posttrain.platform.engines.llamacpp import cache_root, cpu_flags

BLOCK = 32  # weights per scale, as in Q8_0
KERNEL_ROWS = 16  # up to this many activation rows use the kernel; more (a prefill) use dequantized slices
SLICE = 4096  # output features dequantized at once for a many-row matmul (4096 x 4096 fp32: 64 MiB)

_SOURCE = r"""
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

/* Activations quantized per row and block of 32 to int8 with one scale each (llama.cpp's quantize_row_q8_0). */
static void quantize_rows(const float *x, int64_t M, int64_t K, int8_t *xq, float *xs) {
  const int64_t B = K / 32;
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t b = 0; b < B; ++b) {
      const float *v = x + m * K + b * 32;
      float amax = 0.f;
      for (int i = 0; i < 32; ++i) amax = fmaxf(amax, fabsf(v[i]));
      const float d = amax / 127.f, id = d > 0.f ? 1.f / d : 0.f;
      xs[m * B + b] = d;
      for (int i = 0; i < 32; ++i) xq[m * K + b * 32 + i] = (int8_t)nearbyintf(v[i] * id);
    }
  }
}

/* The integer dot product of one block of 32 pairs, as 8 int32 partial sums: the sign trick (w's signs moved onto
   x, so the unsigned-by-signed multiply applies), then VNNI's dpbusd where the CPU has it, else maddubs + madd (as
   ggml's vec_dot_q8_0_q8_0). Both are exact for values in -127..127 (maddubs's int16 pair sums stay below 32767). */
static inline __m256i dot_block(__m256i wq, __m256i xv) {
  const __m256i u = _mm256_sign_epi8(wq, wq), v = _mm256_sign_epi8(xv, wq);
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, v);
#elif defined(__AVXVNNI__)
  return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, v);
#else
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, v), _mm256_set1_epi16(1));
#endif
}

#define PREFETCH_BYTES 16384

static inline float hsum(__m256 acc) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
  s = _mm_hadd_ps(s, s);
  s = _mm_hadd_ps(s, s);
  return _mm_cvtss_f32(s);
}

/* y (M, N) = [y +] xq (M, K) times the transpose of w (N, K) [+ bias (N)]; w int8 with scales (N, K/32). Per block:
   the integer dot product scaled by both blocks' scales into fp32. Four weight rows at a time: four independent
   accumulators (one chain of fused multiply-adds waited on its own latency) over one load of each x block; each
   output sums its blocks in the same order as one row at a time would, so the result does not depend on N. */
static void matmul_q(const int8_t *xq, const float *xs, int64_t M, int64_t K, const int8_t *w, const float *ws,
                     int64_t N, const float *bias, float *y, int accumulate) {
  const int64_t B = K / 32;
  int64_t n = 0;
  for (; n + 4 <= N; n += 4) {
    const int8_t *r0 = w + n * K, *r1 = r0 + K, *r2 = r1 + K, *r3 = r2 + K;
    const float *s0 = ws + n * B, *s1 = s0 + B, *s2 = s1 + B, *s3 = s2 + B;
    if ((n + 4) * K + PREFETCH_BYTES <= N * K)  /* the rows a few groups on, while these compute */
      for (int64_t i = 0; i < 4 * K; i += 64) _mm_prefetch((const char *)(r0 + PREFETCH_BYTES + i), _MM_HINT_T0);
    for (int64_t m = 0; m < M; ++m) {
      const int8_t *xr = xq + m * K;
      const float *xrs = xs + m * B;
      __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
      for (int64_t b = 0; b < B; ++b) {
        const __m256i xv = _mm256_loadu_si256((const __m256i *)(xr + b * 32));
        const float xb = xrs[b];
        a0 = _mm256_fmadd_ps(_mm256_set1_ps(s0[b] * xb),
                             _mm256_cvtepi32_ps(dot_block(_mm256_loadu_si256((const __m256i *)(r0 + b * 32)), xv)), a0);
        a1 = _mm256_fmadd_ps(_mm256_set1_ps(s1[b] * xb),
                             _mm256_cvtepi32_ps(dot_block(_mm256_loadu_si256((const __m256i *)(r1 + b * 32)), xv)), a1);
        a2 = _mm256_fmadd_ps(_mm256_set1_ps(s2[b] * xb),
                             _mm256_cvtepi32_ps(dot_block(_mm256_loadu_si256((const __m256i *)(r2 + b * 32)), xv)), a2);
        a3 = _mm256_fmadd_ps(_mm256_set1_ps(s3[b] * xb),
                             _mm256_cvtepi32_ps(dot_block(_mm256_loadu_si256((const __m256i *)(r3 + b * 32)), xv)), a3);
      }
      const __m256 acc[4] = {a0, a1, a2, a3};
      for (int r = 0; r < 4; ++r) {
        const float v = hsum(acc[r]) + (bias ? bias[n + r] : 0.f);
        y[m * N + n + r] = accumulate ? y[m * N + n + r] + v : v;
      }
    }
  }
  for (; n < N; ++n) {
    const int8_t *row = w + n * K;
    const float *rs = ws + n * B;
    for (int64_t m = 0; m < M; ++m) {
      const int8_t *xr = xq + m * K;
      const float *xrs = xs + m * B;
      __m256 acc = _mm256_setzero_ps();
      for (int64_t b = 0; b < B; ++b) {
        const __m256i wq = _mm256_loadu_si256((const __m256i *)(row + b * 32));
        const __m256i xv = _mm256_loadu_si256((const __m256i *)(xr + b * 32));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(rs[b] * xrs[b]), _mm256_cvtepi32_ps(dot_block(wq, xv)), acc);
      }
      const float v = hsum(acc) + (bias ? bias[n] : 0.f);
      y[m * N + n] = accumulate ? y[m * N + n] + v : v;
    }
  }
}

static void linear(const float *x, int64_t M, int64_t K, const int8_t *w, const float *ws, int64_t N,
                   const float *bias, float *y, int accumulate) {
  int8_t *xq = malloc((size_t)(M * K));
  float *xs = malloc(sizeof(float) * (size_t)(M * (K / 32)));
  quantize_rows(x, M, K, xq, xs);
  matmul_q(xq, xs, M, K, w, ws, N, bias, y, accumulate);
  free(xq);
  free(xs);
}

void q8_linear(const float *x, int64_t M, int64_t K, const int8_t *w, const float *ws, int64_t N,
               const float *bias, float *y) {
  linear(x, M, K, w, ws, N, bias, y, 0);
}

/* One decoder layer of a Llama/Qwen2 model whose projections are all Q8_0 (q/k/v and gate/up stacked). */
typedef struct {
  const float *input_norm, *post_norm;
  const int8_t *qkv, *o, *gate_up, *down;
  const float *qkv_scales, *o_scales, *gate_up_scales, *down_scales;
  const float *qkv_bias, *o_bias, *gate_up_bias, *down_bias;
} layer_t;

typedef struct {
  int64_t hidden, heads, kv_heads, head_dim, intermediate;
  float eps;
} dims_t;

static void rms_norm(const float *x, int64_t M, int64_t K, const float *w, float eps, float *out) {
  for (int64_t m = 0; m < M; ++m) {
    const float *r = x + m * K;
    float sum = 0.f;
    for (int64_t k = 0; k < K; ++k) sum += r[k] * r[k];
    const float scale = 1.f / sqrtf(sum / (float)K + eps);
    for (int64_t k = 0; k < K; ++k) out[m * K + k] = r[k] * scale * w[k];
  }
}

/* qkv (rows, heads + 2 kv_heads, head_dim) = the stacked projection of rms_norm(h), q and k rotated by cos, sin
   (rows, head_dim; transformers' rotate_half convention). */
void q8_attention_in(const layer_t *L, const dims_t *d, int64_t rows, const float *h, const float *cos,
                     const float *sin, float *qkv) {
  const int64_t H = d->hidden, D = d->head_dim, NH = d->heads + 2 * d->kv_heads, half = D / 2;
  float *x = malloc(sizeof(float) * (size_t)(rows * H));
  rms_norm(h, rows, H, L->input_norm, d->eps, x);
  linear(x, rows, H, L->qkv, L->qkv_scales, NH * D, L->qkv_bias, qkv, 0);
  for (int64_t m = 0; m < rows; ++m) {
    const float *c = cos + m * D, *s = sin + m * D;
    for (int64_t head = 0; head < d->heads + d->kv_heads; ++head) {
      float *v = qkv + m * NH * D + head * D;
      for (int64_t i = 0; i < half; ++i) {
        const float a = v[i], b = v[i + half];
        v[i] = a * c[i] - b * s[i];
        v[i + half] = b * c[i + half] + a * s[i + half];
      }
    }
  }
  free(x);
}

/* h (rows, hidden) += o_proj(o); then h += down(silu(gate) * up) of rms_norm(h). */
void q8_attention_out_mlp(const layer_t *L, const dims_t *d, int64_t rows, float *h, const float *o) {
  const int64_t H = d->hidden, I = d->intermediate;
  linear(o, rows, d->heads * d->head_dim, L->o, L->o_scales, H, L->o_bias, h, 1);
  float *x = malloc(sizeof(float) * (size_t)(rows * H));
  float *gu = malloc(sizeof(float) * (size_t)(rows * 2 * I));
  float *a = malloc(sizeof(float) * (size_t)(rows * I));
  rms_norm(h, rows, H, L->post_norm, d->eps, x);
  linear(x, rows, H, L->gate_up, L->gate_up_scales, 2 * I, L->gate_up_bias, gu, 0);
  for (int64_t m = 0; m < rows; ++m)
    for (int64_t i = 0; i < I; ++i) {
      const float g = gu[m * 2 * I + i];
      a[m * I + i] = g / (1.f + expf(-g)) * gu[m * 2 * I + I + i];
    }
  linear(a, rows, I, L->down, L->down_scales, H, L->down_bias, h, 1);
  free(x);
  free(gu);
  free(a);
}
"""
_FLAGS = ["-O3", "-mavx2", "-mfma", "-shared", "-fPIC"]
# the dot product's VNNI forms, where the CPU has them (/proc/cpuinfo's names): one instruction for maddubs + madd
_VNNI = (
    (frozenset({"avx512_vnni", "avx512vl"}), ["-mavx512vnni", "-mavx512vl"]),
    (frozenset({"avx_vnni"}), ["-mavxvnni"]),
)


def compile_flags(cpu: frozenset[str]) -> list[str]:
    """The kernel's compiler flags on a CPU with these instruction-set flags."""
    extra = next((flags for needed, flags in _VNNI if needed <= cpu), [])
    return [*_FLAGS, *extra]


class Q8Unavailable(RuntimeError):
    """This machine cannot build or run the Q8_0 kernel; the message says why and what to use instead."""


@functools.cache
def kernel() -> ctypes.CDLL:
    """The compiled kernels (built on first use into a cache directory named by the source's hash)."""
    if platform.machine() not in ("x86_64", "AMD64") or not {"avx2", "fma"} <= cpu_flags():
        raise Q8Unavailable("q8_0 weights need an x86-64 CPU with AVX2 and FMA; this one has neither or is "
                            f"{platform.machine()}: serve this tier with weights 'model' or the llamacpp engine")  # fmt: skip
    flags = compile_flags(cpu_flags())
    digest = hashlib.sha256((_SOURCE + " ".join(flags)).encode()).hexdigest()[:16]
    library = cache_root() / f"q8-{digest}" / "libq8.so"
    if not library.is_file():
        compiler = shutil.which("cc") or shutil.which("gcc")
        if compiler is None:
            raise Q8Unavailable(
                "q8_0 weights compile a small C kernel on first use: install a C compiler (Debian's gcc)"
            )
        library.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=library.parent) as tmp:
            source, built = Path(tmp) / "q8.c", Path(tmp) / "libq8.so"
            source.write_text(_SOURCE)
            done = subprocess.run([compiler, *flags, "-o", str(built), str(source)], capture_output=True, text=True)
            if done.returncode:
                raise Q8Unavailable(f"compiling the q8_0 kernel with {compiler} failed: {done.stderr.strip()[-2000:]}")
            built.replace(library)  # whole or absent, also when two processes build it at once
    lib = ctypes.CDLL(str(library))
    pointer, size = ctypes.c_void_p, ctypes.c_int64
    for name, argtypes in (
        ("q8_linear", [pointer, size, size, pointer, pointer, size, pointer, pointer]),
        ("q8_attention_in", [pointer, pointer, size, pointer, pointer, pointer, pointer]),
        ("q8_attention_out_mlp", [pointer, pointer, size, pointer, pointer]),
    ):
        getattr(lib, name).argtypes, getattr(lib, name).restype = argtypes, None
    return lib


def q8_linear(x: torch.Tensor, values: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``x @ dequantized(values, scales).T + bias`` by the kernel, ``x`` quantized per block (fp32, any leading shape)."""
    rows = x.reshape(-1, x.shape[-1]).contiguous()
    n = values.shape[0]
    out = torch.empty(rows.shape[0], n, dtype=torch.float32)
    if not (values.is_contiguous() and scales.is_contiguous() and (bias is None or bias.is_contiguous())):
        raise ValueError("q8_linear needs contiguous weights, scales and bias")
    kernel().q8_linear(rows.data_ptr(), rows.shape[0], rows.shape[1], values.data_ptr(), scales.data_ptr(), n,
             None if bias is None else bias.data_ptr(), out.data_ptr())  # fmt: skip
    return out.view(*x.shape[:-1], n)


def quantize_blocks(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q8_0: int8 values (N, K) and one fp32 scale per 32 of them (N, K/32), the scale the block's largest
    magnitude over 127 (llama.cpp's ``quantize_row_q8_0``)."""
    n, k = weight.shape
    blocks = weight.detach().float().reshape(n, k // BLOCK, BLOCK)
    scales = blocks.abs().amax(-1) / 127.0
    inverse = torch.where(scales > 0, 1.0 / scales, torch.zeros_like(scales))
    values = torch.round(blocks * inverse[..., None]).clamp(-127, 127).to(torch.int8)
    return values.reshape(n, k).contiguous(), scales.contiguous()


class Q8Linear(nn.Module):
    """An ``nn.Linear`` whose weight is held as Q8_0 (see the module's docstring)."""

    values: torch.Tensor
    scales: torch.Tensor
    bias: torch.Tensor | None

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        values, scales = quantize_blocks(linear.weight)
        self.register_buffer("values", values)
        self.register_buffer("scales", scales)
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().float().clone())

    def dequantized(self, start: int = 0, stop: int | None = None) -> torch.Tensor:
        """Output features ``start:stop`` of the weight in fp32."""
        values, scales = self.values[start:stop], self.scales[start:stop]
        return (values.float().reshape(len(values), -1, BLOCK) * scales[..., None]).reshape(len(values), -1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.numel() <= KERNEL_ROWS * self.in_features and x.dtype == torch.float32:
            return q8_linear(x, self.values, self.scales, self.bias)
        rows = x.reshape(-1, self.in_features).float()
        out = torch.cat([rows @ self.dequantized(s, s + SLICE).T for s in range(0, self.out_features, SLICE)], dim=-1)
        if self.bias is not None:
            out = out + self.bias
        return out.to(x.dtype).reshape(*x.shape[:-1], self.out_features)

    @classmethod
    def stacked(cls, parts: list[Q8Linear]) -> Q8Linear:
        """One module over ``parts``' output features in order, whose parts become views into it (no copy kept):
        one kernel call instead of several for projections that read the same input."""
        whole = cls.__new__(cls)
        nn.Module.__init__(whole)
        whole.in_features, whole.out_features = parts[0].in_features, sum(p.out_features for p in parts)
        whole.register_buffer("values", torch.cat([p.values for p in parts]))
        whole.register_buffer("scales", torch.cat([p.scales for p in parts]))
        biases = [p.bias if p.bias is not None else torch.zeros(p.out_features) for p in parts]
        whole.register_buffer("bias", torch.cat(biases) if any(p.bias is not None for p in parts) else None)
        start = 0
        for part in parts:
            stop = start + part.out_features
            part.values, part.scales = whole.values[start:stop], whole.scales[start:stop]
            if whole.bias is not None and part.bias is not None:
                part.bias = whole.bias[start:stop]
            start = stop
        return whole

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, q8_0"


class _Layer(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_void_p)
        for name in (
            "input_norm",
            "post_norm",
            "qkv",
            "o",
            "gate_up",
            "down",
            "qkv_scales",
            "o_scales",
            "gate_up_scales",
            "down_scales",
            "qkv_bias",
            "o_bias",
            "gate_up_bias",
            "down_bias",
        )
    ]


class _Dims(ctypes.Structure):
    _fields_ = [
        ("hidden", ctypes.c_int64),
        ("heads", ctypes.c_int64),
        ("kv_heads", ctypes.c_int64),
        ("head_dim", ctypes.c_int64),
        ("intermediate", ctypes.c_int64),
        ("eps", ctypes.c_float),
    ]


class FusedLayers:
    """The decoder layers of a quantized Llama/Qwen2 model, each run by the kernel in two calls a decode step
    (:meth:`attention_in`, then :meth:`attention_out_mlp`) instead of a few dozen tensor operations: the
    norms, projections, rotary embedding, SiLU and residual adds of a layer in C, the attention over the
    KV cache left to the caller. :meth:`of` says whether a model qualifies (every projection a plain
    :class:`Q8Linear`, q/k/v and gate/up stacked, RMSNorm weights in fp32)."""

    def __init__(self, layers: list[nn.Module], heads: int, kv_heads: int, head_dim: int, eps: float) -> None:
        self._keep = layers  # the weights the structures point into
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        decoder: list[Any] = layers  # their submodules, which torch's stubs type as Tensor | Module
        mlp = decoder[0].mlp
        self.dims = _Dims(mlp.down_proj.out_features, heads, kv_heads, head_dim, mlp.down_proj.in_features, eps)
        self.structs = (_Layer * len(layers))()
        for struct, layer in zip(self.structs, decoder):
            attn, mlp = layer.self_attn, layer.mlp
            for name, module in (
                ("qkv", attn.qkv_proj),
                ("o", attn.o_proj),
                ("gate_up", mlp.gate_up_proj),
                ("down", mlp.down_proj),
            ):
                setattr(struct, name, module.values.data_ptr())
                setattr(struct, f"{name}_scales", module.scales.data_ptr())
                setattr(struct, f"{name}_bias", None if module.bias is None else module.bias.data_ptr())
            struct.input_norm = layer.input_layernorm.weight.data_ptr()
            struct.post_norm = layer.post_attention_layernorm.weight.data_ptr()
        self._lib = kernel()

    @classmethod
    def of(cls, inner: nn.Module, heads: int, kv_heads: int) -> FusedLayers | None:
        """The fused layers of ``inner`` (a Llama/Qwen2 ``model.model``), or None when a layer does not qualify."""
        layers = list(getattr(inner, "layers", []))
        if not layers:
            return None
        eps = {layer.input_layernorm.variance_epsilon for layer in layers} | {
            layer.post_attention_layernorm.variance_epsilon for layer in layers
        }
        for layer in layers:
            attn, mlp = layer.self_attn, layer.mlp
            projections = [
                getattr(attn, "qkv_proj", None),
                attn.o_proj,
                getattr(mlp, "gate_up_proj", None),
                mlp.down_proj,
            ]
            if not all(type(p) is Q8Linear for p in projections):
                return None
            norms = [layer.input_layernorm.weight, layer.post_attention_layernorm.weight]
            if not all(n.dtype == torch.float32 and n.is_contiguous() and n.device.type == "cpu" for n in norms):
                return None
        head_dim = layers[0].self_attn.qkv_proj.out_features // (heads + 2 * kv_heads)
        if len(eps) != 1 or head_dim % 2:
            return None
        return cls(layers, heads, kv_heads, head_dim, eps.pop())

    def attention_in(self, index: int, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """q, k, v of one token a row: ``(rows, heads + 2 kv_heads, 1, head_dim)`` from ``h`` ``(rows, 1, hidden)``,
        q and k rotated by ``cos``, ``sin`` ``(rows, 1, head_dim)``."""
        rows = h.shape[0]
        out = torch.empty(rows, self.heads + 2 * self.kv_heads, 1, self.head_dim)
        cos, sin = cos.contiguous(), sin.contiguous()
        self._lib.q8_attention_in(ctypes.byref(self.structs[index]), ctypes.byref(self.dims), rows, h.data_ptr(),
                                  cos.data_ptr(), sin.data_ptr(), out.data_ptr())  # fmt: skip
        return out

    def attention_out_mlp(self, index: int, h: torch.Tensor, o: torch.Tensor) -> None:
        """``h`` (contiguous fp32, changed in place) plus the attention output ``o`` ``(rows, heads * head_dim)``
        through o_proj, then plus the MLP of its norm."""
        o = o.contiguous()
        self._lib.q8_attention_out_mlp(ctypes.byref(self.structs[index]), ctypes.byref(self.dims), h.shape[0],
                                       h.data_ptr(), o.data_ptr())  # fmt: skip


def quantize_q8(model: nn.Module) -> int:
    """Replace, in place, every ``nn.Linear`` whose input width is a multiple of 32 by a :class:`Q8Linear`
    (a tied vocabulary projection gets its own int8 copy; the embedding keeps its weights for lookups);
    returns how many were replaced. Fails with :class:`Q8Unavailable` before changing anything when the
    kernel cannot run here."""
    kernel()
    targets = [(name, module) for name, module in model.named_modules()
               if type(module) is nn.Linear and module.in_features % BLOCK == 0]  # fmt: skip
    for name, module in targets:
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, child, Q8Linear(module))
    for owner in list(model.modules()):  # the projections a decoder layer applies to one input, stacked
        for stacked, names in (
            ("qkv_proj", ("q_proj", "k_proj", "v_proj")),
            ("gate_up_proj", ("gate_proj", "up_proj")),
        ):
            parts = [getattr(owner, n, None) for n in names]
            if all(isinstance(p, Q8Linear) for p in parts) and not hasattr(owner, stacked):
                setattr(owner, stacked, Q8Linear.stacked(cast(list[Q8Linear], parts)))
    return len(targets)
