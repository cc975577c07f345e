// The Python binding (module mxmoe._mxmoe), over the public C++ API only.
//
// Tensors arrive as nanobind ndarrays from any DLPack producer (numpy, torch, cupy) and are checked
// here, each error naming the argument. Activations and outputs are used in place (zero-copy: the
// operator reads and writes the caller's memory); weights are copied once, at prepare time, into the
// project's canonical ExpertSet, which is what every backend prepares from. The friendlier argument
// handling (names, defaults, allocating outputs, streams) lives in the Python package; this file is
// the strict layer under it.
//
// Errors: a Status with kInvalidArgument becomes ValueError carrying the C++ message; kUnsupported
// becomes NotImplementedError (a RuntimeError subclass); every other code becomes RuntimeError.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "mxmoe/activation.h"
#include "mxmoe/cuda.h"
#include "mxmoe/formats.h"
#include "mxmoe/layouts.h"
#include "mxmoe/moe.h"
#include "mxmoe/router.h"
#include "mxmoe/status.h"
#include "mxmoe/synthetic.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

using mxmoe::ActivationType;
using mxmoe::ExpertSet;
using mxmoe::Mxfp4Matrix;
using mxmoe::Status;
using mxmoe::StatusCode;

// Any dtype, any shape, any device; read-only arrays (e.g. memory-mapped checkpoints) accepted.
using Tensor = nb::ndarray<nb::ro>;

// ---------------------------------------------------------------------------------------------
// Errors

[[noreturn]] void Raise(const Status& s) {
  switch (s.code()) {
    case StatusCode::kInvalidArgument:
      throw nb::value_error(s.message().c_str());
    case StatusCode::kUnsupported:
      PyErr_SetString(PyExc_NotImplementedError, s.message().c_str());
      throw nb::python_error();
    default:
      throw std::runtime_error(s.ToString());
  }
}
void Check(const Status& s) {
  if (!s.ok()) Raise(s);
}
[[noreturn]] void Invalid(const std::string& message) { throw nb::value_error(message.c_str()); }

std::string Str(int64_t v) { return std::to_string(v); }

// ---------------------------------------------------------------------------------------------
// Tensor checks

struct DType {
  nb::dlpack::dtype_code code;
  uint8_t bits;
  const char* name;
};
constexpr DType kU8{nb::dlpack::dtype_code::UInt, 8, "uint8"};
constexpr DType kU16{nb::dlpack::dtype_code::UInt, 16, "uint16"};
constexpr DType kI32{nb::dlpack::dtype_code::Int, 32, "int32"};
constexpr DType kF32{nb::dlpack::dtype_code::Float, 32, "float32"};
constexpr DType kBF16{nb::dlpack::dtype_code::Bfloat, 16, "bfloat16"};
constexpr DType kE4M3{nb::dlpack::dtype_code::Float8_E4M3FN, 8, "float8_e4m3fn"};
constexpr DType kE8M0{nb::dlpack::dtype_code::Float8_E8M0FNU, 8, "float8_e8m0fnu"};

bool Is(const Tensor& t, const DType& d) {
  const nb::dlpack::dtype dt = t.dtype();
  return dt.code == static_cast<uint8_t>(d.code) && dt.bits == d.bits && dt.lanes == 1;
}

std::string DTypeName(nb::dlpack::dtype dt) {
  using C = nb::dlpack::dtype_code;
  std::string base;
  switch (static_cast<C>(dt.code)) {
    case C::Int: base = "int"; break;
    case C::UInt: base = "uint"; break;
    case C::Float: base = "float"; break;
    case C::Bfloat: base = "bfloat"; break;
    case C::Bool: return "bool";
    case C::Complex: base = "complex"; break;
    case C::Float8_E4M3FN: return "float8_e4m3fn";
    case C::Float8_E5M2: return "float8_e5m2";
    case C::Float8_E8M0FNU: return "float8_e8m0fnu";
    default: base = "dtype(code " + Str(dt.code) + ")"; break;
  }
  std::string r = base + Str(dt.bits);
  if (dt.lanes != 1) r += "x" + Str(dt.lanes);
  return r;
}

std::string ShapeStr(const Tensor& t) {
  std::string r = "[";
  for (size_t i = 0; i < t.ndim(); ++i) r += (i ? ", " : "") + Str(static_cast<int64_t>(t.shape(i)));
  return r + "]";
}
std::string ShapeStr(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + Str(s[i]);
  return r + "]";
}

std::string DeviceStr(int device_type, int device_id) {
  if (device_type == nb::device::cpu::value) return "cpu";
  if (device_type == nb::device::cuda::value) return "cuda:" + Str(device_id);
  if (device_type == nb::device::cuda_managed::value) return "cuda_managed:" + Str(device_id);
  if (device_type == nb::device::cuda_host::value) return "cuda_host";
  return "dlpack device " + Str(device_type) + ":" + Str(device_id);
}

std::string TypeName(nb::handle h) { return nb::cast<std::string>(nb::type_name(h.type())); }

Tensor AsTensor(nb::handle h, const std::string& name) {
  if (h.is_none()) Invalid(name + ": missing (None)");
  Tensor t;
  if (!nb::try_cast(h, t, /*convert=*/false))
    Invalid(name + ": expected a tensor (numpy, torch, cupy or another DLPack producer), got " +
            TypeName(h));
  return t;
}

void ExpectDType(const Tensor& t, const std::string& name, std::initializer_list<DType> allowed,
                 const char* what) {
  for (const DType& d : allowed)
    if (Is(t, d)) return;
  std::string want;
  for (const DType& d : allowed) want += (want.empty() ? "" : " or ") + std::string(d.name);
  Invalid(name + ": expected dtype " + want + " (" + what + "), got " + DTypeName(t.dtype()));
}

void ExpectShape(const Tensor& t, const std::string& name, const std::vector<int64_t>& want) {
  bool ok = t.ndim() == want.size();
  for (size_t i = 0; ok && i < want.size(); ++i) ok = static_cast<int64_t>(t.shape(i)) == want[i];
  if (!ok) Invalid(name + ": expected shape " + ShapeStr(want) + ", got " + ShapeStr(t));
}

void ExpectNdim(const Tensor& t, const std::string& name, size_t ndim, const char* what) {
  if (t.ndim() != ndim)
    Invalid(name + ": expected a " + Str(static_cast<int64_t>(ndim)) + "-D tensor " + what + ", got shape " +
            ShapeStr(t));
}

bool IsCContiguous(const Tensor& t) {
  if (t.size() == 0) return true;  // nothing to address (frameworks report varied strides)
  int64_t expect = 1;
  for (size_t i = t.ndim(); i-- > 0;) {
    if (t.shape(i) != 1 && t.stride(i) != expect) return false;
    expect *= static_cast<int64_t>(t.shape(i));
  }
  return true;
}

void ExpectContiguous(const Tensor& t, const std::string& name) {
  if (!IsCContiguous(t))
    Invalid(name + ": must be C-contiguous (row-major, no gaps); use .contiguous() or "
                   "numpy.ascontiguousarray");
}

void ExpectHost(const Tensor& t, const std::string& name) {
  if (t.device_type() != nb::device::cpu::value)
    Invalid(name + ": expected a CPU tensor, got one on " + DeviceStr(t.device_type(), t.device_id()));
}

// ---------------------------------------------------------------------------------------------
// Weights: one argument, a stacked [E, rows, cols] tensor or a sequence of E [rows, cols] tensors.

class ExpertTensors {
 public:
  ExpertTensors() = default;

  // `what` describes the content for dtype errors ("packed E2M1").
  // A packed E2M1 argument (uint8) or, with is_scale, a UE8M0 one (uint8 or float8_e8m0fnu).
  static ExpertTensors From(nb::handle h, const std::string& name, bool is_scale) {
    ExpertTensors r;
    r.name_ = name;
    if (h.is_none()) return r;
    r.present_ = true;
    Tensor t;
    if (nb::try_cast(h, t, /*convert=*/false)) {
      r.stacked_ = true;
      ExpectNdim(t, name, 3, "[num_experts, rows, cols] (or a list of per-expert 2-D tensors)");
      r.Accept(t, name, is_scale);
      r.count_ = static_cast<int64_t>(t.shape(0));
      r.rows_ = static_cast<int64_t>(t.shape(1));
      r.cols_ = static_cast<int64_t>(t.shape(2));
      r.parts_.push_back(std::move(t));
      return r;
    }
    if (!nb::isinstance<nb::sequence>(h) || nb::isinstance<nb::str>(h))
      Invalid(name + ": expected a [num_experts, rows, cols] tensor or a list of per-expert "
                     "[rows, cols] tensors, got " + TypeName(h));
    nb::sequence seq = nb::borrow<nb::sequence>(h);
    const size_t n = nb::len(seq);
    if (n == 0) Invalid(name + ": empty list of experts");
    for (size_t e = 0; e < n; ++e) {
      const std::string item = name + "[" + Str(static_cast<int64_t>(e)) + "]";
      Tensor p = AsTensor(seq[e], item);
      ExpectNdim(p, item, 2, "[rows, cols]");
      r.Accept(p, item, is_scale);
      if (e == 0) {
        r.rows_ = static_cast<int64_t>(p.shape(0));
        r.cols_ = static_cast<int64_t>(p.shape(1));
      } else if (static_cast<int64_t>(p.shape(0)) != r.rows_ || static_cast<int64_t>(p.shape(1)) != r.cols_) {
        Invalid(item + ": shape " + ShapeStr(p) + " differs from " + name + "[0]'s " +
                ShapeStr({r.rows_, r.cols_}));
      }
      r.parts_.push_back(std::move(p));
    }
    r.count_ = static_cast<int64_t>(n);
    return r;
  }

  bool present() const { return present_; }
  const std::string& name() const { return name_; }
  int64_t count() const { return count_; }
  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }
  std::vector<int64_t> shape() const { return {count_, rows_, cols_}; }

  void ExpectShape(int64_t count, int64_t rows, int64_t cols) const {
    if (count_ != count || rows_ != rows || cols_ != cols)
      Invalid(name_ + ": expected shape " + ShapeStr({count, rows, cols}) + " (experts, rows, cols), got " +
              ShapeStr(shape()));
  }

  // Copies row `r` of expert `e` (cols_ bytes) to dst.
  void CopyRow(int64_t e, int64_t r, uint8_t* dst) const {
    const Tensor& t = stacked_ ? parts_[0] : parts_[static_cast<size_t>(e)];
    const size_t d = stacked_ ? 1 : 0;
    const uint8_t* base = static_cast<const uint8_t*>(t.data());
    if (stacked_) base += e * t.stride(0);
    base += r * t.stride(d);
    const int64_t inner = t.stride(d + 1);
    if (inner == 1) {
      std::memcpy(dst, base, static_cast<size_t>(cols_));
    } else {
      for (int64_t c = 0; c < cols_; ++c) dst[c] = base[c * inner];
    }
  }

 private:
  void Accept(const Tensor& t, const std::string& name, bool is_scale) {
    if (is_scale) ExpectDType(t, name, {kU8, kE8M0}, "UE8M0 scales, one per 32 elements");
    else ExpectDType(t, name, {kU8}, "packed E2M1, two per byte");
    ExpectHost(t, name);
  }

  std::string name_;
  bool present_ = false;
  bool stacked_ = false;
  int64_t count_ = 0, rows_ = 0, cols_ = 0;
  std::vector<Tensor> parts_;
};

// Expert e of a (packed, scale) pair as a matrix [rows, 2 * packed cols].
Mxfp4Matrix ReadMatrix(const ExpertTensors& packed, const ExpertTensors& scale, int64_t e) {
  Mxfp4Matrix m;
  m.rows = packed.rows();
  m.cols = packed.cols() * 2;
  m.packed.resize(static_cast<size_t>(m.rows * packed.cols()));
  m.scales.resize(static_cast<size_t>(m.rows * scale.cols()));
  for (int64_t r = 0; r < m.rows; ++r) {
    packed.CopyRow(e, r, m.packed.data() + r * packed.cols());
    scale.CopyRow(e, r, m.scales.data() + r * scale.cols());
  }
  return m;
}

// A float32 CPU tensor [count, n] (or [count] with n == 0) read with any strides.
std::vector<float> ReadF32(nb::handle h, const std::string& name, int64_t count, int64_t n) {
  Tensor t = AsTensor(h, name);
  ExpectDType(t, name, {kF32}, "fp32");
  ExpectHost(t, name);
  if (n == 0) ExpectShape(t, name, {count});
  else ExpectShape(t, name, {count, n});
  std::vector<float> r(static_cast<size_t>(count * std::max<int64_t>(n, 1)));
  const float* base = static_cast<const float*>(t.data());
  for (int64_t e = 0; e < count; ++e) {
    if (n == 0) {
      r[e] = base[e * t.stride(0)];
    } else {
      for (int64_t i = 0; i < n; ++i) r[e * n + i] = base[e * t.stride(0) + i * t.stride(1)];
    }
  }
  return r;
}

// ---------------------------------------------------------------------------------------------
// Prepared experts

class PreparedExperts {
 public:
  ExpertSet set;                        // CPU: with weights; CUDA: shape/slice/activation only
  std::unique_ptr<mxmoe::CudaMoe> cuda;  // the CUDA backend's prepared layout, or null on CPU
  int device = -1;                       // -1: CPU; otherwise the CUDA device index
  int64_t fixed_top_k = 0;               // 0: each call's topk_ids.shape[1] (CPU only)
  int num_threads = 0;                   // CPU backend threads, 0 = hardware concurrency
  std::mutex mu;                         // serializes CPU calls (top_k is set per call)

  const ExpertSet& Layout() const { return cuda ? cuda->Layout() : set; }
  std::string DeviceName() const { return device < 0 ? "cpu" : "cuda:" + Str(device); }
};

std::unique_ptr<PreparedExperts> Finish(ExpertSet&& set, int device, int64_t top_k, int num_threads) {
  auto p = std::make_unique<PreparedExperts>();
  p->fixed_top_k = top_k;
  p->num_threads = num_threads;
  p->device = device;
  Check(set.Validate());
  if (device >= 0) {
    if (top_k == 0) Invalid("top_k: required when preparing for cuda (the kernels' layout is fixed at prepare time)");
    Status s;
    {
      nb::gil_scoped_release release;
      s = mxmoe::CudaMoe::Create(set, device, &p->cuda);
    }
    Check(s);
    p->set.shape = set.shape;  // the host weights are not kept once uploaded
    p->set.slice = set.slice;
    p->set.activation = set.activation;
  } else {
    p->set = std::move(set);
  }
  return p;
}

// A scalar parameter or, for a tensor, per-expert values over the experts given.
struct Param {
  bool given = false;
  float scalar = 0.0f;
  std::vector<float> per_expert;  // [experts given], or empty for a scalar
};
Param ReadParam(nb::handle h, const std::string& name, int64_t count) {
  Param p;
  if (h.is_none()) return p;
  p.given = true;
  if (nb::isinstance<nb::float_>(h) || nb::isinstance<nb::int_>(h)) {
    p.scalar = nb::cast<float>(h);
  } else {
    p.per_expert = ReadF32(h, name, count, 0);
  }
  return p;
}

mxmoe::ActivationSpec MakeActivation(int64_t activation, nb::handle beta, nb::handle linear_beta,
                                     nb::handle alpha, nb::handle limit, int64_t count,
                                     int64_t first_local, int64_t num_local) {
  mxmoe::ActivationSpec spec;
  Check(mxmoe::ActivationFromInt(activation, &spec.type));
  const Param pb = ReadParam(beta, "beta", count), pl = ReadParam(linear_beta, "linear_beta", count),
              pa = ReadParam(alpha, "alpha", count), pm = ReadParam(limit, "limit", count);
  auto scalar = [](const Param& p, float* dst) {
    if (p.given && p.per_expert.empty()) *dst = p.scalar;
  };
  scalar(pb, &spec.params.beta);
  scalar(pl, &spec.params.linear_beta);
  scalar(pa, &spec.params.alpha);
  scalar(pm, &spec.params.limit);
  const bool per_expert = !pb.per_expert.empty() || !pl.per_expert.empty() || !pa.per_expert.empty() ||
                          !pm.per_expert.empty();
  if (per_expert) {
    spec.per_expert.assign(static_cast<size_t>(num_local), spec.params);
    for (int64_t i = 0; i < num_local; ++i) {
      mxmoe::ActParams& q = spec.per_expert[i];
      const size_t src = static_cast<size_t>(first_local + i);
      if (!pb.per_expert.empty()) q.beta = pb.per_expert[src];
      if (!pl.per_expert.empty()) q.linear_beta = pl.per_expert[src];
      if (!pa.per_expert.empty()) q.alpha = pa.per_expert[src];
      if (!pm.per_expert.empty()) q.limit = pm.per_expert[src];
    }
  }
  return spec;
}

std::unique_ptr<PreparedExperts> PrepareExperts(
    nb::handle w1_h, nb::handle w1_scale_h, nb::handle w3_h, nb::handle w3_scale_h, nb::handle w2_h,
    nb::handle w2_scale_h, nb::handle w13_h, nb::handle w13_scale_h, const std::string& layout_name,
    nb::handle gate_bias_h, nb::handle up_bias_h, nb::handle w13_bias_h, int64_t activation,
    nb::handle beta, nb::handle linear_beta, nb::handle alpha, nb::handle limit, int tp_size, int tp_rank,
    int ep_size, int ep_rank, bool local, int64_t top_k, int device, int num_threads) {
  const bool fused = !w13_h.is_none() || !w13_scale_h.is_none();
  if (fused && (!w1_h.is_none() || !w3_h.is_none() || !w1_scale_h.is_none() || !w3_scale_h.is_none()))
    Invalid("w13: give either the fused w13 (+ w13_scale, layout) or w1 and w3 (+ scales), not both");
  if (!fused && !layout_name.empty()) Invalid("layout: applies to a fused w13 only (w1 and w3 were given)");
  std::optional<mxmoe::Fc1Layout> layout = mxmoe::Fc1LayoutFromName(layout_name.empty() ? "gate_up" : layout_name);
  if (!layout)
    Invalid("layout: '" + layout_name + "' is not one of gate_up (sglang), up_gate (flashinfer), "
                                        "interleaved (gpt_oss)");

  ExpertTensors w1, w1s, w3, w3s, w13, w13s;
  if (fused) {
    w13 = ExpertTensors::From(w13_h, "w13", false);
    w13s = ExpertTensors::From(w13_scale_h, "w13_scale", true);
    if (!w13.present()) Invalid("w13: missing (w13_scale given)");
    if (!w13s.present()) Invalid("w13_scale: missing (w13 given)");
  } else {
    w1 = ExpertTensors::From(w1_h, "w1", false);
    w1s = ExpertTensors::From(w1_scale_h, "w1_scale", true);
    w3 = ExpertTensors::From(w3_h, "w3", false);
    w3s = ExpertTensors::From(w3_scale_h, "w3_scale", true);
    for (const ExpertTensors* t : {&w1, &w1s, &w3, &w3s})
      if (!t->present()) Invalid(t->name() + ": missing (give w1, w1_scale, w3, w3_scale, or a fused w13)");
  }
  ExpertTensors w2 = ExpertTensors::From(w2_h, "w2", false);
  ExpertTensors w2s = ExpertTensors::From(w2_scale_h, "w2_scale", true);
  if (!w2.present()) Invalid("w2: missing");
  if (!w2s.present()) Invalid("w2_scale: missing");

  // Shapes of what was given: E_in experts, I_in intermediate rows, K hidden.
  const ExpertTensors& fc1 = fused ? w13 : w1;
  const int64_t e_in = fc1.count();
  if (fused && fc1.rows() % 2 != 0)
    Invalid("w13: " + Str(fc1.rows()) + " rows, expected an even number 2*I (gate and up)");
  const int64_t i_in = fused ? fc1.rows() / 2 : fc1.rows();
  const int64_t k = fc1.cols() * 2;
  if (k % mxmoe::kMxBlock != 0 || k == 0)
    Invalid(fc1.name() + ": hidden size K = 2 * " + Str(fc1.cols()) + " = " + Str(k) +
            " is not a positive multiple of 32");
  if (i_in % mxmoe::kMxBlock != 0 || i_in == 0)
    Invalid(fc1.name() + ": intermediate size " + Str(i_in) + " is not a positive multiple of 32");
  if (fused) {
    w13s.ExpectShape(e_in, 2 * i_in, k / mxmoe::kMxBlock);
  } else {
    w1s.ExpectShape(e_in, i_in, k / mxmoe::kMxBlock);
    w3.ExpectShape(e_in, i_in, k / 2);
    w3s.ExpectShape(e_in, i_in, k / mxmoe::kMxBlock);
  }
  w2.ExpectShape(e_in, k, i_in / 2);
  w2s.ExpectShape(e_in, k, i_in / mxmoe::kMxBlock);

  ExpertSet set;
  set.shape.num_experts = local ? e_in * ep_size : e_in;
  set.shape.hidden = k;
  set.shape.intermediate = local ? i_in * tp_size : i_in;
  set.shape.top_k = top_k > 0 ? top_k : 1;
  if (top_k < 0) Invalid("top_k = " + Str(top_k) + ", expected >= 1 (or None)");
  set.slice = {tp_size, tp_rank, ep_size, ep_rank};
  Check(set.shape.Validate());
  Check(set.slice.Validate(set.shape));

  const int64_t n_local = set.NumLocalExperts(), il = set.LocalIntermediate();
  const int64_t src0 = local ? 0 : set.FirstExpert();                 // first given expert used
  const int64_t i0 = local ? 0 : set.slice.FirstIntermediateRow(set.shape);  // first given row used
  const bool slice_rows = !local && il != i_in;
  set.activation = MakeActivation(activation, beta, linear_beta, alpha, limit, e_in, src0, n_local);

  std::vector<float> gate_bias, up_bias, b13;
  if (!w13_bias_h.is_none()) {
    if (!gate_bias_h.is_none() || !up_bias_h.is_none())
      Invalid("w13_bias: give either w13_bias or gate_bias / up_bias, not both");
    b13 = ReadF32(w13_bias_h, "w13_bias", e_in, 2 * i_in);
  }
  if (!gate_bias_h.is_none()) gate_bias = ReadF32(gate_bias_h, "gate_bias", e_in, i_in);
  if (!up_bias_h.is_none()) up_bias = ReadF32(up_bias_h, "up_bias", e_in, i_in);

  Status status;
  {
    nb::gil_scoped_release release;  // the copies below touch no Python object
    set.experts.resize(static_cast<size_t>(n_local));
    for (int64_t i = 0; i < n_local && status.ok(); ++i) {
      const int64_t src = src0 + i;
      mxmoe::ExpertWeights& w = set.experts[i];
      if (fused) {
        status = mxmoe::SplitW13(ReadMatrix(w13, w13s, src), *layout, &w.w1, &w.w3, "w13[" + Str(src) + "]");
      } else {
        w.w1 = ReadMatrix(w1, w1s, src);
        w.w3 = ReadMatrix(w3, w3s, src);
      }
      w.w2 = ReadMatrix(w2, w2s, src);
      if (!b13.empty() && status.ok()) {
        const std::vector<float> row(b13.begin() + src * 2 * i_in, b13.begin() + (src + 1) * 2 * i_in);
        status = mxmoe::SplitBias13(row, *layout, &w.gate_bias, &w.up_bias, "w13_bias[" + Str(src) + "]");
      }
      if (!gate_bias.empty()) w.gate_bias.assign(gate_bias.begin() + src * i_in, gate_bias.begin() + (src + 1) * i_in);
      if (!up_bias.empty()) w.up_bias.assign(up_bias.begin() + src * i_in, up_bias.begin() + (src + 1) * i_in);
      if (slice_rows && status.ok()) {
        w.w1 = mxmoe::SliceRows(w.w1, i0, il);
        w.w3 = mxmoe::SliceRows(w.w3, i0, il);
        w.w2 = mxmoe::SliceCols(w.w2, i0, il);
        for (std::vector<float>* b : {&w.gate_bias, &w.up_bias})
          if (!b->empty()) *b = std::vector<float>(b->begin() + i0, b->begin() + i0 + il);
      }
    }
  }
  Check(status);
  return Finish(std::move(set), device, top_k, num_threads);
}

std::unique_ptr<PreparedExperts> SyntheticExperts(int64_t num_experts, int64_t hidden, int64_t intermediate,
                                                  int64_t top_k, int64_t activation, nb::handle beta,
                                                  nb::handle linear_beta, nb::handle alpha, nb::handle limit,
                                                  int tp_size, int tp_rank, int ep_size, int ep_rank,
                                                  uint64_t seed, int scale_exp_jitter, bool with_bias,
                                                  int device, int num_threads) {
  mxmoe::LayerShape shape{num_experts, hidden, intermediate, top_k > 0 ? top_k : 1};
  Check(shape.Validate());
  mxmoe::ParallelSlice slice{tp_size, tp_rank, ep_size, ep_rank};
  Check(slice.Validate(shape));
  // Per-expert parameters are given for the whole layer here.
  const mxmoe::ActivationSpec spec =
      MakeActivation(activation, beta, linear_beta, alpha, limit, num_experts, slice.FirstExpert(shape),
                     slice.NumLocalExperts(shape));
  mxmoe::SyntheticOptions options;
  options.seed = seed;
  options.scale_exp_jitter = scale_exp_jitter;
  options.with_bias = with_bias;
  options.num_threads = num_threads;
  ExpertSet set;
  Status s;
  {
    nb::gil_scoped_release release;
    s = mxmoe::MakeSyntheticExperts(shape, spec, slice, options, &set);
  }
  Check(s);
  return Finish(std::move(set), device, top_k, num_threads);
}

// ---------------------------------------------------------------------------------------------
// numpy arrays owning C++ vectors (for the synthetic data and exported weights)

template <typename T>
nb::object ToNumpy(std::vector<T>&& v, std::initializer_list<size_t> shape) {
  auto* heap = new std::vector<T>(std::move(v));
  nb::capsule owner(heap, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  return nb::ndarray<nb::numpy, T>(heap->data(), shape, owner).cast();
}

nb::dict ExportWeights(const PreparedExperts& p) {
  if (p.cuda) Invalid("experts: export_weights needs experts prepared on the CPU (the CUDA backend keeps none on the host)");
  const ExpertSet& s = p.set;
  const size_t n = s.experts.size();
  const size_t il = static_cast<size_t>(s.LocalIntermediate()), k = static_cast<size_t>(s.shape.hidden);
  nb::dict d;
  auto stack = [&](auto get_matrix, const char* name, const char* scale_name, size_t rows, size_t cols) {
    std::vector<uint8_t> packed, scales;
    packed.reserve(n * rows * cols / 2);
    scales.reserve(n * rows * cols / mxmoe::kMxBlock);
    for (const auto& w : s.experts) {
      const Mxfp4Matrix& m = get_matrix(w);
      packed.insert(packed.end(), m.packed.begin(), m.packed.end());
      scales.insert(scales.end(), m.scales.begin(), m.scales.end());
    }
    d[name] = ToNumpy(std::move(packed), {n, rows, cols / 2});
    d[scale_name] = ToNumpy(std::move(scales), {n, rows, cols / mxmoe::kMxBlock});
  };
  stack([](const mxmoe::ExpertWeights& w) -> const Mxfp4Matrix& { return w.w1; }, "w1", "w1_scale", il, k);
  stack([](const mxmoe::ExpertWeights& w) -> const Mxfp4Matrix& { return w.w3; }, "w3", "w3_scale", il, k);
  stack([](const mxmoe::ExpertWeights& w) -> const Mxfp4Matrix& { return w.w2; }, "w2", "w2_scale", k, il);
  if (n > 0 && !s.experts[0].gate_bias.empty()) {
    std::vector<float> gb, ub;
    for (const auto& w : s.experts) {
      gb.insert(gb.end(), w.gate_bias.begin(), w.gate_bias.end());
      ub.insert(ub.end(), w.up_bias.begin(), w.up_bias.end());
    }
    d["gate_bias"] = ToNumpy(std::move(gb), {n, il});
    d["up_bias"] = ToNumpy(std::move(ub), {n, il});
  }
  return d;
}

nb::tuple SyntheticInput(int64_t num_experts, int64_t hidden, int64_t top_k, int64_t num_tokens,
                         const std::string& pattern_name, uint64_t seed) {
  mxmoe::LayerShape shape{num_experts, hidden, /*intermediate=*/mxmoe::kMxBlock, top_k};
  Check(shape.Validate());
  if (num_tokens < 0) Invalid("num_tokens = " + Str(num_tokens) + ", expected >= 0");
  mxmoe::RoutingPattern pattern;
  Check(mxmoe::RoutingPatternFromName(pattern_name, &pattern));
  mxmoe::SyntheticInput in;
  mxmoe::MakeSyntheticInput(shape, num_tokens, pattern, seed, &in);
  const size_t t = static_cast<size_t>(num_tokens);
  return nb::make_tuple(ToNumpy(std::move(in.x_bf16), {t, static_cast<size_t>(hidden)}),
                        ToNumpy(std::move(in.topk_ids), {t, static_cast<size_t>(top_k)}),
                        ToNumpy(std::move(in.topk_weights), {t, static_cast<size_t>(top_k)}));
}

// ---------------------------------------------------------------------------------------------
// The operator

void ExpectOn(const Tensor& t, const std::string& name, const PreparedExperts& p) {
  const bool cpu = t.device_type() == nb::device::cpu::value;
  const bool ok = p.device < 0 ? cpu : (t.device_type() == nb::device::cuda::value && t.device_id() == p.device);
  if (!ok)
    Invalid(name + ": is on " + DeviceStr(t.device_type(), t.device_id()) + " but the experts were prepared for " +
            p.DeviceName());
}

void Run(PreparedExperts& p, nb::handle x_h, nb::handle x_scale_h, nb::handle ids_h, nb::handle weights_h,
         nb::handle out_h, nb::handle workspace_h, uintptr_t stream, bool reference) {
  const ExpertSet& layout = p.Layout();
  const int64_t k_dim = layout.shape.hidden, e_count = layout.shape.num_experts;
  const bool fp8 = !x_scale_h.is_none();
  const std::string x_name = fp8 ? "x_e4m3" : "x";

  Tensor x = AsTensor(x_h, x_name);
  if (fp8) ExpectDType(x, x_name, {kU8, kE4M3}, "E4M3 codes");
  else ExpectDType(x, x_name, {kBF16, kU16}, "bf16, or its bits as uint16");
  ExpectNdim(x, x_name, 2, "[num_tokens, hidden]");
  const int64_t t_count = static_cast<int64_t>(x.shape(0));
  ExpectShape(x, x_name, {t_count, k_dim});

  Tensor ids = AsTensor(ids_h, "topk_ids");
  ExpectDType(ids, "topk_ids", {kI32}, "expert ids; convert int64 ids with .to(torch.int32) / .astype(np.int32)");
  ExpectNdim(ids, "topk_ids", 2, "[num_tokens, top_k]");
  const int64_t k = static_cast<int64_t>(ids.shape(1));
  ExpectShape(ids, "topk_ids", {t_count, k});
  if (k < 1 || k > e_count)
    Invalid("topk_ids: top_k = " + Str(k) + " (its second dimension) is outside [1, num_experts = " +
            Str(e_count) + "]");
  if (p.fixed_top_k != 0 && k != p.fixed_top_k)
    Invalid("topk_ids: top_k = " + Str(k) + " (its second dimension) differs from the experts' top_k = " +
            Str(p.fixed_top_k));

  Tensor weights = AsTensor(weights_h, "topk_weights");
  ExpectDType(weights, "topk_weights", {kF32}, "router weights");
  ExpectShape(weights, "topk_weights", {t_count, k});

  Tensor out = AsTensor(out_h, "out");
  mxmoe::MoeOutput mo;
  if (Is(out, kF32)) mo.dtype = mxmoe::OutputDType::kF32;
  else if (Is(out, kBF16) || Is(out, kU16)) mo.dtype = mxmoe::OutputDType::kBF16;
  else ExpectDType(out, "out", {kBF16, kU16, kF32}, "the output");
  ExpectShape(out, "out", {t_count, k_dim});

  std::vector<std::pair<const Tensor*, std::string>> all = {
      {&x, x_name}, {&ids, "topk_ids"}, {&weights, "topk_weights"}, {&out, "out"}};
  Tensor x_scale, workspace;
  if (fp8) {
    x_scale = AsTensor(x_scale_h, "x_scale");
    ExpectDType(x_scale, "x_scale", {kU8, kE8M0}, "UE8M0 scales");
    ExpectShape(x_scale, "x_scale", {t_count, k_dim / mxmoe::kMxBlock});
    all.push_back({&x_scale, "x_scale"});
  }
  if (!workspace_h.is_none()) {
    workspace = AsTensor(workspace_h, "workspace");
    ExpectDType(workspace, "workspace", {kU8}, "scratch bytes");
    all.push_back({&workspace, "workspace"});
  }
  for (const auto& [t, name] : all) {
    ExpectContiguous(*t, name);
    ExpectOn(*t, name, p);
  }

  mxmoe::MoeInput in;
  in.num_tokens = t_count;
  if (fp8) {
    in.x_e4m3 = static_cast<const uint8_t*>(x.data());
    in.x_scale = static_cast<const uint8_t*>(x_scale.data());
  } else {
    in.x_bf16 = static_cast<const uint16_t*>(x.data());
  }
  in.topk_ids = static_cast<const int32_t*>(ids.data());
  in.topk_weights = static_cast<const float*>(weights.data());
  mo.data = const_cast<void*>(out.data());  // the Python layer refuses read-only outputs
  void* ws = workspace.is_valid() ? const_cast<void*>(workspace.data()) : nullptr;
  const size_t ws_bytes = workspace.is_valid() ? workspace.nbytes() : 0;

  Status s;
  {
    nb::gil_scoped_release release;
    if (p.cuda) {
      s = reference ? p.cuda->RunReference(in, mo, ws, ws_bytes, reinterpret_cast<void*>(stream))
                    : p.cuda->Run(in, mo, ws, ws_bytes, reinterpret_cast<void*>(stream));
    } else {
      std::lock_guard<std::mutex> lock(p.mu);
      p.set.shape.top_k = k;
      s = reference ? mxmoe::ReferenceMoe(p.set, in, mo) : mxmoe::CpuMoe(p.set, in, mo, p.num_threads);
    }
  }
  Check(s);
}

size_t WorkspaceSize(const PreparedExperts& p, int64_t max_tokens) {
  if (max_tokens < 0) Invalid("max_tokens = " + Str(max_tokens) + ", expected >= 0");
  return p.cuda ? p.cuda->WorkspaceSize(max_tokens) : 0;
}

// ---------------------------------------------------------------------------------------------
// Router

void KimiK3Route(nb::handle logits_h, nb::handle bias_h, int64_t top_k, float factor, nb::handle ids_h,
                 nb::handle weights_h, uintptr_t stream) {
  Tensor logits = AsTensor(logits_h, "logits");
  ExpectDType(logits, "logits", {kF32, kBF16, kU16}, "router logits; uint16 holds bf16 bits");
  ExpectNdim(logits, "logits", 2, "[num_tokens, num_experts]");
  const int64_t t_count = static_cast<int64_t>(logits.shape(0)), e_count = static_cast<int64_t>(logits.shape(1));
  const bool f32 = Is(logits, kF32);
  Tensor bias = AsTensor(bias_h, "correction_bias");
  ExpectDType(bias, "correction_bias", {kF32}, "e_score_correction_bias");
  ExpectShape(bias, "correction_bias", {e_count});
  if (top_k < 1 || top_k > e_count)
    Invalid("top_k = " + Str(top_k) + " is outside [1, num_experts = " + Str(e_count) + "]");
  Tensor ids = AsTensor(ids_h, "topk_ids");
  ExpectDType(ids, "topk_ids", {kI32}, "output ids");
  ExpectShape(ids, "topk_ids", {t_count, top_k});
  Tensor weights = AsTensor(weights_h, "topk_weights");
  ExpectDType(weights, "topk_weights", {kF32}, "output weights");
  ExpectShape(weights, "topk_weights", {t_count, top_k});
  // Where the logits are decides the backend; everything else must be there too.
  const bool cuda = logits.device_type() == nb::device::cuda::value;
  if (!cuda && logits.device_type() != nb::device::cpu::value)
    Invalid("logits: is on " + DeviceStr(logits.device_type(), logits.device_id()) +
            "; kimi_k3_router runs on the CPU or a CUDA device");
  const std::string where = DeviceStr(logits.device_type(), logits.device_id());
  for (const auto& [t, name] : std::vector<std::pair<const Tensor*, const char*>>{
           {&logits, "logits"}, {&bias, "correction_bias"}, {&ids, "topk_ids"}, {&weights, "topk_weights"}}) {
    ExpectContiguous(*t, name);
    if (t->device_type() != logits.device_type() || (cuda && t->device_id() != logits.device_id()))
      Invalid(std::string(name) + ": is on " + DeviceStr(t->device_type(), t->device_id()) + " but logits are on " +
              where);
  }
  mxmoe::RouterOptions options;
  options.top_k = top_k;
  options.routed_scaling_factor = factor;
  auto* ids_ptr = static_cast<int32_t*>(const_cast<void*>(ids.data()));
  auto* weights_ptr = static_cast<float*>(const_cast<void*>(weights.data()));
  const auto* bias_ptr = static_cast<const float*>(bias.data());
  Status s;
  if (cuda) {
    // On the caller's stream: no synchronization, nothing allocated (graph-capturable).
    nb::gil_scoped_release release;
    s = mxmoe::KimiK3RouteCuda(logits.data(), f32 ? mxmoe::RouterLogits::kF32 : mxmoe::RouterLogits::kBF16,
                               bias_ptr, t_count, e_count, options, ids_ptr, weights_ptr,
                               static_cast<int>(logits.device_id()), reinterpret_cast<void*>(stream));
  } else {
    nb::gil_scoped_release release;
    std::vector<float> widened;  // bf16 logits widen exactly: the CPU router reads f32
    const float* logits_ptr = static_cast<const float*>(logits.data());
    if (!f32) {
      const auto* bits = static_cast<const uint16_t*>(logits.data());
      widened.resize(static_cast<size_t>(t_count * e_count));
      for (size_t i = 0; i < widened.size(); ++i) widened[i] = mxmoe::bf16_to_float(bits[i]);
      logits_ptr = widened.data();
    }
    s = mxmoe::KimiK3Route(logits_ptr, bias_ptr, t_count, e_count, options, ids_ptr, weights_ptr);
  }
  Check(s);
}

}  // namespace

NB_MODULE(_mxmoe, m) {
  m.doc() = "mxmoe C++ binding; use the mxmoe package, not this module directly";
  m.attr("__version__") = MXMOE_VERSION;

  m.def("activation_list", [] {
    std::vector<std::tuple<std::string, int, bool, bool>> r;
#define MXMOE_X(name, value, gated, impl) r.emplace_back(#name, value, gated, impl);
    MXMOE_ACTIVATION_LIST(MXMOE_X)
#undef MXMOE_X
    return r;
  }, "(name, value, gated, implemented) for every ActivationType, from MXMOE_ACTIVATION_LIST");

  m.def("fc1_layouts", [] {
    std::vector<std::string> r;
    for (auto l : {mxmoe::Fc1Layout::kGateUp, mxmoe::Fc1Layout::kUpGate, mxmoe::Fc1Layout::kInterleaved})
      r.emplace_back(mxmoe::Fc1LayoutName(l));
    return r;
  });

  m.def("cuda_built", &mxmoe::CudaBuilt);
  m.def("cuda_archs", &mxmoe::CudaArchsCompiled);
  m.def("cuda_devices", [] {
    std::vector<std::tuple<int, std::string, int, int, int, size_t>> r;
    for (const auto& d : mxmoe::CudaDevices())
      r.emplace_back(d.index, d.name, d.major, d.minor, d.sm_count, d.total_memory);
    return r;
  }, "(index, name, major, minor, sm_count, total_memory) for every device the runtime sees");

  nb::class_<PreparedExperts>(m, "PreparedExperts")
      .def_prop_ro("num_experts", [](const PreparedExperts& p) { return p.Layout().shape.num_experts; })
      .def_prop_ro("hidden", [](const PreparedExperts& p) { return p.Layout().shape.hidden; })
      .def_prop_ro("intermediate", [](const PreparedExperts& p) { return p.Layout().shape.intermediate; })
      .def_prop_ro("top_k", [](const PreparedExperts& p) -> nb::object {
        if (p.fixed_top_k == 0) return nb::none();
        return nb::int_(p.fixed_top_k);
      })
      .def_prop_ro("tp_size", [](const PreparedExperts& p) { return p.Layout().slice.tp_size; })
      .def_prop_ro("tp_rank", [](const PreparedExperts& p) { return p.Layout().slice.tp_rank; })
      .def_prop_ro("ep_size", [](const PreparedExperts& p) { return p.Layout().slice.ep_size; })
      .def_prop_ro("ep_rank", [](const PreparedExperts& p) { return p.Layout().slice.ep_rank; })
      .def_prop_ro("num_local_experts", [](const PreparedExperts& p) { return p.Layout().NumLocalExperts(); })
      .def_prop_ro("first_expert", [](const PreparedExperts& p) { return p.Layout().FirstExpert(); })
      .def_prop_ro("local_intermediate", [](const PreparedExperts& p) { return p.Layout().LocalIntermediate(); })
      .def_prop_ro("activation_value", [](const PreparedExperts& p) {
        return static_cast<int>(p.Layout().activation.type);
      })
      .def_prop_ro("device", &PreparedExperts::DeviceName)
      .def_prop_ro("num_threads", [](const PreparedExperts& p) { return p.num_threads; })
      .def("expert_params", [](const PreparedExperts& p, int64_t local_idx) {
        const ExpertSet& s = p.Layout();
        if (local_idx < 0 || local_idx >= s.NumLocalExperts())
          Invalid("local_idx = " + Str(local_idx) + " is outside [0, " + Str(s.NumLocalExperts()) + ")");
        const mxmoe::ActParams& q = s.activation.ForExpert(local_idx);
        nb::dict d;
        d["beta"] = q.beta;
        d["linear_beta"] = q.linear_beta;
        d["alpha"] = q.alpha;
        d["limit"] = q.limit;
        return d;
      }, "local_idx"_a, "The activation parameters of local expert local_idx")
      .def("export_weights", &ExportWeights,
           "The local experts' canonical weights as stacked numpy arrays (CPU-prepared experts only)");

  m.def("prepare_experts", &PrepareExperts, "w1"_a.none(), "w1_scale"_a.none(), "w3"_a.none(),
        "w3_scale"_a.none(), "w2"_a.none(), "w2_scale"_a.none(), "w13"_a.none(), "w13_scale"_a.none(),
        "layout"_a, "gate_bias"_a.none(), "up_bias"_a.none(), "w13_bias"_a.none(), "activation"_a,
        "beta"_a.none(), "linear_beta"_a.none(), "alpha"_a.none(), "limit"_a.none(), "tp_size"_a, "tp_rank"_a,
        "ep_size"_a, "ep_rank"_a, "local"_a, "top_k"_a, "device"_a, "num_threads"_a);

  m.def("synthetic_experts", &SyntheticExperts, "num_experts"_a, "hidden"_a, "intermediate"_a, "top_k"_a,
        "activation"_a, "beta"_a.none(), "linear_beta"_a.none(), "alpha"_a.none(), "limit"_a.none(),
        "tp_size"_a, "tp_rank"_a, "ep_size"_a, "ep_rank"_a, "seed"_a, "scale_exp_jitter"_a, "with_bias"_a,
        "device"_a, "num_threads"_a);

  m.def("synthetic_input", &SyntheticInput, "num_experts"_a, "hidden"_a, "top_k"_a, "num_tokens"_a,
        "pattern"_a, "seed"_a);

  m.def("run", &Run, "experts"_a, "x"_a.none(), "x_scale"_a.none(), "topk_ids"_a.none(),
        "topk_weights"_a.none(), "out"_a.none(), "workspace"_a.none(), "stream"_a, "reference"_a);

  m.def("workspace_size", &WorkspaceSize, "experts"_a, "max_tokens"_a);

  m.def("kimi_k3_route", &KimiK3Route, "logits"_a.none(), "correction_bias"_a.none(), "top_k"_a,
        "routed_scaling_factor"_a, "topk_ids"_a.none(), "topk_weights"_a.none(), "stream"_a);
}
