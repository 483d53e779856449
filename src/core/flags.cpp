// The parts of the flag parser that are not templates: values, number parsing, help lines and the
// check that no two flags name one file.
#include "core/flags.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "core/file_io.h"

long parse_long(const std::string& flag, const std::string& v, long lo, long hi) {
  errno = 0;
  char* end = nullptr;
  const long x = std::strtol(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0')
    throw UsageError(flag + ": '" + v + "' is not an integer");
  if (errno == ERANGE || x < lo || x > hi)
    throw UsageError(flag + ": " + v + " is out of range [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return x;
}

double parse_double(const std::string& flag, const std::string& v, double lo, double hi) {
  errno = 0;
  char* end = nullptr;
  const double x = std::strtod(v.c_str(), &end);
  // "nan" and "inf" are not numbers a flag takes; a finite number too large for a double (1e999)
  // overflows to inf with ERANGE and is out of range. Underflow (ERANGE, 0 or a denormal) is fine.
  const bool overflow = errno == ERANGE && std::isinf(x);
  if (v.empty() || *end != '\0' || (!std::isfinite(x) && !overflow))
    throw UsageError(flag + ": '" + v + "' is not a number");
  if (overflow || x < lo || x > hi) {
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
  if (arg == "-h") return {"--help", "", false};
  FlagToken t{arg, "", false};
  if (const size_t eq = arg.find('='); arg.rfind("--", 0) == 0 && eq != std::string::npos) {
    t.value = arg.substr(eq + 1);
    t.name = arg.substr(0, eq);
    t.has_inline = true;
  }
  return t;
}

namespace {
// A command-line word that is a flag, not a value: `--data-dir --epochs 3` lacks the directory.
bool is_flag_word(const std::string& word) { return (word.size() > 2 && word.rfind("--", 0) == 0) || word == "-h"; }
}  // namespace

void take_flag_value(FlagToken& t, const char* value, int& i, int argc, const char* const* argv,
                     std::vector<std::string>& seen) {
  for (const std::string& s : seen)
    if (s == t.name) throw UsageError(t.name + " is given twice; give it once");
  seen.push_back(t.name);
  const std::string needs = t.name + " needs a value (" + value + ")";
  if (value[0] == '\0') {
    if (t.has_inline) throw UsageError(t.name + " takes no value");
    return;
  }
  if (!t.has_inline) {
    if (i + 1 >= argc) throw UsageError(needs);
    t.value = argv[++i];
    if (is_flag_word(t.value)) throw UsageError(needs + ", not the flag " + t.value);
  }
  if (t.value.empty()) throw UsageError(needs + ", not an empty string");
}

std::string flag_help_line(const char* name, const char* value, const char* help, const std::string& default_text) {
  std::string left = std::string("  ") + name + (value[0] ? std::string(" ") + value : "");
  if (left.size() < 24) left.resize(24, ' ');
  else left += "\n" + std::string(24, ' ');
  std::string s = left + help;
  if (!default_text.empty()) s += " [default: " + default_text + "]";
  return s + "\n";
}

void check_distinct_files(const std::vector<std::pair<std::string, std::string>>& files,
                          const std::vector<std::pair<std::string, std::string>>& may_share) {
  const auto allowed = [&](const std::string& f, const std::string& g) {
    for (const auto& [x, y] : may_share)
      if ((x == f && y == g) || (x == g && y == f)) return true;
    return false;
  };
  for (size_t i = 0; i < files.size(); ++i)
    for (size_t j = i + 1; j < files.size(); ++j) {
      const auto& [flag_i, path_i] = files[i];
      const auto& [flag_j, path_j] = files[j];
      if (!path_i.empty() && !path_j.empty() && !allowed(flag_i, flag_j) && same_file(path_i, path_j))
        throw UsageError(flag_i + " and " + flag_j + " name the same file, " + path_j);
    }
}
