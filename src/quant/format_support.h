// A backend's weight-format support table, built from the traits table (quant.h): the formats it has kernels for,
// the one it converts every other readable format to at load, its error text, and the one-line notice it prints when
// it converts. Every backend states its formats once, here-shaped, instead of in each file that dispatches on them.
#pragma once

#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"

namespace tessera {

class FormatSupport {
 public:
  // backend: the name the texts use ("cuda", "cpu"). native: the formats its kernels read, in the order its texts
  // list them. fallback: a native format that every other readable format is converted to at load.
  FormatSupport(std::string backend, std::vector<DType> native, DType fallback);

  const std::string& backend() const { return backend_; }
  const std::vector<DType>& native() const { return native_; }
  DType fallback() const { return fallback_; }
  bool is_native(DType t) const;
  // A native format that is quantized (format_info(t)->quantized): its kernels read blocks and 8-bit activations.
  bool is_native_quantized(DType t) const;
  // The format a weight of format t runs as: t when native, the fallback when t can be read (converted at load),
  // nullopt when Tessera cannot read t at all.
  std::optional<DType> runs_as(DType t) const;
  // "f32, f16, bf16, q8_0, q4_0 and q4_1".
  std::string native_names() const;
  // "the <backend> kernels read f32, ... and q4_1, and other formats Tessera reads (q4_k, q6_k) are converted to
  // <fallback> at load": the tail of every "cannot run" error.
  std::string summary() const;
  // The one-line notice for converting `tensor` (format `from`, n_elements values): "tessera: cuda: q6_k weights
  // (first: blk.0.ffn_down.weight) have no CUDA kernel; converted to bf16 at load (2.44x their size)".
  std::string conversion_notice(const std::string& tensor, DType from) const;

 private:
  std::string backend_;
  std::vector<DType> native_;
  DType fallback_;
};

// Prints each format's conversion notice once per owner (one per model: the owner is the model's weight store) on
// stderr. Thread-safe.
class ConversionNotices {
 public:
  // Prints support.conversion_notice(tensor, from) if no weight of format `from` was converted by this owner before.
  void note(const FormatSupport& support, const std::string& tensor, DType from);
  // Formats converted so far.
  std::set<DType> converted() const;

 private:
  mutable std::mutex mu_;
  std::set<DType> seen_;
};

}  // namespace tessera
