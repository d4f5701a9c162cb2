#include "quant/format_support.h"

#include <fmt/core.h>

#include <algorithm>
#include <cstdio>

#include "core/error.h"
#include "quant/quant.h"

namespace tessera {
namespace {

std::string join_names(const std::vector<DType>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) {
    if (i > 0) s += i + 1 == v.size() ? " and " : ", ";
    s += dtype_name(v[i]);
  }
  return s;
}

std::string upper(std::string s) {
  for (char& c : s) c = static_cast<char>(c >= 'a' && c <= 'z' ? c - 'a' + 'A' : c);
  return s;
}

}  // namespace

FormatSupport::FormatSupport(std::string backend, std::vector<DType> native, DType fallback)
    : backend_(std::move(backend)), native_(std::move(native)), fallback_(fallback) {
  for (DType t : native_)
    TESSERA_CHECK(format_info(t) != nullptr, "{} backend: native format {} has no traits", backend_, dtype_name(t));
  TESSERA_CHECK(is_native(fallback_) && can_quantize(fallback_),
                "{} backend: the fallback format {} must be native and producible", backend_, dtype_name(fallback_));
}

bool FormatSupport::is_native(DType t) const { return std::find(native_.begin(), native_.end(), t) != native_.end(); }

bool FormatSupport::is_native_quantized(DType t) const {
  const FormatInfo* f = format_info(t);
  return is_native(t) && f != nullptr && f->quantized;
}

std::optional<DType> FormatSupport::runs_as(DType t) const {
  if (is_native(t)) return t;
  if (can_dequantize(t)) return fallback_;
  return std::nullopt;
}

std::string FormatSupport::native_names() const { return join_names(native_); }

std::string FormatSupport::summary() const {
  std::vector<DType> converted;
  for (const FormatInfo& f : formats())
    if (!is_native(f.type)) converted.push_back(f.type);
  std::string s = fmt::format("the {} kernels read {}", upper(backend_), native_names());
  if (!converted.empty())
    s += fmt::format(", and {} {} converted to {} at load", join_names(converted), converted.size() == 1 ? "is" : "are",
                     dtype_name(fallback_));
  return s;
}

std::string FormatSupport::conversion_notice(const std::string& tensor, DType from) const {
  const DTypeInfo& a = dtype_info(from);
  const DTypeInfo& b = dtype_info(fallback_);
  const double growth = (double(b.type_size) / b.block_size) / (double(a.type_size) / a.block_size);
  return fmt::format(
      "tessera: {}: {} weights (first: {}) have no {} kernel; converted to {} at load ({:.2f}x their size)", backend_,
      dtype_name(from), tensor, upper(backend_), dtype_name(fallback_), growth);
}

void ConversionNotices::note(const FormatSupport& support, const std::string& tensor, DType from) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!seen_.insert(from).second) return;
  }
  std::fprintf(stderr, "%s\n", support.conversion_notice(tensor, from).c_str());
}

std::set<DType> ConversionNotices::converted() const {
  std::lock_guard<std::mutex> lock(mu_);
  return seen_;
}

}  // namespace tessera
