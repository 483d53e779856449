// A table-driven command-line parser shared by the programs: each program lists its flags as rows
// (name, value name, help, default text, what to do with the value) over its own options struct.
//
// `--flag value` and `--flag=value` are both accepted, and `-h` is `--help`; an unknown flag, a flag
// given twice, a missing or empty value (or a flag where the value should be), a value given to a
// switch, or a number that does not parse or is out of range is a UsageError (the program prints it
// on one line and exits 2).
#pragma once

#include <functional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

template <class Opts>
struct FlagRow {
  const char* name;   // "--batch"
  const char* value;  // "N", or "" for a switch
  const char* help;
  std::function<std::string(const Opts&)> show_default;
  std::function<void(Opts&, const std::string&)> apply;
};

// Values, checked: a UsageError naming the flag when `v` does not parse or lies outside [lo, hi].
long parse_long(const std::string& flag, const std::string& v, long lo, long hi);
double parse_double(const std::string& flag, const std::string& v, double lo, double hi);
std::string show_number(double v);  // "%g"
// parse(v), its std::invalid_argument turned into a UsageError that names the flag.
template <class F>
auto parse_with(const std::string& flag, const std::string& v, F parse) -> decltype(parse(v)) {
  try {
    return parse(v);
  } catch (const std::invalid_argument& e) {
    throw UsageError(flag + ": " + e.what());
  }
}

// The files a program's flags name (flag, path; an empty path is a flag not given) are pairwise
// different files (core/file_io.h same_file), else a UsageError "<flag> and <flag> name the same
// file, <path>": an output written over an input, or two outputs over each other, loses one.
// `may_share` lists flag pairs that may name one file (bin/train's --resume and --save).
void check_distinct_files(const std::vector<std::pair<std::string, std::string>>& files,
                          const std::vector<std::pair<std::string, std::string>>& may_share = {});

// One token of the command line: the flag name and, where one is given, its value.
struct FlagToken {
  std::string name, value;
  bool has_inline = false;  // --flag=value
};
FlagToken split_flag(const std::string& arg);
// Completes `t`, the token of argv[i] for a flag whose value name is `value` ("" for a switch):
// takes its value from argv[i + 1] where it needs one (advancing i), and refuses a flag seen before
// (recorded in `seen`), a missing or empty value, another flag in the value's place, or a value given
// to a switch.
void take_flag_value(FlagToken& t, const char* value, int& i, int argc, const char* const* argv,
                     std::vector<std::string>& seen);
// The help line of one flag: its name and value padded to a column, the help, the default.
std::string flag_help_line(const char* name, const char* value, const char* help, const std::string& default_text);

template <class Opts>
void parse_flags(const std::vector<FlagRow<Opts>>& table, int argc, const char* const* argv, Opts& o) {
  std::vector<std::string> seen;
  for (int i = 1; i < argc; ++i) {
    FlagToken t = split_flag(argv[i]);
    const FlagRow<Opts>* flag = nullptr;
    for (const FlagRow<Opts>& f : table)
      if (t.name == f.name) flag = &f;
    if (!flag) throw UsageError("unknown flag '" + t.name + "' (see --help)");
    take_flag_value(t, flag->value, i, argc, argv, seen);
    flag->apply(o, t.value);
  }
}

// A row written for a part of Opts (a base class Opts derives from) as a row of Opts: how programs
// share flags, such as the data flags of bin/train and bin/predict (data/data_flags.h).
template <class Opts, class Part>
FlagRow<Opts> lift_row(const FlagRow<Part>& row) {
  return {row.name, row.value, row.help,
          [show = row.show_default](const Opts& o) { return show(static_cast<const Part&>(o)); },
          [apply = row.apply](Opts& o, const std::string& v) { apply(static_cast<Part&>(o), v); }};
}

template <class Opts>
std::string flags_help(const std::vector<FlagRow<Opts>>& table) {
  const Opts defaults;
  std::string s;
  for (const FlagRow<Opts>& f : table) s += flag_help_line(f.name, f.value, f.help, f.show_default(defaults));
  return s;
}
