// Numbers and dates as the programs print them.
#include "core/format.h"

#include <cmath>
#include <cstdio>
#include <ctime>

// Appended digit by digit: inserting the commas into the string in place made GCC 12 warn
// (-Wrestrict, a false overlap inside std::string::insert) in every build.
std::string with_commas(long long v) {
  const std::string digits = std::to_string(v);
  const size_t sign = v < 0 ? 1 : 0;
  std::string s = digits.substr(0, sign);
  for (size_t i = sign; i < digits.size(); ++i) {
    if (i > sign && (digits.size() - i) % 3 == 0) s += ',';
    s += digits[i];
  }
  return s;
}

std::string clock_text(double seconds) {
  const long s = std::lround(seconds);
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%ld:%02ld:%02ld", s / 3600, (s / 60) % 60, s % 60);
  return buf;
}

std::string today() {
  const std::time_t t = std::time(nullptr);
  char buf[16];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d", std::localtime(&t));
  return buf;
}

std::string format_bytes(size_t bytes) {
  char buf[32];
  const double b = static_cast<double>(bytes);
  if (b >= 1024.0 * 1024 * 1024)
    std::snprintf(buf, sizeof(buf), "%.2f GiB", b / (1024.0 * 1024 * 1024));
  else
    std::snprintf(buf, sizeof(buf), "%.1f MiB", b / (1024.0 * 1024));
  return buf;
}
