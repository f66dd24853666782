// Error-message text without iostreams. TORCH_CHECK formats its arguments through a
// std::ostringstream instantiated in *our* shared object; on the GPU image (torch 2.11, g++ 13)
// formatting a number that way crashed inside libstdc++'s locale code (numeric facets reached
// through inline header code that did not match the loaded runtime). So every message is
// built here, numbers through std::to_string/snprintf, and reaches TORCH_CHECK as one string.
#pragma once

#include <cstdio>
#include <string>
#include <string_view>
#include <type_traits>

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <c10/util/ArrayRef.h>

namespace persistent_gemm {

inline std::string to_text(char const* s) { return s ? s : "(null)"; }
inline std::string to_text(std::string const& s) { return s; }
inline std::string to_text(std::string_view s) { return std::string(s.data(), s.size()); }
inline std::string to_text(c10::ScalarType t) { return c10::toString(t); }
inline std::string to_text(c10::Device d) { return d.str(); }
inline std::string to_text(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", v);
  return buf;
}
template <class T, std::enable_if_t<std::is_integral_v<T>, int> = 0>
std::string to_text(T v) {
  return std::to_string(v);
}
inline std::string to_text(c10::IntArrayRef a) {
  std::string s = "[";
  for (size_t i = 0; i < a.size(); ++i) s += (i ? ", " : "") + std::to_string(a[i]);
  return s + "]";
}

template <class... Args>
std::string msg(Args const&... args) {
  std::string s;
  ((s += to_text(args)), ...);
  return s;
}

}  // namespace persistent_gemm
