// The parts of the flag parser that are not templates: number parsing and help lines.
#include "core/flags.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>

long parse_long(const std::string& flag, const std::string& v, long lo, long hi) {
  errno = 0;
  char* end = nullptr;
  const long x = std::strtol(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || errno == ERANGE)
    throw UsageError(flag + ": '" + v + "' is not an integer");
  if (x < lo || x > hi)
    throw UsageError(flag + ": " + v + " is out of range [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return x;
}

double parse_double(const std::string& flag, const std::string& v, double lo, double hi) {
  errno = 0;
  char* end = nullptr;
  const double x = std::strtod(v.c_str(), &end);
  if (v.empty() || *end != '\0' || errno == ERANGE || !std::isfinite(x))
    throw UsageError(flag + ": '" + v + "' is not a number");
  if (x < lo || x > hi) {
    char buf[160];
    std::snprintf(buf, sizeof(buf), "%s: %s is out of range [%g, %g]", flag.c_str(), v.c_str(), lo, hi);
    throw UsageError(buf);
  }
  return x;
}

std::string show_number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", v);
  return buf;
}

FlagToken split_flag(const std::string& arg) {
  FlagToken t{arg, "", false};
  if (const size_t eq = arg.find('='); arg.rfind("--", 0) == 0 && eq != std::string::npos) {
    t.value = arg.substr(eq + 1);
    t.name = arg.substr(0, eq);
    t.has_inline = true;
  }
  return t;
}

std::string flag_help_line(const char* name, const char* value, const char* help, const std::string& default_text) {
  std::string left = std::string("  ") + name + (value[0] ? std::string(" ") + value : "");
  if (left.size() < 24) left.resize(24, ' ');
  else left += "\n" + std::string(24, ' ');
  std::string s = left + help;
  if (!default_text.empty()) s += " [default: " + default_text + "]";
  return s + "\n";
}
