// What must be the same on every rank of a run, as (key, value) pairs: the build, the flags that
// shape the computation, the data set, the checkpoint resumed from. Rank 0 compares every rank's
// fingerprint with its own at the rendezvous, so ranks started with different builds or flags are
// refused at start with a line saying what differs, instead of training different things in step.
#pragma once

#include <string>
#include <utility>
#include <vector>

class Fingerprint {
 public:
  // Keys must be unique and free of '=' and newlines; newlines in values become spaces.
  Fingerprint& add(const std::string& key, const std::string& value);
  const std::vector<std::pair<std::string, std::string>>& fields() const { return fields_; }

  // "key=value" lines, and back; decode throws Fatal on a malformed text.
  std::string encode() const;
  static Fingerprint decode(const std::string& text);

 private:
  std::vector<std::pair<std::string, std::string>> fields_;
};

// "" when both hold the same fields; otherwise what differs, named from each side, e.g.
// "--lr is 0.02 on rank 0 but 0.1 on rank 1; build ...", at most `shown` fields and "and N more".
std::string fingerprint_differences(const Fingerprint& a, const std::string& a_name, const Fingerprint& b,
                                    const std::string& b_name, size_t shown = 4);
